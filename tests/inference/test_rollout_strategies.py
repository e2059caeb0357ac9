"""Rollouts that fit the node: strategies (surge, rolling, recreate), the scale-down applied
in place, memory limits recomputed for a new context, the idle_timeout floor, and a
suggestion that leaves room for the next generation (or says it does not).

The stand-in engine on two real nodes (tests/support/ops_support.py) for the strategies under
traffic; the real llama.cpp engine and SmolLM2 for a context change on a full node.
"""

from __future__ import annotations

import pytest
import trio

from ..cli.test_cli_inference import Cli, write_json
from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2
from ..support.ops_support import Traffic, open_two_nodes
from ..support.waiting import eventually
from .test_inference_suggest import _estimate, _partial


async def _rollout(controller, service_id: str, spec: dict, **extra):
    revision = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["revision"]
    return await controller.call(
        "POST",
        f"/api/v1/inference/{service_id}/rollout",
        json={"revision": revision, "spec": spec, **extra},
    )


async def _full_node(ops, replicas: int = 2) -> tuple[str, dict]:
    """A running service whose replicas take every CPU of the local node."""
    node = await ops.controller.node("local")
    cpus = node["snapshot"]["resources"]["cpus"]
    spec = await ops.spec(*(["local"] * replicas), cpus=cpus / replicas)
    created = await ops.controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    service_id = created["id"]
    assert (await ops.controller.control(service_id, "start")).status_code == 200
    await ops.controller.wait_service(service_id, lambda v: v["state"] == "ready")
    return service_id, spec


@pytest.mark.deadline(130)
async def test_a_rolling_rollout_on_a_full_node_serves_throughout_and_a_scale_down_needs_no_room(
    tmp_path,
):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id, spec = await _full_node(ops)
            generation = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ]
            spec["concurrency"] = 3

            preview = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/rollout/preview", json={"spec": spec}
            )
            assert preview["beside_serving"]["fits"] is False
            strategy = preview["strategy"]
            assert strategy["chosen"] is None
            assert strategy["possible"] == ["rolling", "recreate"]
            rolling = await controller.ok(
                "POST",
                f"/api/v1/inference/{service_id}/rollout/preview",
                json={"spec": spec, "strategy": "rolling"},
            )
            assert rolling["strategy"]["chosen"] == "rolling"
            assert rolling["strategy"]["least_serving_replicas"] == 1
            assert rolling["strategy"]["downtime"] is False

            # The same from the command line: nothing changes, exit 1 when none fits.
            run = Cli(controller.url, controller.token)
            spec_file = write_json(tmp_path / "next.json", spec)
            shown = await run("rollout", "tiny", "-f", str(spec_file), "--preview")
            assert shown.exit_code == 1, shown.output
            assert "strategy none fits (asked: auto)" in shown.stdout, shown.stdout
            assert "'rolling' or strategy 'recreate'" in shown.stdout
            shown = await run.ok(
                "rollout", "tiny", "-f", str(spec_file), "--strategy", "rolling", "--preview"
            )
            assert "strategy rolling (asked: rolling)" in shown.stdout, shown.stdout
            assert "at least 1 of 2 replica(s) serve meanwhile\n" in shown.stdout
            assert (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ] == generation

            # auto refuses, naming the strategies that would work and the command.
            refused = await _rollout(controller, service_id, spec)
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["code"] == "placement_failed"
            assert "'rolling'" in error["message"] and "'recreate'" in error["message"]
            assert "--strategy rolling" in error["message"]
            assert error["details"]["possible"] == ["rolling", "recreate"]

            # One replica of the whole node: never beside a serving one, so not rolling
            # either; the refusal says so and names the one that fits.
            first = spec["placements"][0]
            limits = {**first["limits"], "cpus": 2 * first["limits"]["cpus"]}
            whole = {**spec, "placements": [{**first, "limits": limits}]}
            refused = await _rollout(controller, service_id, whole, strategy="rolling")
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["message"].startswith("a rolling rollout does not fit"), error["message"]
            assert "strategy 'recreate'" in error["message"]
            assert error["details"]["possible"] == ["recreate"]
            assert error["details"]["strategy"] == "rolling"

            traffic = Traffic()
            token = await ops.token(service_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(traffic.run, controller.http, service_id, token, 1)
                await eventually(lambda: traffic.sent >= 3, None, every=0.01)
                response = await _rollout(controller, service_id, spec, strategy="rolling")
                assert response.status_code == 202, response.text
                started = response.json()
                assert started["strategy"]["chosen"] == "rolling"
                assert started["rollout"]["strategy"] == "rolling"
                new = started["rollout"]["generation"]
                after = await controller.wait_service(
                    service_id, lambda v: v["generation"] == new and v["state"] == "ready"
                )
                sent = traffic.sent
                await eventually(lambda: traffic.sent >= sent + 5, None, every=0.01)
                traffic.stop.set()
            # One replica served while the other was replaced: no request failed.
            assert traffic.failures == [], traffic.failures
            assert after["spec"]["concurrency"] == 3 and new > generation
            while await ops.reservations(service_id) != [(new, 0, "local"), (new, 1, "local")]:  # noqa: ASYNC110
                await trio.sleep(0.05)

            # A scale-down from 2 to 1 on the full node: applied at once, no generation.
            smaller = {**after["spec"], "placements": after["spec"]["placements"][:1]}
            preview = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/rollout/preview", json={"spec": smaller}
            )
            assert preview["strategy"]["chosen"] == "scale_down"
            assert preview["strategy"]["downtime"] is False
            scaled = await run.ok("rollout", "tiny", "--replicas", "1")
            assert "scale-down from 2 to 1 replica(s), applied at once" in scaled.stdout
            while await ops.reservations(service_id) != [(new, 0, "local")]:  # noqa: ASYNC110
                await trio.sleep(0.05)
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["generation"] == new and len(view["spec"]["placements"]) == 1
            detail = await controller.service.inference.get(None, service_id)
            gone = [a for a in detail.attempts if a.generation == new and a.replica == 1]
            assert gone and all(a.released and a.reason == "scaled_down" for a in gone), gone

            # idle_timeout below the floor is a 400 naming the field and the minimum.
            scaled = {**smaller, "scaling": {"min": 1, "idle_timeout": 1}}
            refused = await controller.call(
                "POST", f"/api/v1/inference/{service_id}/rollout/preview", json={"spec": scaled}
            )
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["details"]["errors"][0]["path"] == "$.scaling.idle_timeout"
            assert "from 10 to" in error["message"], error["message"]


