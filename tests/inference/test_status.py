"""Replica status: derivations, the status route, and `ficc inference show`.

The route and CLI tests run the stand-in engine as the llama_server runtime on the
embedded node (a tiny GGUF as its model), so an engine starts in well under a
second; the real llama.cpp engine killed with SIGKILL is tests/inference/test_status_e2e.py.
"""

from __future__ import annotations

import json
import os
import re
import signal

import attrs
import pytest
import trio

from ficc_core.auth import ALL_SCOPES
from ficc_core.inference.reconciliation.status import (
    current_attempts,
    last_exit,
    node_status,
    restarts,
    service_status,
    successors,
)
from ficc_core.inference.records import AttemptRecord, ServiceDetail, ServiceRecord

from ..cli.test_cli_inference import Cli
from ..conftest import issue_token
from ..schema.test_schema_spec import SPECIFICATION
from ..support.inference_support import (
    llama_spec,
    open_inference_controller,
    register_gguf,
    standin_engine,
)
from ..support.models_support import tiny_gguf

# -- derivations -----------------------------------------------------------------------------


def _attempt(replica: int, generation: int, number: int, state: str, **fields) -> AttemptRecord:
    return AttemptRecord(
        attempt_id=f"svc.r{replica}.g{generation}.a{number}",
        service_id="svc",
        replica=replica,
        generation=generation,
        number=number,
        node_id=fields.pop("node_id", "n1"),
        provider="process",
        plan_digest="sha256:" + "1" * 64,
        state=state,
        created_at=100.0 + number,
        updated_at=fields.pop("updated_at", 200.0 + number),
        **fields,
    )


def test_restarts_count_the_attempts_of_the_generation_after_the_first():
    attempts = [
        _attempt(0, 1, 1, "stopped"),
        _attempt(0, 2, 1, "failed", reason="killed", signal=9),
        _attempt(0, 2, 2, "failed", reason="exited", exit_code=3),
        _attempt(0, 2, 3, "ready"),
        _attempt(1, 2, 1, "ready"),
    ]
    assert restarts(attempts, 0, 2) == 2
    assert restarts(attempts, 0, 1) == 0
    assert restarts(attempts, 1, 2) == 0
    assert restarts(attempts, 2, 2) == 0


def test_a_replica_shows_the_attempt_serving_it_while_its_successor_starts():
    attempts = [
        # replica 0 moves: its source serves while the target loads on another node
        _attempt(0, 1, 1, "ready"),
        _attempt(0, 1, 2, "loading", node_id="n2"),
        # replica 1 rolls out: generation 1 serves while generation 2 loads
        _attempt(1, 1, 1, "ready"),
        _attempt(1, 2, 1, "launching"),
        # replica 2 exists only in the next generation (a rollout from 2 to 3)
        _attempt(2, 2, 1, "loading"),
        # replica 3 restarted: its replacement is ready, so it stands for the replica
        _attempt(3, 1, 1, "ready"),
        _attempt(3, 1, 2, "ready"),
    ]
    current = current_attempts(attempts, 1)
    assert {i: a.attempt_id for i, a in current.items()} == {
        0: "svc.r0.g1.a1",
        1: "svc.r1.g1.a1",
        2: "svc.r2.g2.a1",
        3: "svc.r3.g1.a2",
    }
    coming = successors(attempts, current)
    assert {i: (a.attempt_id, a.node_id) for i, a in coming.items()} == {
        0: ("svc.r0.g1.a2", "n2"),
        1: ("svc.r1.g2.a1", "n1"),
    }


def test_the_last_exit_is_the_latest_ended_attempt_with_its_code_signal_and_memory_limit():
    attempts = [
        _attempt(0, 1, 1, "failed", reason="memory_limit", signal=9, message="over 1 GiB"),
        _attempt(0, 1, 2, "failed", reason="exited", exit_code=3, message="status 3"),
        _attempt(0, 1, 3, "loading"),
        _attempt(1, 1, 1, "failed", reason="memory_limit", signal=9, updated_at=250.0),
    ]
    exit0 = last_exit(attempts, 0, 1)
    assert (exit0.attempt, exit0.exit_code, exit0.signal) == (2, 3, None)
    assert (exit0.reason, exit0.message, exit0.memory_limit) == ("exited", "status 3", False)
    assert exit0.at == 202.0
    exit1 = last_exit(attempts, 1, 1)
    assert (exit1.signal, exit1.memory_limit, exit1.at) == (9, True, 250.0)
    assert last_exit(attempts, 2, 1) is None
    assert last_exit([_attempt(0, 1, 1, "ready")], 0, 1) is None


