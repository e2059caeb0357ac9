"""Scaled services with the real llama.cpp engine: activation, idleness, scale out and in,
pinning, a failed activation, no capacity, and a controller restart.

The gateway's figures (``Gateway.demand``) are replaced here by what each test says, so
each decision is driven on purpose; the gateway's own figures and the requests that
wake a service are tested end to end in ``test_scaling_requests.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from ficc_core.routing.demand import Demand

from ..support.inference_support import (
    GIB,
    Controller,
    broken_engine,
    llama_spec,
    open_inference_controller,
    register_smollm2,
)

pytestmark = pytest.mark.slow

#: Short bounds so a test sees every decision within seconds.
FAST = {"scale_cooldown": "0s", "scale_out_window": "1s", "activation_retry": "30s"}


async def create(
    controller: Controller,
    model_id: str,
    engine: Path | None = None,
    alias: str = "smol",
    **scaling: Any,
) -> dict[str, Any]:
    placements = scaling.pop("placements", 1)
    spec = await llama_spec(
        controller,
        model_id,
        alias=alias,
        node_ids=("local",) * placements,
        cpus=0.5,
        memory_bytes=GIB,
    )
    spec["scaling"] = scaling
    if engine is not None:
        spec["image_executable"] = str(engine)
    return await controller.ok("POST", "/api/v1/inference", status=201, json=spec)


def reserved(view: dict[str, Any]) -> list[int]:
    return [r["index"] for r in view["replicas"] if r["reservation"] is not None]


async def live_until(controller: Controller, service_id: str, predicate) -> Any:
    """The service's live view once ``predicate(view)`` holds (woken by its changes)."""
    live = controller.service.live
    while True:
        view = live.get(service_id)
        if view is not None and predicate(view):
            return view
        await live.changed(service_id).wait()


async def events(controller: Controller, service_id: str) -> list[dict[str, Any]]:
    found = await controller.ok("GET", f"/api/v1/inference/{service_id}/events")
    return [e for e in found["events"] if e["kind"] == "service.scaled"]


@pytest.mark.deadline(130)
async def test_on_demand_service_starts_idle_wakes_once_and_holds_only_what_runs(
    tmp_path: Path,
) -> None:
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            created = await create(controller, model_id, min=0, max=1, placements=2)
            service_id = created["id"]
            assert reserved(created) == []  # on demand: a stopped service holds nothing
            assert created["scaling"]["min"] == 0 and created["scaling"]["max"] == 1
            assert (await controller.control(service_id, "start")).status_code == 200
            idle = await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            assert "next request wakes it" in idle["reason"]
            assert reserved(idle) == [] and idle["scaling"]["active"] == []
            view = await live_until(controller, service_id, lambda v: v.generation == 1)
            assert view.activation == "idle" and view.wakes and view.replicas == ()

            autoscaler = controller.service.inference.autoscaler
            async with trio.open_nursery() as nursery:
                for _ in range(20):  # twenty requests at once: one activation
                    nursery.start_soon(autoscaler.activate, service_id)
            ready = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            assert ready["scaling"]["active"] == [0] and reserved(ready) == [0]
            attempts = [r for r in ready["replicas"] if r["attempt"] is not None]
            assert len(attempts) == 1 and attempts[0]["attempt"] == 1
            scaled = await events(controller, service_id)
            assert [e["reason"] for e in scaled] == ["activation"]
            assert scaled[0]["details"]["direction"] == "out"
            assert controller.service.live.get(service_id).activation == ""

            # Nobody asks for longer than the idle timeout: it stops and holds nothing.
            autoscaler.board.serve(
                lambda _id: Demand(
                    idle_for={r.key: 10_000.0 for r in controller.service.live.get(_id).replicas}
                )
            )
            again = await controller.wait_service(
                service_id, lambda v: v["state"] == "idle" and not reserved(v)
            )
            assert again["scaling"]["active"] == []
            assert [e["reason"] for e in await events(controller, service_id)][-1] == "idle"
            listed = await controller.ok("GET", "/api/v1/inference")
            assert any(s["id"] == service_id and s["state"] == "idle" for s in listed["services"])