@pytest.mark.deadline(130)
async def test_a_failed_in_place_rollout_starts_the_serving_generation_again(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, replica_give_up_after=2) as ops:
            controller = ops.controller
            service_id, spec = await _full_node(ops, replicas=1)
            before = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            broken = tmp_path / "broken-vllm"
            broken.write_text("#!/bin/sh\necho 'cannot load the model' >&2\nexit 3\n")
            broken.chmod(0o755)
            following = {**spec, "image_executable": str(broken)}
            preview = await controller.ok(
                "POST",
                f"/api/v1/inference/{service_id}/rollout/preview",
                json={"spec": following, "strategy": "rolling"},
            )
            # One replica replaced in place: nothing serves meanwhile, and it says so.
            assert preview["strategy"]["least_serving_replicas"] == 0
            assert preview["strategy"]["downtime"] is True
            response = await _rollout(controller, service_id, following, strategy="recreate")
            assert response.status_code == 202, response.text
            failed = await controller.wait_service(
                service_id,
                lambda v: (
                    "rollout to generation" in (v["reason"] or "")
                    and "failed" in (v["reason"] or "")
                ),
            )
            assert (
                "starts again on the replicas the recreate rollout had stopped"
                in (failed["reason"])
            )
            # The serving generation runs again on its placement, and serves.
            again = await controller.wait_service(
                service_id, lambda v: v["state"] == "ready" and v["replicas"][0]["attempt"] > 1
            )
            assert again["generation"] == before["generation"]
            assert again["spec"]["image_executable"] == spec["image_executable"]
            token = await ops.token(service_id)
            chat = await controller.http.post(
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                headers={"Authorization": f"Bearer {token}"},
                json={"messages": [{"role": "user", "content": "hi"}]},
            )
            assert chat.status_code == 200, chat.text
            generation = before["generation"]
            while await ops.reservations(service_id) != [(generation, 0, "local")]:  # noqa: ASYNC110
                await trio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.deadline(310)
