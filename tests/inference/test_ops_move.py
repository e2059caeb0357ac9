"""Moving a replica of a running service to another node: steps, refusals, faults.

Two real nodes (the embedded one and a remote agent dialling in), the stand-in
engine behind the vllm adapter, the real gateway; see tests/support/ops_support.py.
"""

from __future__ import annotations

import attrs
import httpx
import pytest
import trio

from ficc_core.inference import repository
from ficc_core.inference.records import AttemptState

from ..support.ops_support import Traffic, open_two_nodes
from ..support.waiting import eventually

STEPS = ["deploy_target", "wait_target_health", "stop_source", "undeploy_source", "update_binding"]


async def _move(controller, service_id: str, replica: int = 0, **body):
    return await controller.call(
        "POST", f"/api/v1/inference/{service_id}/replicas/{replica}/move", json=body
    )


@pytest.mark.deadline(130)
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
                await eventually(lambda: traffic.sent >= 5, None, every=0.01)
                response = await _move(controller, service_id, target_node_id="node-2")
                sent = traffic.sent
                await eventually(lambda: traffic.sent >= sent + 5, None, every=0.01)
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
            await eventually(
                lambda: not controller.service.live.get(service_id).retiring, None, every=0.02
            )


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


@pytest.mark.deadline(250)
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


@pytest.mark.deadline(130)
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


@pytest.mark.deadline(130)
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


@pytest.mark.deadline(130)
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


@pytest.mark.deadline(130)
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


@pytest.mark.deadline(130)
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


FAST_NODES = {"unreachable_after": "1s", "lost_after": "3s", "heartbeat_interval": "200ms"}


async def _moved_off_node_2(ops, service_id: str, *, removable: bool = True) -> dict:
    """Move replica 1 from the gone node-2 to local; check it serves there, holds only
    its new reservation, and (``removable``) that node-2 can then be removed."""
    controller = ops.controller
    generation = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["generation"]
    response = await _move(controller, service_id, 1, target_node_id="local")
    assert response.status_code == 200, response.text
    moved = response.json()
    assert moved["final_state"] == "moved", moved
    assert (moved["from_node"], moved["to_node"]) == ("node-2", "local")
    assert [s["name"] for s in moved["steps"]] == STEPS
    view = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
    assert [p["node_id"] for p in view["spec"]["placements"]] == ["local", "local"]
    assert view["replicas"][1]["attempt_id"] == moved["steps"][0]["details"]["attempt_id"]
    live = controller.service.live.get(service_id)
    assert [r.node_id for r in live.replicas] == ["local", "local"]
    assert await ops.reservations(service_id) == [
        (generation, 0, "local"),
        (generation, 1, "local"),
    ]
    if removable:
        removed = await controller.call("DELETE", "/api/v1/contributors/node-2")
        assert removed.status_code == 200, removed.text
    return next(s for s in moved["steps"] if s["name"] == "stop_source")


@pytest.mark.deadline(130)
async def test_a_replica_on_a_lost_node_moves_off_it_and_its_unknown_attempt_is_given_up(
    tmp_path,
):
    # It was refused (replica_not_ready), though remove-node says to move it.
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, **FAST_NODES) as ops:
            controller = ops.controller
            service_id = await ops.running("local", "node-2")
            source = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["replicas"][1]
            ops.node_2.cancel()  # its agent stops: node-2 goes unreachable, then lost
            await controller.wait_service(
                service_id, lambda v: v["replicas"][1]["state"] == "unknown"
            )
            assert (await controller.node("node-2"))["state"] == "lost"
            stop_source = await _moved_off_node_2(ops, service_id)
            assert stop_source["ok"] and stop_source["details"]["given_up"] is True
            assert stop_source["details"]["node_state"] == "lost"
            given_up = await controller.service.store.read(
                lambda tx: repository.attempt(tx, source["attempt_id"])
            )
            assert given_up.released and given_up.reason == "moved"
            assert given_up.state == AttemptState.UNKNOWN
            events = await controller.ok("GET", f"/api/v1/inference/{service_id}/events")
            [ended] = [
                e
                for e in events["events"]
                if e["kind"] == "attempt.state"
                and e["attempt_id"] == source["attempt_id"]
                and e["reason"] == "moved"
            ]
            assert "gave this attempt up" in ended["message"]