@pytest.mark.deadline(160)
async def test_scaled_service_scales_out_on_queueing_and_in_after_idleness(
    tmp_path: Path,
) -> None:
    with trio.fail_after(150):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            created = await create(controller, model_id, min=1, max=2, placements=3)
            service_id = created["id"]
            assert reserved(created) == [0]  # min 1: the first placement is held
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            autoscaler = controller.service.inference.autoscaler
            queued = Demand(waits=(5.0,) * 12)  # twelve waiting 5 s
            autoscaler.board.serve(lambda _id: queued)
            two = await controller.wait_service(
                service_id,
                lambda v: v["state"] == "ready" and v["scaling"]["active"] == [0, 1],
            )
            assert reserved(two) == [0, 1]
            out = (await events(controller, service_id))[-1]
            assert out["reason"] == "scale_out_queue" and out["details"]["queued"] == 12
            assert out["details"]["held_for"] >= 1.0  # the window held first
            # Max 2: the pressure going on starts no third replica.
            for _ in range(30):
                await autoscaler.look(service_id)
            assert (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["scaling"][
                "active"
            ] == [0, 1]

            # Both idle past the timeout, min 1: exactly one stops (the gateway routes to
            # both first: the idle figures are of the replicas it routes to).
            await live_until(controller, service_id, lambda v: len(v.replicas) == 2)
            autoscaler.board.serve(
                lambda _id: Demand(
                    idle_for={r.key: 10_000.0 for r in controller.service.live.get(_id).replicas}
                )
            )
            one = await controller.wait_service(
                service_id, lambda v: v["scaling"]["active"] == [0] and reserved(v) == [0]
            )
            assert one["state"] == "ready"
            ended = await controller.wait_service(
                service_id, lambda v: v["replicas"][1]["state"] == "stopped"
            )
            assert ended["replicas"][1]["reason"] == "scale_in"  # not "superseded"
            reasons = [e["reason"] for e in await events(controller, service_id)]
            assert reasons == ["scale_out_queue", "scale_in"]
            for _ in range(5):
                await autoscaler.look(service_id)  # never below min
            assert (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["scaling"][
                "active"
            ] == [0]


@pytest.mark.deadline(160)
async def test_a_woken_service_scales_out_without_waiting_for_a_cooldown(tmp_path: Path) -> None:
    # An hour's cooldown: only a decision after the activation may start one.
    settings = {**FAST, "scale_cooldown": "1h"}
    with trio.fail_after(150):
        async with open_inference_controller(tmp_path, **settings) as controller:
            model_id = await register_smollm2(controller)
            created = await create(controller, model_id, min=0, max=3, placements=3)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            autoscaler = controller.service.inference.autoscaler
            await autoscaler.activate(service_id)
            woken = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            assert woken["scaling"]["woken_at"] is not None
            assert woken["scaling"]["last_decision_at"] is None  # no cooldown started

            # Woken into a burst: the queue holds for the window, a second replica starts.
            await live_until(controller, service_id, lambda v: len(v.replicas) == 1)
            autoscaler.board.serve(lambda _id: Demand(waits=(5.0,) * 12))
            two = await controller.wait_service(
                service_id,
                lambda v: v["state"] == "ready" and v["scaling"]["active"] == [0, 1],
            )
            assert two["scaling"]["last_decision_at"] is not None
            reasons = [e["reason"] for e in await events(controller, service_id)]
            assert reasons == ["activation", "scale_out_queue"]
            # That decision did start the cooldown: the same pressure starts no third.
            await live_until(controller, service_id, lambda v: len(v.replicas) == 2)
            for _ in range(30):
                await autoscaler.look(service_id)
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["scaling"]["active"] == [0, 1]


@pytest.mark.deadline(130)
async def test_pinned_service_is_never_scaled_to_zero(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            service_id = (await create(controller, model_id, min=0, max=1))["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            pinned = await controller.ok("POST", f"/api/v1/inference/{service_id}/pin", json={})
            assert pinned["scaling"]["pinned"] is True
            assert pinned["scaling"]["active"] == [0]  # pinning woke it
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            autoscaler = controller.service.inference.autoscaler
            autoscaler.board.serve(
                lambda _id: Demand(
                    idle_for={r.key: 10_000.0 for r in controller.service.live.get(_id).replicas}
                )
            )
            for _ in range(5):
                await autoscaler.look(service_id)
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["state"] == "ready" and view["scaling"]["active"] == [0]
            unpinned = await controller.ok("POST", f"/api/v1/inference/{service_id}/unpin", json={})
            assert unpinned["scaling"]["pinned"] is False
            await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            reasons = [e["reason"] for e in await events(controller, service_id)]
            assert reasons == ["pinned", "pinned", "unpinned", "idle"]
            stale = await controller.call(
                "POST", f"/api/v1/inference/{service_id}/pin", json={"revision": 1}
            )
            assert stale.status_code == 409, stale.text


@pytest.mark.deadline(70)
async def test_pin_refuses_a_service_without_scaling(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            refused = await controller.call(
                "POST", f"/api/v1/inference/{created['id']}/pin", json={}
            )
            assert refused.status_code == 422
            assert refused.json()["error"]["code"] == "not_scaled"
            assert "scaling" not in created


@pytest.mark.deadline(100)
async def test_failed_activation_goes_back_to_idle_with_its_reason(tmp_path: Path) -> None:
    engine, settings = broken_engine(tmp_path)
    with trio.fail_after(90):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), **FAST
        ) as controller:
            model_id = await register_smollm2(controller)
            service_id = (await create(controller, model_id, engine, min=0))["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            await live_until(controller, service_id, lambda v: v.activation == "idle")
            await controller.service.inference.autoscaler.activate(service_id)
            failed = await live_until(controller, service_id, lambda v: v.activation == "failed")
            failure = failed.activation_error
            assert failure.code == "activation_failed" and "failed to load" in failure.message
            assert failure.details["replica"] == 0 and failure.details["attempt_reason"]
            view = await controller.wait_service(
                service_id, lambda v: v["state"] == "idle" and not reserved(v)
            )
            assert "last activation failed" in view["reason"]
            reasons = [e["reason"] for e in await events(controller, service_id)]
            assert reasons == ["activation", "activation_failed"]
            # Within activation_retry the next request hears the reason, with no relaunch.
            with pytest.raises(Exception) as refused:
                await controller.service.inference.autoscaler.activate(service_id)
            assert getattr(refused.value, "code", None) == "activation_failed"
            assert refused.value.headers["Retry-After"] == "30"
            assert [e["reason"] for e in await events(controller, service_id)] == reasons
            metrics = controller.service.metrics.render()[0].decode()
            assert f'ficc_activations_total{{outcome="failed",service="{service_id}"}} 1.0' in (
                metrics
            )


@pytest.mark.deadline(70)
async def test_activation_without_capacity_is_refused_with_every_reason(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, memory_bytes=1 << 50)
            spec["scaling"] = {"min": 0}
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
            assert preview["fits"] is True  # nothing is held: a misfit planned replica
            [planned] = preview["replicas"]
            assert planned["held"] is False and planned["fits"] is False
            assert planned["reasons"][0]["code"] == "insufficient_memory"
            assert preview["scaling"] == {
                "min": 0,
                "max": 1,
                "held": [],
                "planned": [0],
                "fit_together": 0,
                "max_fits": False,
            }
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await live_until(controller, service_id, lambda v: v.activation == "idle")
            with pytest.raises(Exception) as refused:
                await controller.service.inference.autoscaler.activate(service_id)
            error = refused.value
            assert getattr(error, "code", None) == "no_capacity" and error.status == 503
            assert error.details["reasons"][0]["code"] == "insufficient_memory"
            failed = await live_until(controller, service_id, lambda v: v.activation == "failed")
            assert failed.activation_error.details["reasons"] == error.details["reasons"]
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["state"] == "idle" and not reserved(view)
            # The next request, while the failure is recent, hears the same reasons.
            with pytest.raises(Exception) as again:
                await controller.service.inference.autoscaler.activate(service_id)
            assert again.value.code == "no_capacity"
            assert again.value.details["reasons"] == error.details["reasons"]


@pytest.mark.deadline(160)
async def test_idle_service_survives_a_controller_restart(tmp_path: Path) -> None:
    with trio.fail_after(150):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            service_id = (await create(controller, model_id, min=0))["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "idle")
        async with open_inference_controller(tmp_path, **FAST) as controller:
            view = await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            assert view["scaling"]["active"] == [] and not reserved(view)
            await live_until(controller, service_id, lambda v: v.activation == "idle")
            await controller.service.inference.autoscaler.activate(service_id)
            ready = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            assert reserved(ready) == [0]


async def rollout(controller: Controller, service_id: str, spec: dict[str, Any]) -> None:
    current = await controller.ok("GET", f"/api/v1/inference/{service_id}")
    await controller.ok(
        "POST",
        f"/api/v1/inference/{service_id}/rollout",
        status=202,
        json={"revision": current["revision"], "spec": spec},
    )


@pytest.mark.deadline(160)
async def test_a_rollout_runs_the_placements_that_ran_and_an_idle_one_stays_idle(
    tmp_path: Path,
) -> None:
    with trio.fail_after(150):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            created = await create(controller, model_id, min=1, max=2, placements=2)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            spec = {**created["spec"], "concurrency": 1, "scaling": {"min": 1, "max": 2}}
            await rollout(controller, service_id, spec)
            view = await controller.wait_service(
                service_id, lambda v: v["generation"] == 2 and v["state"] == "ready"
            )
            assert view["spec"]["concurrency"] == 1 and view["scaling"]["active"] == [0]
            # Only the running placement's replica started in the next generation.
            assert [r["index"] for r in view["replicas"] if r["generation"] == 2] == [0]
            await controller.wait_service(service_id, lambda v: reserved(v) == [0])

            idle = await create(controller, model_id, alias="smol-idle", min=0, max=1)
            idle_id = idle["id"]
            await controller.control(idle_id, "start")
            await controller.wait_service(idle_id, lambda v: v["state"] == "idle")
            await rollout(controller, idle_id, {**idle["spec"], "concurrency": 1})
            after = await controller.wait_service(
                idle_id, lambda v: v["generation"] == 2 and v["state"] == "idle"
            )
            assert after["spec"]["concurrency"] == 1 and not reserved(after)


@pytest.mark.deadline(130)
async def test_a_service_woken_while_its_replica_stops_starts_it_again(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            service_id = (await create(controller, model_id, min=0))["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await live_until(controller, service_id, lambda v: v.activation == "idle")
            autoscaler = controller.service.inference.autoscaler
            await autoscaler.activate(service_id)
            first = await live_until(controller, service_id, lambda v: bool(v.replicas))
            autoscaler.board.serve(lambda _id: Demand(idle_for={first.replicas[0].key: 10_000.0}))
            await autoscaler.look(service_id)  # scaled to zero: the replica drains and stops
            # A request comes before the stop is confirmed: its reservation is still held.
            assert reserved(await controller.ok("GET", f"/api/v1/inference/{service_id}")) == [0]
            autoscaler.board.serve(lambda _id: Demand())
            await autoscaler.activate(service_id)
            second = await live_until(
                controller,
                service_id,
                lambda v: bool(v.replicas) and v.replicas[0].key != first.replicas[0].key,
            )
            assert second.activation == ""
            view = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            assert reserved(view) == [0] and view["scaling"]["active"] == [0]
            assert [r["attempt"] for r in view["replicas"]] == [2]
            reasons = [e["reason"] for e in await events(controller, service_id)]
            assert reasons == ["activation", "idle", "activation"]