def _record(generation: int = 1, **fields) -> ServiceRecord:
    spec = fields.pop("spec", '{"placements": [{"node_id": "n1"}]}')
    return ServiceRecord(
        id="svc",
        project_id="p",
        alias="a",
        model_id="m",
        spec=spec,
        revision=3,
        generation=generation,
        desired=fields.pop("desired", "running"),
        state=fields.pop("state", "ready"),
        reason=None,
        plan_digest=None,
        created_at=1.0,
        updated_at=2.0,
    )


def _fine_node(node_id: str = "n1"):
    return node_status(node_id, None, connected=True, trouble=None, now=100.0)


def test_the_last_exit_is_of_the_generation_the_replica_runs_not_an_abandoned_rollouts():
    # Generation 2 serves; the rollout to generation 3 failed on this replica and was
    # abandoned (its attempts ended, released). The healthy replica has no last exit.
    abandoned = [
        _attempt(0, 3, 1, "failed", reason="exited", exit_code=1, released=True),
        _attempt(0, 3, 2, "failed", reason="exited", exit_code=1, released=True),
    ]
    serving = _attempt(0, 2, 1, "ready", pid=41)
    detail = ServiceDetail(service=_record(2), attempts=(serving, *abandoned), reservations=())
    (replica,) = service_status(detail, {"n1": _fine_node()}, lambda _a: 0, 100.0).replicas
    assert (replica.attempt_id, replica.serving) == ("svc.r0.g2.a1", True)
    assert replica.last_exit is None
    assert replica.successor is None

    # Killed in its own generation and relaunched: that is its last exit, still not the
    # abandoned rollout's.
    killed = _attempt(0, 2, 1, "failed", reason="killed", signal=9, pid=41, released=True)
    again = _attempt(0, 2, 2, "ready", pid=42)
    detail = ServiceDetail(
        service=_record(2), attempts=(killed, again, *abandoned), reservations=()
    )
    (replica,) = service_status(detail, {"n1": _fine_node()}, lambda _a: 0, 100.0).replicas
    assert (replica.attempt, replica.pid, replica.restarts) == (2, 42, 1)
    assert (replica.last_exit.attempt_id, replica.last_exit.signal) == ("svc.r0.g2.a1", 9)
    assert replica.last_exit.pid == 41


def test_show_suggests_starting_with_acknowledge_unknown_only_where_start_accepts_it(capsys):
    from ficc_core.api.views_inference import service_view
    from ficc_core.base.errors import FiccError
    from ficc_core.cli.inference_io import echo_service
    from ficc_core.inference.specification.transitions import require_stopped
    from ficc_core.schema import Specification, structure, unstructure

    document = {**SPECIFICATION, "placements": [SPECIFICATION["placements"][0]] * 2}
    spec = json.dumps(unstructure(structure(document, Specification)))  # as it is stored
    # Replica 1's node was lost while it ran: its outcome is unknown, it is still held.
    lost = _attempt(1, 1, 1, "unknown", reason="node_lost", node_id="node-a")
    attempts = (_attempt(0, 1, 1, "ready", node_id="node-a"), lost)
    cases = {
        ("running", "degraded"): "stop the service, then start it with --acknowledge-unknown",
        ("draining", "draining"): "once the service has stopped, start it with",
        ("stopped", "stopping"): "once the service has stopped, start it with",
        ("stopped", "stopped"): "start with --acknowledge-unknown to give them up",
        ("removed", "removing"): "the service is removed once their node is back or revoked",
    }
    for (desired, state), hint in cases.items():
        record = _record(spec=spec, desired=desired, state=state)
        detail = ServiceDetail(service=record, attempts=attempts, reservations=())
        echo_service(service_view(detail, trouble=lambda _node, _attempt: None))
        [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("unknown:")]
        assert line.startswith(f"unknown:      {lost.attempt_id} ({hint}"), (desired, line)
        # The hint opens with start only where the start route accepts it.
        try:
            require_stopped(record, "start")
        except FiccError as refused:
            assert refused.code == "invalid_transition"
            assert not line.startswith(f"unknown:      {lost.attempt_id} (start"), line
        else:
            assert line.startswith(f"unknown:      {lost.attempt_id} (start with"), line


