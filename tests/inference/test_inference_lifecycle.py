"""A managed service's whole life with the real llama.cpp runtime and SmolLM2, over HTTP.

preview → create → start → ready → drain → stop → replace → (generation 2) ready
→ stop → remove, with a stale revision refused at every step.
"""

from __future__ import annotations

import pytest
import trio

from ficc_core.testing.executor_kit import request_json

from ..support.inference_support import (
    broken_engine,
    llama_spec,
    open_inference_controller,
    register_smollm2,
)


def _ready(view: dict) -> bool:
    return view["state"] == "ready"


def _stopped(view: dict) -> bool:
    return view["state"] == "stopped" and view["desired"] == "stopped"


async def _stale_refused(controller, service_id: str, action: str, revision: int) -> None:
    response = await controller.control(service_id, action, revision=revision)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "stale_revision"
    assert error["details"]["revision"] > revision


async def _chat(controller, view: dict) -> dict:
    """One chat completion straight through the ready replica's endpoint action."""
    replica = view["replicas"][0]
    from ficc_core.schema import Fence

    fence = Fence(
        attempt_id=replica["attempt_id"],
        generation=replica["generation"],
        plan_digest=replica["plan_digest"],
    )
    endpoint = controller.service.contributors.endpoint(replica["node_id"])
    status, answer = await request_json(
        endpoint,
        fence,
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert status == 200, answer
    return answer


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_a_service_lives_from_preview_to_removal(tmp_path):
    with trio.fail_after(240):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id)

            preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
            assert preview["fits"] is True
            assert (
                preview["replicas"][0]["reservation"]["memory_bytes"]
                == spec["placements"][0]["limits"]["memory_bytes"]
            )
            assert preview["plan_digest"].startswith("sha256:")
            # Preview writes nothing.
            assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []

            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (created["state"], created["generation"], created["revision"]) == (
                "stopped",
                0,
                1,
            )
            assert created["plan_digest"] == preview["plan_digest"]
            assert created["replicas"][0]["reservation"] is not None

            await _stale_refused(controller, service_id, "start", 0)
            response = await controller.control(service_id, "start")
            assert response.status_code == 200, response.text
            assert response.json()["generation"] == 1

            ready = await controller.wait_service(service_id, _ready)
            assert ready["replicas"][0]["state"] == "ready"
            assert ready["replicas"][0]["generation"] == 1
            first_attempt = ready["replicas"][0]["attempt_id"]
            answer = await _chat(controller, ready)
            assert answer["model"] == "smol"
            live = controller.service.live.get(service_id)
            assert live is not None and live.admission == "serving"
            assert [r.fence.attempt_id for r in live.replicas] == [first_attempt]

            # Replace refuses a running service.
            response = await controller.call(
                "PUT",
                f"/api/v1/inference/{service_id}",
                json={"revision": ready["revision"], "spec": spec},
            )
            assert response.status_code == 409
            assert response.json()["error"]["code"] == "invalid_transition"

            response = await controller.control(service_id, "drain")
            assert response.status_code == 200, response.text
            stopped = await controller.wait_service(service_id, _stopped)
            assert stopped["replicas"][0]["state"] == "stopped"
            # Stopping released the reservation once the executor confirmed the end.
            assert stopped["replicas"][0]["reservation"] is None
            # The node's next heartbeat no longer reports the attempt.
            while first_attempt in {  # noqa: ASYNC110
                a["attempt_id"] for a in (await controller.node())["attempts"]
            }:
                await trio.sleep(0.05)

            await _stale_refused(controller, service_id, "start", stopped["revision"] - 1)
            bigger = {**spec, "context": 1024}
            response = await controller.call(
                "PUT",
                f"/api/v1/inference/{service_id}",
                json={"revision": stopped["revision"] - 1, "spec": bigger},
            )
            assert response.status_code == 409
            assert response.json()["error"]["code"] == "stale_revision"
            response = await controller.call(
                "PUT",
                f"/api/v1/inference/{service_id}",
                json={"revision": stopped["revision"], "spec": bigger},
            )
            assert response.status_code == 200, response.text
            assert response.json()["generation"] == 2

            ready = await controller.wait_service(service_id, _ready)
            assert ready["generation"] == 2
            assert ready["spec"]["context"] == 1024
            assert ready["replicas"][0]["generation"] == 2
            assert ready["replicas"][0]["attempt_id"] != first_attempt
            await _chat(controller, ready)

            response = await controller.control(service_id, "stop")
            assert response.status_code == 200, response.text
            await controller.wait_service(service_id, _stopped)

            await _stale_refused(controller, service_id, "remove", 1)
            response = await controller.control(service_id, "remove")
            assert response.status_code == 200, response.text
            service_url = f"/api/v1/inference/{service_id}"
            while (await controller.call("GET", service_url)).status_code != 404:  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert controller.service.live.get(service_id) is None
            # The model is free to delete again.
            await controller.ok("DELETE", f"/api/v1/models/{model_id}")


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_drain_waits_for_in_flight_requests_and_stops_at_its_bound(tmp_path):
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, drain_timeout="2s") as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            live = controller.service.live
            for held_for in (0.5, None):
                assert (await controller.control(service_id, "start")).status_code == 200
                await controller.wait_service(service_id, _ready)
                request = live.request(service_id)
                request.__enter__()
                started = trio.current_time()
                assert (await controller.control(service_id, "drain")).status_code == 200
                draining = await controller.wait_service(
                    service_id, lambda v: v["state"] == "draining"
                )
                assert draining["desired"] == "draining"
                assert live.get(service_id).admission == "draining"
                # The in-flight request keeps its replica while the service drains.
                assert len(live.get(service_id).replicas) == 1
                if held_for is not None:
                    await trio.sleep(held_for)
                    request.__exit__(None, None, None)
                stopped = await controller.wait_service(service_id, _stopped)
                took = trio.current_time() - started
                if held_for is None:
                    # Nothing finished: the drain bound (2 s) ended it.
                    assert took >= 2.0
                    request.__exit__(None, None, None)
                else:
                    assert held_for <= took < 2.0
                assert stopped["replicas"][0]["state"] == "stopped"
                assert live.get(service_id).admission == "stopped"
                assert live.get(service_id).replicas == ()


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_failing_engine_is_retried_with_new_attempts_and_a_growing_backoff(tmp_path):
    engine, settings = broken_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), replica_retry_max="2s", replica_give_up_after=0
        ) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id)
            spec["image_executable"] = str(engine)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            view = await controller.wait_service(
                service_id, lambda v: (v["replicas"][0]["attempt"] or 0) >= 4, period=0.1
            )
            assert view["state"] in ("failed", "starting")
            rows = await controller.service.store.read(
                lambda tx: tx.fetch_all(
                    "SELECT * FROM inference_attempts WHERE service_id = ? ORDER BY number",
                    (service_id,),
                )
            )
            ended = [r for r in rows if r["state"] == "failed"]
            assert len(ended) >= 3
            assert all(r["released"] for r in ended)
            assert ended[0]["reason"] in ("exited", "readiness_timeout", "failed")
            # Waits double (1 s, 2 s) and are capped at replica_retry_max (2 s).
            gaps = [
                b["created_at"] - a["updated_at"] for a, b in zip(ended, rows[1:], strict=False)
            ]
            assert 0.8 <= gaps[0] < 1.8
            assert all(1.8 <= gap < 3.5 for gap in gaps[1:3])
            failed = await controller.wait_service(service_id, lambda v: v["state"] == "failed")
            assert failed["reason"]
            assert (await controller.control(service_id, "stop")).status_code == 200
            stopped = await controller.wait_service(service_id, _stopped)
            assert stopped["replicas"][0]["reservation"] is None


