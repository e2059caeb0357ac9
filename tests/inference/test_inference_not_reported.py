"""An attempt its node no longer runs: stopped by the node, or failed.

The node's reconnection says which (docs/agents.md): an attempt its new connection's
reconciliation lists as missing was stopped by the node (an agent that restarted, or
leases that ran out while it was cut off). The status command that finds it gone can
reach the new connection before that reconciliation exists; the judgement then waits
for it, instead of reading the previous connection's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from ficc_core.contributors.assignments import Reconciliation
from ficc_core.inference.reconciliation.attempts import Attempts
from ficc_core.inference.records import AttemptRecord, AttemptState

from ..support.inference_support import open_inference_controller, standin_engine
from .test_status import _standin_service

ATTEMPT = AttemptRecord(
    attempt_id="svc.r0.g1.a1.abc",
    service_id="svc",
    replica=0,
    generation=1,
    number=1,
    node_id="node2",
    provider="process",
    plan_digest="sha256:x",
    state=AttemptState.READY,
    created_at=0.0,
    updated_at=0.0,
)


class Nodes:
    """The registry as the judgement reads it: the live connection's reconciliation."""

    def __init__(self) -> None:
        self.current: Reconciliation | None = None

    def reconciliation(self, node_id: str) -> Reconciliation | None:
        return self.current

    def connected_here(self, node_id: str) -> bool:
        return True


def attempts(nodes: Nodes) -> tuple[Attempts, list[dict[str, Any]]]:
    ended: list[dict[str, Any]] = []

    async def set_attempt(service_id: str, attempt_id: str, **fields: Any) -> None:
        ended.append(fields)

    found = Attempts(
        observations=SimpleNamespace(set_attempt=set_attempt),  # type: ignore[arg-type]
        contributors=nodes,  # type: ignore[arg-type]
        adapters=None,  # type: ignore[arg-type]
        contexts=None,  # type: ignore[arg-type]
        blobs=None,  # type: ignore[arg-type]
        clock=lambda: 0.0,
    )
    return found, ended


async def test_a_reconnection_reconciled_later_still_says_the_node_stopped_it(autojump_clock):
    nodes = Nodes()
    judge, ended = attempts(nodes)

    async def reconciled_soon() -> None:
        await trio.sleep(0.5)
        nodes.current = Reconciliation("conn-2", missing=(ATTEMPT.attempt_id,))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reconciled_soon)
        await judge._not_reported(ATTEMPT)
    [fields] = ended
    assert fields["state"] == AttemptState.STOPPED and fields["reason"] == "not_reported"
    assert "its agent restarted" in fields["message"]


async def test_an_attempt_a_reconciled_connection_does_not_list_failed(autojump_clock):
    nodes = Nodes()
    nodes.current = Reconciliation("conn-1", missing=())
    judge, ended = attempts(nodes)
    await judge._not_reported(ATTEMPT)
    [fields] = ended
    assert fields["state"] == AttemptState.FAILED and fields["reason"] == "not_reported"


@pytest.mark.deadline(70)
async def test_no_reconciliation_within_the_bound_is_a_failure(autojump_clock):
    judge, ended = attempts(Nodes())
    with trio.fail_after(60):
        await judge._not_reported(ATTEMPT)
    assert ended[0]["state"] == AttemptState.FAILED


# -- what a reconnected node confirms ---------------------------------------------------------


async def test_a_nodes_attempts_count_only_once_its_report_is_reconciled(service):
    """On the leader, a node connected here that has not reported yet has not confirmed
    what it runs; once it reported, what it listed as running counts at once and the
    rest waits for the reconciliation; once reconciled, what it said it no longer runs
    never counts, though its record may still say ready."""
    from ficc_core.contributors import NodeRegistry
    from ficc_core.schema import ExecutorSnapshot, Fence, NodeResources, ProviderInfo

    woken: list[str] = []
    nodes = NodeRegistry(service.store, notify=woken.append)
    digest = "sha256:" + "ab" * 32
    snapshot = ExecutorSnapshot(
        node_id="gpu-1",
        providers=[ProviderInfo(name="process", package_digest=digest)],
        resources=NodeResources(cpus=4, memory_bytes=8 << 30, disk_free_bytes=100 << 30),
        endpoint_version=1,
    )
    with trio.fail_after(10):
        await nodes.add_node("gpu-1")
        # What the controller had launched there before it restarted.
        for attempt_id in ("kept", "gone"):
            fence = Fence(attempt_id=attempt_id, generation=1, plan_digest=digest)
            await nodes.assign("gpu-1", fence, "process")
        known = await nodes.wanted_attempt_ids("gpu-1")
        # The link is the edge to the node: only its presence matters here.
        connection = await nodes.connect("gpu-1", trio.CancelScope(), link=object())  # type: ignore[arg-type]
        report = [
            {
                "attempt_id": "kept",
                "generation": 1,
                "plan_digest": digest,
                "provider": "process",
                "state": "ready",
            }
        ]
        assert nodes.trouble("gpu-1") == "node gpu-1 connected but has not reported yet"
        await nodes.heartbeat("gpu-1", connection, snapshot, report)
        assert nodes.trouble("gpu-1") is None
        assert nodes.attempt_trouble("gpu-1", "kept") is None  # it said it runs it
        assert (
            nodes.attempt_trouble("gpu-1", "gone")
            == "node gpu-1 connected but what it runs is not reconciled yet"
        )
        assert woken == ["gpu-1"]

        reconciled = await nodes.reconcile("gpu-1", connection, report, known)
        assert reconciled.missing == ("gone",)
        assert woken == ["gpu-1", "gpu-1"]  # what runs there is looked at again at once
        assert nodes.trouble("gpu-1") is None
        assert nodes.attempt_trouble("gpu-1", "kept") is None
        assert nodes.attempt_trouble("gpu-1", "gone") == (
            "node gpu-1 reported on connecting that it no longer runs it"
        )