def test_a_ready_replica_serves_only_where_the_gateway_routes_it():
    from ficc_core.inference.reconciliation.status import serves

    ready = _attempt(0, 1, 1, "ready")

    def fine(_node_id: str, _attempt_id: str) -> str | None:
        return None

    def unreachable(node_id: str, _attempt_id: str) -> str | None:
        return f"node {node_id} is not connected to this controller"

    def dropped(node_id: str, attempt_id: str) -> str | None:
        return "it no longer runs it" if attempt_id == ready.attempt_id else None

    assert serves(_record(), 0, ready, fine)
    # Its node cannot be reached or no longer runs it, the service no longer takes
    # requests, the attempt is of another generation or released, or a scaled service
    # does not run the placement.
    assert not serves(_record(), 0, ready, unreachable)
    assert not serves(_record(), 0, ready, dropped)
    for desired in ("draining", "stopped", "removed"):
        assert not serves(_record(desired=desired), 0, ready, fine)
    assert not serves(_record(2), 0, ready, fine)
    assert not serves(_record(), 0, _attempt(0, 1, 1, "ready", released=True), fine)
    assert not serves(_record(), 0, _attempt(0, 1, 1, "loading"), fine)
    placements = [{**SPECIFICATION["placements"][0], "node_id": "n1"}] * 2
    scaled = {**SPECIFICATION, "placements": placements, "scaling": {"min": 0, "max": 2}}
    record = attrs.evolve(_record(spec=json.dumps(scaled)), active=(1,))
    assert not serves(record, 0, ready, fine)
    assert serves(record, 1, _attempt(1, 1, 1, "ready"), fine)


def test_a_connected_node_that_dropped_or_went_silent_shows_so_and_stops_serving():
    from ficc_core.contributors.records import Node

    def node(state: str) -> Node:
        return Node(
            id="n1",
            name="gpu-1",
            state=state,
            labels={},
            credential_id="cred",
            connection_id="c1",
            last_heartbeat=90.0,
            snapshot=None,
            attempts=(),
            created_at=1.0,
            revoked_at=None,
        )

    fine = node_status("n1", node("connected"), connected=True, trouble=None, now=100.0)
    assert (fine.state, fine.stale, fine.heartbeat_age) == ("connected", False, 10.0)
    dropped = node_status("n1", node("connected"), connected=False, trouble="gone", now=100.0)
    assert (dropped.state, dropped.recorded_state, dropped.stale) == (
        "disconnected",
        "connected",
        False,
    )
    silent = node_status("n1", node("connected"), connected=True, trouble="silent", now=100.0)
    assert (silent.state, silent.stale) == ("stale", True)
    lost = node_status("n1", node("lost"), connected=False, trouble="gone", now=100.0)
    assert lost.state == "lost"
    missing = node_status("n9", None, connected=False, trouble="gone", now=100.0)
    assert (missing.state, missing.name) == ("unknown", None)

    record = _record(spec='{"placements": [{"node_id": "n1"}, {"node_id": "n1"}]}')
    attempts = (_attempt(0, 1, 1, "failed", reason="killed", signal=9), _attempt(0, 1, 2, "ready"))
    detail = ServiceDetail(service=record, attempts=attempts, reservations=())
    for shown, serving in ((fine, True), (dropped, False), (silent, False)):
        status = service_status(detail, {"n1": shown}, {"svc.r0.g1.a2": 3}.get, 100.0)
        first, second = status.replicas
        assert (first.state, first.serving, first.restarts, first.in_flight) == (
            "ready",
            serving,
            1,
            3,
        )
        assert first.last_exit.signal == 9
        assert (second.state, second.attempt_id, second.serving) == ("stopped", None, False)


def test_a_ready_replica_on_a_node_that_cannot_be_reached_does_not_count_as_ready():
    from ficc_core.inference.reconciliation.publication import rolled_up

    attempts = [_attempt(0, 1, 1, "ready", node_id="n1"), _attempt(1, 1, 1, "ready", node_id="n2")]
    assert rolled_up(2, attempts, 1) == ("ready", None)
    troubles = {"n2": "node n2 is not connected to this controller"}

    def trouble(node_id: str, _attempt_id: str) -> str | None:
        return troubles.get(node_id)

    state, reason = rolled_up(2, attempts, 1, trouble=trouble)
    assert state == "degraded"
    assert reason == (
        "replica 1 is ready but cannot be reached: node n2 is not connected to this controller"
    )
    troubles["n1"] = "node n1 missed its heartbeats (none for over 4 s)"
    assert rolled_up(2, attempts, 1, trouble=trouble)[0] == "starting"
    # A failure's message comes first: it says more than an unreachable node.
    failed = [_attempt(0, 1, 1, "failed", message="it broke"), attempts[1]]
    assert rolled_up(2, failed, 1, trouble=trouble) == ("starting", "it broke")


