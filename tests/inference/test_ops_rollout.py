"""Rollouts and restarts of a running service, under continuous traffic.

Two real nodes and the stand-in engine (tests/support/ops_support.py): a rollout to more
replicas and another concurrency, one that fails, the refusals; a replica restart and
a rolling restart of every replica.
"""

from __future__ import annotations

import pytest
import trio

from ..support.ops_support import Traffic, open_two_nodes
from ..support.waiting import eventually


async def _rollout(controller, service_id: str, spec: dict, revision: int | None = None):
    if revision is None:
        revision = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["revision"]
    return await controller.call(
        "POST", f"/api/v1/inference/{service_id}/rollout", json={"revision": revision, "spec": spec}
    )


@pytest.mark.deadline(130)
async def test_a_rollout_to_three_replicas_and_another_concurrency_fails_no_request(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local", "local")
            before = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            old_generation = before["generation"]
            old_attempts = {r["attempt_id"] for r in before["replicas"]}
            spec = await ops.spec("local", "local", "node-2")
            spec["concurrency"] = 3
            traffic = Traffic()
            token = await ops.token(service_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(traffic.run, controller.http, service_id, token)
                await eventually(lambda: traffic.sent >= 5, None, every=0.01)
                response = await _rollout(controller, service_id, spec)
                assert response.status_code == 202, response.text
                started = response.json()
                new_generation = started["rollout"]["generation"]
                assert new_generation > old_generation
                # Until the cut-over the serving generation is the old one.
                assert started["generation"] == old_generation
                # Both generations are reserved meanwhile.
                held = await ops.reservations(service_id)
                assert {(old_generation, 0, "local"), (old_generation, 1, "local")} <= set(held)
                assert (new_generation, 2, "node-2") in held
                after = await controller.wait_service(
                    service_id,
                    lambda v: v["generation"] == new_generation and v["state"] == "ready",
                )
                sent = traffic.sent
                await eventually(lambda: traffic.sent >= sent + 10, None, every=0.01)
                traffic.stop.set()
            assert traffic.failures == [], traffic.failures
            assert [p["node_id"] for p in after["spec"]["placements"]] == [
                "local",
                "local",
                "node-2",
            ]
            assert after["spec"]["concurrency"] == 3
            live = controller.service.live.get(service_id)
            assert live.concurrency == 3 and len(live.replicas) == 3
            # The previous generation drained, stopped and let its reservations go.
            while await ops.reservations(service_id) != [  # noqa: ASYNC110
                (new_generation, 0, "local"),
                (new_generation, 1, "local"),
                (new_generation, 2, "node-2"),
            ]:
                await trio.sleep(0.05)
            detail = await controller.service.inference.get(None, service_id)
            ended = {a.attempt_id: a for a in detail.attempts if a.attempt_id in old_attempts}
            assert all(a.released and a.reason == "rolled_out" for a in ended.values()), ended
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/rollout")
            assert status["pending"] is False and status["generation"] == new_generation
            events = await controller.ok("GET", f"/api/v1/inference/{service_id}/events")
            said = [e["reason"] for e in events["events"] if e["kind"] == "service.rollout"]
            assert said == ["started", "cut_over"]


@pytest.mark.deadline(130)
async def test_a_failed_rollout_leaves_the_serving_generation_serving_and_says_why(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, replica_give_up_after=2) as ops:
            controller = ops.controller
            service_id = await ops.running("local")
            generation = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ]
            broken = tmp_path / "broken-vllm"
            broken.write_text("#!/bin/sh\necho 'cannot load the model' >&2\nexit 3\n")
            broken.chmod(0o755)
            spec = await ops.spec("local", "node-2")
            spec["image_executable"] = str(broken)
            traffic = Traffic()
            token = await ops.token(service_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(traffic.run, controller.http, service_id, token, 1)
                response = await _rollout(controller, service_id, spec)
                assert response.status_code == 202, response.text
                failed = await controller.wait_service(
                    service_id, lambda v: "rollout to generation" in (v["reason"] or "")
                )
                traffic.stop.set()
            assert traffic.failures == []
            assert failed["generation"] == generation
            assert failed["state"] == "ready"
            assert f"generation {generation} keeps serving" in failed["reason"]
            assert "stopped retrying" in failed["reason"]
            assert len(failed["spec"]["placements"]) == 1
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/rollout")
            assert status["pending"] is False
            events = await controller.ok("GET", f"/api/v1/inference/{service_id}/events")
            said = [e["reason"] for e in events["events"] if e["kind"] == "service.rollout"]
            assert said == ["started", "failed"]
            [failed] = [e for e in events["events"] if e["reason"] == "failed"]
            # Said once: it read "rollout to generation N failed: the rollout to ... failed".
            assert failed["message"].count("failed") == 1, failed["message"]
            while await ops.reservations(service_id) != [(generation, 0, "local")]:  # noqa: ASYNC110
                await trio.sleep(0.05)


@pytest.mark.deadline(130)
async def test_rollouts_that_cannot_run_are_refused_and_preview_models_one(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            node = await controller.node("local")
            cpus = node["snapshot"]["resources"]["cpus"]
            # All of the node's CPUs: it fits once it serves alone, not beside the serving one.
            big = await ops.spec("local", cpus=cpus)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=big)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            preview = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/rollout/preview", json={"spec": big}
            )
            assert preview["fits"] is True
            assert preview["beside_serving"]["fits"] is False
            refused = await _rollout(controller, service_id, big)
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["code"] == "placement_failed"
            assert "beside the serving one" in error["message"]
            assert await ops.reservations(service_id) == [
                (
                    (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["generation"],
                    0,
                    "local",
                )
            ]

            stale = await _rollout(controller, service_id, big, revision=1)
            assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_revision"
            renamed = await ops.spec("local", alias="other")
            response = await _rollout(controller, service_id, renamed)
            assert response.status_code == 409
            assert response.json()["error"]["code"] == "alias_change_not_allowed"

            assert (await controller.control(service_id, "stop")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            stopped = await _rollout(controller, service_id, await ops.spec("local"))
            assert stopped.status_code == 422, stopped.text
            error = stopped.json()["error"]
            assert error["code"] == "nothing_to_do"
            assert error["message"] == "tiny is not running; start it first"
            assert error["details"]["action"] == "rollout"
            assert error["details"]["reason"] == "not_running"


async def _restart(controller, service_id: str, replica: int | None = None):
    revision = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["revision"]
    path = f"/api/v1/inference/{service_id}/restart"
    if replica is not None:
        path = f"/api/v1/inference/{service_id}/replicas/{replica}/restart"
    return await controller.call("POST", path, json={"revision": revision})


@pytest.mark.deadline(130)
async def test_a_rolling_restart_replaces_every_replica_with_no_failed_request(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local", "node-2")
            before = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            old = [r["attempt_id"] for r in before["replicas"]]
            traffic = Traffic()
            token = await ops.token(service_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(traffic.run, controller.http, service_id, token)
                response = await _restart(controller, service_id)
                traffic.stop.set()
            assert response.status_code == 200, response.text
            result = response.json()
            assert result["restarted"] == 2
            assert [r["from_attempt"] for r in result["replicas"]] == old
            assert all(r["to_attempt"] not in old for r in result["replicas"])
            assert traffic.failures == [], traffic.failures
            detail = await controller.service.inference.get(None, service_id)
            reasons = {a.attempt_id: a.reason for a in detail.attempts}
            assert [reasons[a] for a in old] == ["restart_requested", "restart_requested"]
            generation = before["generation"]
            assert await ops.reservations(service_id) == [
                (generation, 0, "local"),
                (generation, 1, "node-2"),
            ]

            one = await _restart(controller, service_id, 1)
            assert one.status_code == 200, one.text
            assert [r["replica"] for r in one.json()["replicas"]] == [1]

            missing = await _restart(controller, service_id, 5)
            assert missing.status_code == 422
            assert missing.json()["error"]["details"]["reason"] == "replica_not_found"
            assert (await controller.control(service_id, "stop")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            stopped = await _restart(controller, service_id)
            assert stopped.status_code == 422
            assert stopped.json()["error"]["message"] == "tiny is not running; start it first"


@pytest.mark.deadline(130)
async def test_a_restart_of_a_replica_whose_agent_is_away_is_refused_at_once(tmp_path):
    # It waited for a replacement up to replica_ready_timeout (10 minutes), and marked the
    # attempt stopping on a node nobody could reach.
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, replica_ready_timeout="10m") as ops:
            controller = ops.controller
            service_id = await ops.running("local", "node-2")
            ops.node_2.cancel()  # node-2's agent stops dialling in
            await eventually(
                lambda: not controller.service.contributors.connected_here("node-2"),
                None,
                every=0.02,
            )
            before = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            for replica in (1, None):
                response = await _restart(controller, service_id, replica)
                assert response.status_code == 502, response.text
                error = response.json()["error"]
                assert error["code"] == "node_unavailable"
                assert error["details"]["node"] == "node-2"
                assert error["details"]["action"] == "restart"
            after = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            # Nothing was asked of any replica: the same attempts, none stopping.
            assert [r["attempt_id"] for r in after["replicas"]] == [
                r["attempt_id"] for r in before["replicas"]
            ]
            assert all(r["state"] != "stopping" for r in after["replicas"])
