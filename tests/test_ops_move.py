"""Moving a replica of a running service to another node: steps, refusals, faults.

Two real nodes (the embedded one and a remote agent dialling in), the stand-in
engine behind the vllm adapter, the real gateway; see tests/ops_support.py.
"""

from __future__ import annotations

import trio

from ficc_core.inference import repository
from ficc_core.inference.records import AttemptState

from .ops_support import Traffic, open_two_nodes

STEPS = ["deploy_target", "wait_target_health", "stop_source", "undeploy_source", "update_binding"]


async def _move(controller, service_id: str, replica: int = 0, **body):
    return await controller.call(
        "POST", f"/api/v1/inference/{service_id}/replicas/{replica}/move", json=body
    )


async def test_a_serving_replica_moves_to_another_node_with_no_failed_request(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local")
            before = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            generation = before["generation"]
            assert await ops.reservations(service_id) == [(generation, 0, "local")]
            traffic = Traffic()
            token = await ops.token(service_id)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(traffic.run, controller.http, service_id, token)
                while traffic.sent < 5:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                response = await _move(controller, service_id, target_node_id="node-2")
                sent = traffic.sent
                while traffic.sent < sent + 5:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                traffic.stop.set()
            assert response.status_code == 200, response.text
            moved = response.json()
            assert moved["final_state"] == "moved", moved
            assert (moved["from_node"], moved["to_node"]) == ("local", "node-2")
            assert [s["name"] for s in moved["steps"]] == STEPS
            assert all(s["ok"] for s in moved["steps"])
            assert traffic.failures == [] and traffic.sent >= 10

            after = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert after["spec"]["placements"][0]["node_id"] == "node-2"
            assert after["generation"] == generation
            assert after["revision"] > before["revision"]
            assert await ops.reservations(service_id) == [(generation, 0, "node-2")]
            [view] = controller.service.live.get(service_id).replicas
            assert view.node_id == "node-2"
            events = await controller.ok("GET", f"/api/v1/inference/{service_id}/events")
            [moved_event] = [e for e in events["events"] if e["kind"] == "replica.moved"]
            assert moved_event["details"]["from_node"] == "local"
            assert moved_event["details"]["to_node"] == "node-2"
            # The stopped source leaves the view at the driver's next step.
            while controller.service.live.get(service_id).retiring:  # noqa: ASYNC110
                await trio.sleep(0.02)


class _Fault(RuntimeError):
    pass


def _fail_at(*names: str):
    async def hook(step: str) -> None:
        if step in names:
            raise _Fault(f"injected at {step}")

    return hook


# (the step the fault is injected at, the move's end, the node the replica serves on after)
FAULTS = [
    (("deploy_target",), "failed", "local"),
    (("wait_target_health",), "failed", "local"),
    (("stop_source",), "failed_rolled_back", "local"),
    (("undeploy_source",), "failed_rolled_back_source_restarted", "local"),
    (("update_binding",), "failed_rolled_back", "local"),
    (("stop_source", "rollback_target"), "failed_rollback_dirty", None),
]


async def test_a_fault_at_each_step_ends_in_its_documented_state_with_consistent_reservations(
    tmp_path,
):
    with trio.fail_after(240):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            mover = controller.service.inference.mover
            service_id = await ops.running("local", "local")
            generation = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ]
            token = await ops.token(service_id)
            for names, final_state, serving_on in FAULTS:
                mover.hook = _fail_at(*names)
                traffic = Traffic()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(traffic.run, controller.http, service_id, token, 1)
                    response = await _move(controller, service_id, 1, target_node_id="node-2")
                    traffic.stop.set()
                assert response.status_code == 200, response.text
                moved = response.json()
                assert moved["final_state"] == final_state, (names, moved)
                failed = [s["name"] for s in moved["steps"] if not s["ok"]]
                assert failed[0] == names[0], moved
                assert (
                    "injected at"
                    in next(s for s in moved["steps"] if not s["ok"])["details"]["error"]
                )
                # The other replica served throughout.
                assert traffic.failures == [], (names, traffic.failures)
                view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
                assert [p["node_id"] for p in view["spec"]["placements"]] == ["local", "local"]
                if serving_on is None:
                    break
                # Reservations: exactly the specification's, once nothing else is held.
                assert await ops.reservations(service_id) == [
                    (generation, 0, "local"),
                    (generation, 1, "local"),
                ], names
                view = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
                live = controller.service.live.get(service_id)
                assert sorted(r.node_id for r in live.replicas) == ["local", "local"]
            # A dirty rollback leaves the target held until its node confirms the end
            # (the driver keeps stopping it); then the reservations settle again.
            mover.hook = _fail_at()
            held = await ops.reservations(service_id)
            assert (generation, 1, "node-2") in held
            while len(await ops.reservations(service_id)) != 2:  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert await ops.reservations(service_id) == [
                (generation, 0, "local"),
                (generation, 1, "local"),
            ]