# -- the route and the CLI -------------------------------------------------------------------


async def _standin_service(controller, tmp_path, engine) -> str:
    tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
    model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
    spec = await llama_spec(controller, model_id, memory_bytes=256 << 20)
    spec["image_executable"] = str(engine)
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    return created["id"]


def _replica(status: dict) -> dict:
    (replica,) = status["replicas"]
    return replica


@pytest.mark.deadline(130)
async def test_a_killed_engine_shows_its_exit_and_restart_and_show_says_why(tmp_path):
    engine, settings = standin_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            service_id = await _standin_service(controller, tmp_path, engine)
            path = f"/api/v1/inference/{service_id}/status"

            # Stopped: no attempt yet; its node is the embedded one, connected here.
            status = await controller.ok("GET", path)
            assert (status["service_id"], status["state"]) == (service_id, "stopped")
            replica = _replica(status)
            assert (replica["state"], replica["attempt_id"], replica["restarts"]) == (
                "stopped",
                None,
                0,
            )
            assert (replica["node"]["id"], replica["node"]["state"]) == ("local", "connected")
            assert replica["node"]["connected"] and replica["last_exit"] is None

            # Scopes: inference:read; another project's service is not found.
            reader = await issue_token(controller.service, scopes={"inference:read"})
            assert (await controller.call("GET", path, token=reader)).status_code == 200
            writer = await issue_token(controller.service, scopes={"inference:manage"})
            refused = await controller.call("GET", path, token=writer)
            assert refused.status_code == 403
            await controller.service.auth.create_project("elsewhere")
            stranger = await issue_token(controller.service, project="elsewhere", scopes=ALL_SCOPES)
            response = await controller.call("GET", path, token=stranger)
            assert (response.status_code, response.json()["error"]["code"]) == (
                404,
                "service_not_found",
            )
            missing = await controller.call("GET", "/api/v1/inference/svc_nothing/status")
            assert missing.json()["error"]["code"] == "service_not_found"

            assert (await controller.control(service_id, "start")).status_code == 200
            status = await controller.wait_status(
                service_id, lambda s: s["state"] == "ready" and _replica(s)["health"] == "200"
            )
            first = _replica(status)
            assert first["serving"] and first["restarts"] == 0 and first["in_flight"] == 0
            assert first["started_at"] <= first["health_at"] <= first["ready_at"] + 5
            assert first["pid"] > 0 and first["last_exit"] is None
            assert first["node"]["heartbeat_age"] < 2

            # A ready engine polled over and over writes nothing while nothing changes.
            revision = (await controller.ok("GET", f"/api/v1/inference/{service_id}"))["revision"]
            from ..support.agent_support import heartbeats

            await heartbeats(controller.service, "local", 25)  # 100 ms apart: two polls
            assert (await controller.ok("GET", f"/api/v1/inference/{service_id}"))[
                "revision"
            ] == revision

            # An in-flight request counts on its replica.
            issued = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 60}
            )
            body = {
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "standin_deltas": 200,
                "standin_interval": 0.02,
            }
            async with controller.http.stream(
                "POST",
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                headers={"Authorization": f"Bearer {issued['token']}"},
                json=body,
            ) as streamed:
                assert streamed.status_code == 200
                await controller.wait_status(service_id, lambda s: _replica(s)["in_flight"] == 1)
            await controller.wait_status(service_id, lambda s: _replica(s)["in_flight"] == 0)

            # kill -9 the engine: the exit is recorded, a new attempt starts with a new PID.
            os.kill(first["pid"], signal.SIGKILL)
            status = await controller.wait_status(
                service_id,
                lambda s: _replica(s)["restarts"] == 1 and _replica(s)["health"] == "200",
            )
            second = _replica(status)
            exit_ = second["last_exit"]
            assert (exit_["attempt_id"], exit_["signal"], exit_["exit_code"]) == (
                first["attempt_id"],
                9,
                None,
            )
            assert (exit_["reason"], exit_["memory_limit"]) == ("killed", False)
            assert exit_["failed"] is True  # so REASON still says it
            assert "signal 9" in exit_["message"]
            assert second["attempt"] == first["attempt"] + 1
            assert second["pid"] not in (None, first["pid"])
            await controller.wait_status(service_id, lambda s: s["state"] == "ready")

            # `show`: the replicas table says what happened; REASON is not "-".
            run = Cli(controller.url, controller.token)
            shown = (await run.ok("show", service_id)).stdout
            assert re.search(
                r"^REPLICA\s+STATE\s+NODE\s+ATTEMPT\s+PID\s+RESTARTS\s+LAST EXIT\s+HEALTH"
                r"\s+IN-FLIGHT\s+REASON$",
                shown,
                re.M,
            )
            assert re.search(
                rf"^0\s+ready\s+local\s+{second['attempt']}\s+{second['pid']}\s+1\s+signal 9"
                rf"\s+200\s+0\s+killed$",
                shown,
                re.M,
            ), shown
            assert f"replica 0 last exit (attempt {first['attempt']}): the engine exited" in shown
            assert re.search(r"^0\s+local\s+1\s+256 MiB", shown, re.M), shown
            document = await run.json("show", service_id)
            assert document["id"] == service_id and document["revision"] >= revision
            assert document["status"]["replicas"][0]["last_exit"]["signal"] == 9


