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

import trio

from ficc_core.contributors.assignments import Reconciliation
from ficc_core.inference.attempts import Attempts
from ficc_core.inference.records import AttemptRecord, AttemptState

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


async def test_no_reconciliation_within_the_bound_is_a_failure(autojump_clock):
    judge, ended = attempts(Nodes())
    with trio.fail_after(60):
        await judge._not_reported(ATTEMPT)
    assert ended[0]["state"] == AttemptState.FAILED