class Switch:
    """A leadership the test hands over: a standby, then the leader (a change of leader)."""

    leading = False
    renewing = False
    term = 1

    def require_leader(self, action: str) -> None:
        """Unused here."""


async def test_a_new_leader_keeps_counting_what_the_connection_reported_running(service):
    """A standby that heard a node's heartbeats and then takes the lease does not take
    that node's running attempts out of service while it reconciles the connection
    (no ready -> starting -> ready flap after a change of leader): what the connection
    listed as running counts at once, what it did not (or listed as ended) waits."""
    from ficc_core.contributors import NodeRegistry
    from ficc_core.schema import ExecutorSnapshot, NodeResources, ProviderInfo

    leadership = Switch()
    nodes = NodeRegistry(service.store, leadership=leadership)
    digest = "sha256:" + "cd" * 32
    snapshot = ExecutorSnapshot(
        node_id="gpu-2",
        providers=[ProviderInfo(name="process", package_digest=digest)],
        resources=NodeResources(cpus=4, memory_bytes=8 << 30, disk_free_bytes=100 << 30),
        endpoint_version=1,
    )

    def attempt(attempt_id: str, state: str) -> dict[str, Any]:
        return {
            "attempt_id": attempt_id,
            "generation": 1,
            "plan_digest": digest,
            "provider": "process",
            "state": state,
        }

    with trio.fail_after(10):
        await nodes.add_node("gpu-2")
        connection = await nodes.connect("gpu-2", trio.CancelScope(), link=object())  # type: ignore[arg-type]
        report = [attempt("serving", "ready"), attempt("ended", "exited")]
        await nodes.heartbeat("gpu-2", connection, snapshot, report)
        assert nodes.attempt_trouble("gpu-2", "serving") is None  # the standby routes it

        leadership.leading = leadership.renewing = True  # it takes the lease: term 2
        leadership.term = 2
        assert nodes.reconciliation("gpu-2") is None  # not reconciled by this leader yet
        assert nodes.trouble("gpu-2") is None
        assert nodes.attempt_trouble("gpu-2", "serving") is None
        not_yet = "node gpu-2 connected but what it runs is not reconciled yet"
        assert nodes.attempt_trouble("gpu-2", "ended") == not_yet
        assert nodes.attempt_trouble("gpu-2", "never-reported") == not_yet

        # A new connection of the node has not reported: nothing it runs counts yet.
        replacement = await nodes.connect("gpu-2", trio.CancelScope(), link=object())  # type: ignore[arg-type]
        assert nodes.attempt_trouble("gpu-2", "serving") is not None
        await nodes.heartbeat("gpu-2", replacement, snapshot, [attempt("serving", "ready")])
        assert nodes.attempt_trouble("gpu-2", "serving") is None


# -- after a controller restart, end to end -------------------------------------------------


@pytest.mark.deadline(130)
async def test_a_restarted_controller_never_claims_ready_for_an_attempt_its_node_dropped(tmp_path):
    """A fresh embedded agent runs nothing the last one ran: until the old attempt is
    ended, the service's state (stored, so each change is an event) is never ``ready``
    on its account, and its replica never serves."""
    engine, settings = standin_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            service_id = await _standin_service(controller, tmp_path, engine)
            assert (await controller.control(service_id, "start")).status_code == 200
            ready = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            old = ready["replicas"][0]["attempt_id"]
            before = await _events(controller, service_id)
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            await controller.wait_service(
                service_id,
                lambda v: v["state"] == "ready" and v["replicas"][0]["attempt_id"] != old,
            )
            events = await _events(controller, service_id)
    seen = [e for e in events if e["id"] > before[-1]["id"]]
    [ended] = [e for e in seen if e.get("attempt_id") == old and e["details"].get("released")]
    assert ended["reason"] == "not_reported", ended
    claimed = [
        e["message"]
        for e in seen
        if e["kind"] == "service.state"
        and e["details"]["state"]["to"] == "ready"
        and e["id"] < ended["id"]
    ]
    assert not claimed, [e["message"] for e in seen]


async def _events(controller, service_id: str) -> list[dict[str, Any]]:
    path = f"/api/v1/inference/{service_id}/events"
    return (await controller.ok("GET", path, params={"limit": 500}))["events"]