@pytest.mark.deadline(130)
async def test_a_stopped_replica_shows_no_pid_or_health_as_if_its_engine_still_ran(tmp_path):
    engine, settings = standin_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            service_id = await _standin_service(controller, tmp_path, engine)
            assert (await controller.control(service_id, "start")).status_code == 200
            ran = _replica(
                await controller.wait_status(
                    service_id, lambda s: s["state"] == "ready" and _replica(s)["health"] == "200"
                )
            )
            assert ran["pid"] > 0

            assert (await controller.control(service_id, "stop")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            replica = _replica(await controller.ok("GET", f"/api/v1/inference/{service_id}/status"))
            assert (replica["state"], replica["attempt_id"]) == ("stopped", ran["attempt_id"])
            assert (replica["pid"], replica["health"], replica["health_at"]) == (None, None, None)
            assert not replica["serving"]
            # How it ended keeps the process it was.
            assert replica["last_exit"]["attempt_id"] == ran["attempt_id"]
            assert replica["last_exit"]["pid"] == ran["pid"]

            shown = (await Cli(controller.url, controller.token).ok("show", service_id)).stdout
            assert re.search(
                rf"^0\s+stopped\s+local\s+{ran['attempt']}\s+-\s+0\s+stopped\s+-\s+0\s+stopped$",
                shown,
                re.M,
            ), shown


def test_a_start_stays_starting_while_the_other_replicas_still_come_up():
    from ficc_core.inference.reconciliation.publication import rolled_up

    ready = _attempt(0, 1, 1, "ready", ready_at=150.0)
    for coming in ("pending", "staging", "launching", "loading"):
        attempts = [ready, _attempt(1, 1, 1, coming)]
        assert rolled_up(2, attempts, 1, starting=True) == ("starting", None)
        # A service that was ready, or is degraded already: a replica not ready degrades it.
        assert rolled_up(2, attempts, 1)[0] == "degraded"
    # Not launched yet at all: still coming up.
    assert rolled_up(2, [ready], 1, starting=True)[0] == "starting"
    # A replica that failed, or whose outcome is unknown: degraded, with the failure.
    failed = [ready, _attempt(1, 1, 1, "failed", reason="exited", message="it broke")]
    assert rolled_up(2, failed, 1, starting=True) == ("degraded", "it broke")
    unknown = [ready, _attempt(1, 1, 1, "unknown", reason="node_lost")]
    assert rolled_up(2, unknown, 1, starting=True)[0] == "degraded"
    # Ready but its node cannot be reached: degraded too.
    both = [ready, _attempt(1, 1, 1, "ready", node_id="n2")]

    def trouble(node_id: str, _attempt_id: str) -> str | None:
        return "gone" if node_id == "n2" else None

    assert rolled_up(2, both, 1, trouble=trouble, starting=True)[0] == "degraded"
    # Every replica ready: ready, starting or not.
    assert rolled_up(2, [ready, _attempt(1, 1, 1, "ready")], 1, starting=True)[0] == "ready"