async def test_a_context_change_on_a_full_node_recreates_with_recomputed_memory(tmp_path):
    with trio.fail_after(300):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            node = await controller.node("local")
            cpus = node["snapshot"]["resources"]["cpus"]
            spec = await llama_spec(
                controller,
                model_id,
                cpus=cpus,
                context=512,
                concurrency=1,
                memory_bytes=_estimate(512, 1),
            )
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            token = (
                await controller.ok(
                    "POST",
                    f"/api/v1/inference/{service_id}/tokens",
                    status=201,
                    json={"lifetime": 600},
                )
            )["token"]
            # About 700 tokens: more than a 512 context holds, well within 1024.
            long = {
                "messages": [{"role": "user", "content": "cat " * 700}],
                "max_tokens": 2,
            }

            async def chat(body):
                return await controller.http.post(
                    f"/api/v1/inference/{service_id}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {token}"},
                    json=body,
                    timeout=120,
                )

            assert (await chat(long)).status_code != 200

            following = {**spec, "context": 1024}
            preview = await controller.ok(
                "POST",
                f"/api/v1/inference/{service_id}/rollout/preview",
                json={"spec": following, "strategy": "recreate"},
            )
            # The memory limit follows the context, shown before anything changes.
            assert preview["adjusted_limits"] == [
                {
                    "path": "$.placements[0].limits.memory_bytes",
                    "from": _estimate(512, 1),
                    "to": _estimate(1024, 1),
                    "estimate_bytes": _estimate(1024, 1),
                }
            ]
            assert preview["spec"]["placements"][0]["limits"]["memory_bytes"] == _estimate(1024, 1)
            assert preview["strategy"]["chosen"] == "recreate"
            assert preview["strategy"]["downtime"] is True
            assert "warnings" not in preview

            refused = await _rollout(controller, service_id, following)
            assert refused.status_code == 409, refused.text
            assert "'recreate'" in refused.json()["error"]["message"]

            # From the command line, with the flag's old spelling (--engine-context's alias).
            run = Cli(controller.url, controller.token)
            helped = " ".join((await run.ok("rollout", "--help")).stdout.split())
            assert "--engine-context, --context" in helped
            assert "Not --context-length, which bounds one request" in helped
            rolled = await run.ok(
                "rollout", "smol", "--context", "1024", "--strategy", "recreate",
                "--wait", "--interval", "0.1",
            )  # fmt: skip
            assert (
                f"$.placements[0].limits.memory_bytes {_estimate(512, 1)} -> "
                f"{_estimate(1024, 1)} bytes" in rolled.stdout
            ), rolled.stdout
            assert "(recreate)" in rolled.stdout and "serves" in rolled.stdout, rolled.stdout
            after = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert after["state"] == "ready"
            assert after["spec"]["context"] == 1024
            assert after["spec"]["placements"][0]["limits"]["memory_bytes"] == _estimate(1024, 1)
            answered = await chat(long)
            assert answered.status_code == 200, answered.text
            assert answered.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.deadline(70)
async def test_a_suggestion_leaves_room_for_the_next_generation_or_says_it_does_not(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            node = await controller.node("local")
            cpus = node["snapshot"]["resources"]["cpus"]
            one = await controller.ok("POST", "/api/v1/inference/preview", json=_partial(model_id))
            limits = one["spec"]["placements"][0]["limits"]
            # Half the node's CPUs at most: a second copy fits beside it.
            assert 2 * limits["cpus"] <= cpus
            assert "warnings" not in one
            two = await controller.ok(
                "POST", "/api/v1/inference/preview", json=_partial(model_id, placements=[{}, {}])
            )
            used = sum(p["limits"]["cpus"] for p in two["spec"]["placements"])
            warned = two.get("warnings", [])
            notes = [w for w in warned if w["code"] == "no_room_for_next_generation"]
            if 2 * used > cpus:
                # Two replicas take more than half a small node: it says so, and the way.
                assert notes and "rolling or recreate" in notes[0]["message"]
                assert notes[0]["details"]["strategies"] == ["rolling", "recreate"]
            else:
                assert notes == []