async def test_a_target_whose_node_is_lost_ends_the_move_instead_of_waiting(tmp_path):
    # A lost node's attempt is unknown, never ready and never released by itself: the
    # move waited out its whole ready_timeout (10 minutes) for it.
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, replica_ready_timeout="10m") as ops:
            controller = ops.controller
            attempts = controller.service.inference.mover.attempts
            service_id = await ops.running("local", "local")
            watch = attempts.watch

            async def lost_on_node_2(attempt):
                if attempt.node_id != "node-2":
                    return await watch(attempt)
                # node-2 is lost as soon as the target is launched there.
                await attempts.observations.set_attempt(
                    attempt.service_id, attempt.attempt_id, state=AttemptState.UNKNOWN
                )

            attempts.watch = lost_on_node_2
            response = await _move(controller, service_id, 1, target_node_id="node-2")
            attempts.watch = watch
            assert response.status_code == 200, response.text
            moved = response.json()
            assert moved["final_state"] in ("failed", "failed_rollback_dirty"), moved
            [failed] = [s for s in moved["steps"] if s["name"] == "wait_target_health"]
            assert not failed["ok"] and "was lost" in failed["details"]["error"]
            assert failed["details"]["reason"] == "unknown"
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert [p["node_id"] for p in view["spec"]["placements"]] == ["local", "local"]