@pytest.mark.deadline(130)
async def test_a_replica_on_a_revoked_node_moves_off_it(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local", "node-2")
            ops.node_2.cancel()  # a revoked agent is refused: stop it first
            await eventually(
                lambda: not controller.service.contributors.connected_here("node-2"),
                None,
                every=0.02,
            )
            source = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["replicas"][1]
            await controller.service.contributors.revoke_node("node-2")
            # Its attempt ends stopped (node_revoked, docs/agents.md); the replica keeps
            # failing to start there.
            await controller.wait_service(
                service_id, lambda v: v["replicas"][1]["state"] == "failed"
            )
            ended = await controller.service.store.read(
                lambda tx: repository.attempt(tx, source["attempt_id"])
            )
            assert (ended.state, ended.reason, ended.released) == (
                AttemptState.STOPPED,
                "node_revoked",
                True,
            )
            stop_source = await _moved_off_node_2(ops, service_id)
            assert stop_source["ok"] and stop_source["details"]["given_up"] is False
            assert stop_source["details"]["node_state"] == "revoked"
            # Nothing launched on node-2 after the move.
            detail = await controller.service.inference.get(None, service_id)
            assert detail.attempts[-1].node_id == "local"
            assert not any(a.node_id == "node-2" and not a.released for a in detail.attempts)


@pytest.mark.deadline(130)
async def test_a_move_onto_a_node_holding_the_model_for_another_replica_needs_no_more_disk(
    tmp_path, monkeypatch
):
    # The target's disk check counted the model's staged copy a second time.
    from ficc_core.agent import agent as agent_module

    measured = agent_module.measure_resources
    disk: dict[str, int] = {}

    def measure(state_dir):
        found = measured(state_dir)
        if "free" not in disk:
            return found
        return attrs.evolve(found, disk_free_bytes=disk["free"])

    monkeypatch.setattr(agent_module, "measure_resources", measure)
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, heartbeat_interval="200ms") as ops:
            controller = ops.controller
            service_id = await ops.running("local", "node-2")
            held = await controller.service.store.read(
                lambda tx: repository.reservations(tx, service_id)
            )
            [(generation, size)] = [(r.generation, r.disk_bytes) for r in held if r.replica == 1]
            assert size > 0
            # node-2 has room for the model once more, not twice.
            disk["free"] = size + size // 2
            node = await controller.node("node-2")
            while node["snapshot"]["resources"]["disk_free_bytes"] != disk["free"]:
                await trio.sleep(0.05)
                node = await controller.node("node-2")
            response = await _move(controller, service_id, 0, target_node_id="node-2")
            assert response.status_code == 200, response.text
            assert response.json()["final_state"] == "moved", response.text
            held = await controller.service.store.read(
                lambda tx: repository.reservations(tx, service_id)
            )
            assert sorted((r.key, r.disk_bytes) for r in held) == [
                ((generation, 0, "node-2"), 0),
                ((generation, 1, "node-2"), size),
            ]


@pytest.mark.deadline(130)
async def test_moving_the_replica_that_carried_a_nodes_staged_copy_leaves_its_disk_counted(
    tmp_path,
):
    # The replica that stayed on node-2 held no disk for the copy it still runs from.
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("node-2", "node-2")

            async def disks() -> list[tuple[tuple[int, int, str], int]]:
                held = await controller.service.store.read(
                    lambda tx: repository.reservations(tx, service_id)
                )
                return sorted((r.key, r.disk_bytes) for r in held)

            [(key, size), (other, none)] = await disks()
            assert key[1:] == (0, "node-2") and size > 0 and (other[1:], none) == ((1, "node-2"), 0)
            response = await _move(controller, service_id, 0, target_node_id="local")
            assert response.status_code == 200, response.text
            assert response.json()["final_state"] == "moved", response.text
            # The embedded node reads the blob store in place: no disk there.
            assert await disks() == [((key[0], 0, "local"), 0), ((key[0], 1, "node-2"), size)]
            node = await controller.node("node-2")
            assert [r["disk_bytes"] for r in node["reservations"]] == [size]


@pytest.mark.deadline(130)
async def test_after_a_rolled_back_move_a_stopped_service_shows_the_replica_where_it_ran(
    tmp_path,
):
    # The rolled-back target, the replica's newest attempt, stood for it once stopped.
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local")
            [source] = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["replicas"]
            mover = controller.service.inference.mover
            mover.hook = _fail_at("wait_target_health")
            response = await _move(controller, service_id, target_node_id="node-2")
            assert response.json()["final_state"] == "failed", response.text

            async def target_ends_by_itself(step: str) -> None:
                if step != "wait_target_health":
                    return
                driver = await controller.service.reconciler.driver_of(service_id)
                [target] = [a for a in driver.held if a != source["attempt_id"]]
                attempt = await controller.service.store.read(
                    lambda tx: repository.attempt(tx, target)
                )
                await mover.attempts.stop(attempt)  # as if its engine ended there
                raise _Fault("the target ended")

            mover.hook = target_ends_by_itself
            response = await _move(controller, service_id, target_node_id="node-2")
            assert response.json()["final_state"] == "failed", response.text
            mover.hook = _fail_at()
            assert (await controller.control(service_id, "stop")).status_code == 200
            view = await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            [replica] = view["replicas"]
            assert replica["attempt_id"] == source["attempt_id"]
            assert replica["reason"] != "move_rolled_back"
            detail = await controller.service.inference.get(None, service_id)
            assert [(a.node_id, a.reason) for a in detail.attempts] == [
                ("local", "stopped"),
                ("node-2", "move_rolled_back"),
                ("node-2", "move_rolled_back"),
            ]
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/status")
            [replica] = status["replicas"]
            assert replica["attempt_id"] == source["attempt_id"]