async def _attempt_rows(controller, service_id: str) -> list[dict]:
    return await controller.service.store.read(
        lambda tx: tx.fetch_all(
            "SELECT * FROM inference_attempts WHERE service_id = ? ORDER BY created_at",
            (service_id,),
        )
    )


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_replica_is_a_workload_with_its_model_revision_and_endpoint_fenced_by_its_digest(
    tmp_path,
):
    import json

    from ficc_core.schema import Workload, digest, structure

    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            ready = await controller.wait_service(service_id, _ready)
            [row] = await _attempt_rows(controller, service_id)
            stored = json.loads(row["workload"])
            workload = structure(stored, Workload)
            model = await controller.ok("GET", f"/api/v1/models/{model_id}")
            assert workload.model_revision == model["digest"]
            assert workload.endpoint is not None and workload.endpoint.transport == "unix"
            assert workload.generation == 1
            # The fence every endpoint call carries is the digest of exactly these bytes.
            assert digest(stored) == workload.plan_digest() == ready["replicas"][0]["plan_digest"]
            node = await controller.node()
            [reported] = [a for a in node["attempts"] if a["attempt_id"] == row["attempt_id"]]
            assert reported["plan_digest"] == row["plan_digest"]
            # A legacy workload (no model_revision, no endpoint) keeps its old form and digest.
            legacy = {k: v for k, v in stored.items() if k not in ("model_revision", "endpoint")}
            assert digest(structure(legacy, Workload)) == digest(legacy)
            assert (await controller.control(service_id, "stop")).status_code == 200
            await controller.wait_service(service_id, _stopped)


@pytest.mark.deadline(130)
async def test_a_host_prompt_cache_is_passed_to_the_real_engine_which_serves_with_it(tmp_path):
    import json

    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, prompt_cache_bytes=64 << 20)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert created["spec"]["prompt_cache_bytes"] == 64 << 20
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, _ready)
            [row] = await _attempt_rows(controller, service_id)
            argv = json.loads(row["workload"])["argv"]
            assert argv[argv.index("--cache-ram") + 1] == "64"
            # The engine took the flag: it answers a chat.
            token = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 60}
            )
            answer = await controller.call(
                "POST",
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                token["token"],
                json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            )
            assert answer.status_code == 200, answer.text
            assert (await controller.control(service_id, "stop")).status_code == 200
            await controller.wait_service(service_id, _stopped)