async def test_moves_that_cannot_run_are_refused_in_the_one_envelope_with_details(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local")

            same = await _move(controller, service_id, target_node_id="local")
            assert same.status_code == 400, same.text
            error = same.json()["error"]
            assert error["code"] == "move_target_is_source"
            assert error["details"]["reason"] == "target_is_source"
            assert error["details"]["action"] == "move" and error["details"]["node"] == "local"

            unknown = await _move(controller, service_id, target_node_id="nowhere")
            assert unknown.status_code == 400, unknown.text
            assert unknown.json()["error"]["code"] == "node_not_found"

            missing = await _move(controller, service_id, 3, target_node_id="node-2")
            assert missing.status_code == 422, missing.text
            assert missing.json()["error"]["details"]["reason"] == "replica_not_found"

            # node-2's CPUs are all held by another (created, so reserved) service.
            node = await controller.node("node-2")
            cpus = node["snapshot"]["resources"]["cpus"]
            hog = await ops.spec("node-2", alias="hog", cpus=cpus)
            await controller.ok("POST", "/api/v1/inference", status=201, json=hog)
            full = await _move(controller, service_id, target_node_id="node-2")
            assert full.status_code == 422, full.text
            error = full.json()["error"]
            assert error["code"] == "over_subscribed_target"
            assert error["details"]["reason"] == "over_subscribed_target"
            assert "target_gpu_index" in error["details"]
            assert error["details"]["reasons"][0]["code"] == "insufficient_cpu"

            stale = await _move(controller, service_id, target_node_id="node-2", revision=1)
            assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_revision"
            # A refusal from elsewhere (the revision fence) carries the same details too.
            details = stale.json()["error"]["details"]
            assert (details["action"], details["replica"], details["reason"]) == (
                "move",
                0,
                "stale_revision",
            )
            assert details["revision"] > 1 and details["service_id"] == service_id
            unknown_service = await _move(controller, "svc_nothing", target_node_id="node-2")
            assert unknown_service.status_code == 404
            assert unknown_service.json()["error"]["details"]["action"] == "move"

            assert (await controller.control(service_id, "stop")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            stopped = await _move(controller, service_id, target_node_id="node-2")
            assert stopped.status_code == 422, stopped.text
            error = stopped.json()["error"]
            assert error["code"] == "nothing_to_do"
            assert error["message"] == "tiny is not running; start it first"
            assert error["details"] == {
                "action": "move",
                "service": "tiny",
                "service_id": service_id,
                "replica": 0,
                "node": None,
                "reason": "not_running",
                "raw_error": None,
            }
            # Nothing was reserved by the refused moves.
            assert all(node == "local" for _, _, node in await ops.reservations(service_id))


async def test_without_start_after_move_the_source_stops_before_the_target_is_ready(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local")
            response = await _move(
                controller, service_id, target_node_id="node-2", start_after_move=False
            )
            assert response.status_code == 200, response.text
            moved = response.json()
            assert moved["final_state"] == "moved", moved
            health = next(s for s in moved["steps"] if s["name"] == "wait_target_health")
            assert health["details"] == {"skipped": True}
            view = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            assert view["spec"]["placements"][0]["node_id"] == "node-2"
            assert [r.node_id for r in controller.service.live.get(service_id).replicas] == [
                "node-2"
            ]
            generation = view["generation"]
            assert await ops.reservations(service_id) == [(generation, 0, "node-2")]


async def test_a_target_no_move_holds_any_more_goes_and_the_source_keeps_serving(tmp_path):
    """As after a controller restart in the middle of a move: the target runs on a node
    its placement does not name and nothing holds it, so it drains and stops."""
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            reconciler = controller.service.reconciler
            mover = controller.service.inference.mover
            service_id = await ops.running("local")
            generation = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ]
            seen: dict[str, str] = {}

            async def forget(step: str) -> None:
                if step != "stop_source":
                    return
                driver = await reconciler.driver_of(service_id)
                [target] = [a for a in driver.held if ".a2." in a]
                driver.held.clear()  # what a restarted controller knows of the move
                while True:
                    attempt = await controller.service.store.read(
                        lambda tx: repository.attempt(tx, target)
                    )
                    if attempt.released:
                        seen["reason"] = attempt.reason
                        raise _Fault("the move was forgotten")
                    await trio.sleep(0.02)

            mover.hook = forget
            response = await _move(controller, service_id, target_node_id="node-2")
            assert response.json()["final_state"] == "failed_rolled_back", response.text
            assert seen["reason"] == "move_interrupted"
            live = controller.service.live.get(service_id)
            assert [r.node_id for r in live.replicas] == ["local"]
            assert await ops.reservations(service_id) == [(generation, 0, "local")]


async def test_a_move_of_a_gpu_runtime_to_a_node_without_gpus_is_a_tier_mismatch(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, requires_gpu_on_node_2=True) as ops:
            controller = ops.controller
            service_id = await ops.running("local")
            refused = await _move(controller, service_id, target_node_id="node-2")
            assert refused.status_code == 422, refused.text
            error = refused.json()["error"]
            assert error["code"] == "tier_mismatch"
            assert error["message"] == "vllm requires a GPU; node node-2 has none"
            assert error["details"]["reason"] == "tier_mismatch"
            assert error["details"]["target_gpus"] == 0
            assert error["details"]["action"] == "move" and error["details"]["replica"] == 0
            generation = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "generation"
            ]
            assert await ops.reservations(service_id) == [(generation, 0, "local")]