@pytest.mark.deadline(130)
async def test_a_replica_on_an_unreachable_node_moves_off_it_without_waiting_for_the_node(
    tmp_path,
):
    # It was refused as failed_rolled_back: the move asked the silent node to stop the
    # source, which it could not, and rolled the target back.
    timings = {"unreachable_after": "1s", "lost_after": "600s", "heartbeat_interval": "200ms"}
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, **timings) as ops:
            controller = ops.controller
            service_id = await ops.running("local", "node-2")
            source = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["replicas"][1]
            ops.node_2.cancel()  # its agent stops: node-2 goes unreachable (lost only in 10 min)
            await controller.wait_node("node-2", "unreachable")
            began = trio.current_time()
            # An unreachable node may come back: it is removed only once lost or revoked.
            stop_source = await _moved_off_node_2(ops, service_id, removable=False)
            # Bounded by the target's start, not by the silent node or the drain bound.
            assert trio.current_time() - began < 30
            assert stop_source["ok"] and stop_source["details"]["given_up"] is True
            assert stop_source["details"]["node_state"] == "unreachable"
            given_up = await controller.service.store.read(
                lambda tx: repository.attempt(tx, source["attempt_id"])
            )
            # Whether it still runs there is unknown; its node stops it if it comes back.
            assert given_up.released and given_up.reason == "moved"
            assert given_up.state == AttemptState.UNKNOWN
            assignments = await controller.service.contributors.assignments("node-2")
            [assignment] = [a for a in assignments if a.attempt_id == source["attempt_id"]]
            assert not assignment.wanted


@pytest.mark.deadline(130)
async def test_after_an_interrupted_move_a_stopped_service_shows_the_replica_where_it_ran(
    tmp_path,
):
    # The move's client gave up (its request was cancelled) while the target loaded: the
    # target was stopped as a stray (move_interrupted), and the stopped service showed
    # that attempt, on the target, as the replica's.
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            controller = ops.controller
            service_id = await ops.running("local")
            [source] = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["replicas"]
            mover = controller.service.inference.mover
            loading: list[str] = []

            async def hang(step: str) -> None:
                if step == "wait_target_health":
                    driver = await controller.service.reconciler.driver_of(service_id)
                    loading.extend(a for a in driver.held if a != source["attempt_id"])
                    await trio.sleep_forever()

            mover.hook = hang
            with pytest.raises(httpx.TimeoutException):
                await controller.call(
                    "POST",
                    f"/api/v1/inference/{service_id}/replicas/0/move",
                    json={"target_node_id": "node-2"},
                    timeout=2,
                )
            [target] = loading
            while True:
                ended = await controller.service.store.read(
                    lambda tx: repository.attempt(tx, target)
                )
                if ended.released:
                    break
                await trio.sleep(0.05)
            assert (ended.node_id, ended.reason) == ("node-2", "move_interrupted")
            mover.hook = _fail_at()
            assert (await controller.control(service_id, "stop")).status_code == 200
            view = await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            [replica] = view["replicas"]
            assert (replica["attempt_id"], replica["node_id"]) == (source["attempt_id"], "local")
            assert replica["reason"] != "move_interrupted"
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/status")
            [replica] = status["replicas"]
            assert replica["attempt_id"] == source["attempt_id"]
            assert replica["node"]["id"] == "local", replica["node"]


@pytest.mark.deadline(130)
async def test_a_replica_whose_node_just_dropped_its_connection_moves_off_it(tmp_path):
    # Before its node was unreachable the move asked it to stop the source over the
    # connection that was gone, and ended failed_rolled_back.
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path, unreachable_after="60s") as ops:
            controller = ops.controller
            service_id = await ops.running("local", "node-2")
            source = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["replicas"][1]
            ops.node_2.cancel()
            await eventually(
                lambda: not controller.service.contributors.connected_here("node-2"),
                None,
                every=0.02,
            )
            assert (await controller.node("node-2"))["state"] == "connected"  # as recorded
            stop_source = await _moved_off_node_2(ops, service_id, removable=False)
            assert stop_source["ok"] and stop_source["details"]["given_up"] is True
            given_up = await controller.service.store.read(
                lambda tx: repository.attempt(tx, source["attempt_id"])
            )
            assert given_up.released and given_up.reason == "moved"
            assert given_up.state == AttemptState.UNKNOWN
