"""Node states: what heartbeats, silence and connections make of a node.

A node is ``connected`` while its heartbeats arrive, ``unreachable`` once none
came for ``unreachable_after`` seconds (no new work goes there), and ``lost``
after ``lost_after`` seconds, when every attempt it last reported becomes
``unknown`` and nothing assigned to it is wanted any more. A node that never
connected is ``registered``; a revoked one stays ``revoked``.

A store outage is not the nodes' silence: heartbeats that could not be recorded
are heard in memory (the registry's), the sweep pauses while the store fails, and
once it answers again silence counts from then (a node is unreachable only
``unreachable_after`` seconds after the store's return with no heartbeat since).

Every change of a node's state is an event (:func:`node_changed`), written with it.
Each connection gets a new ID, recorded here per controller (a node keeps a
connection to every controller sharing the store); a heartbeat from any other
connection of the node to the same controller is refused
(:class:`~.errors.ConnectionFenced`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from ..base.errors import InvalidRequest
from ..events import EventKind, Subject, record
from ..schema import ExecutorSnapshot, canonical_json
from ..store import Store, Transaction
from ..store.outage import Backoff, OutageLog, is_store_failure
from . import repository
from .errors import ConnectionFenced, NodeCredentialRevoked, NodeNotFound
from .records import AssignmentReason, Node, NodeAttempt, NodeState

log = logging.getLogger("ficc.contributors")


def forget_attempts(tx: Transaction, node_id: str, now: float) -> None:
    """A lost or revoked node: its running attempts are unknown, its assignments unwanted."""
    repository.mark_attempts_unknown(tx, node_id, now)
    repository.unwant_all(tx, node_id, AssignmentReason.UNKNOWN, now)


def node_changed(
    tx: Transaction,
    node: Node,
    state: NodeState,
    now: float,
    *,
    reason: str,
    message: str,
) -> None:
    """Record the event of ``node`` (as it was) moving to ``state``; nothing if it was there."""
    if node.state == state:
        return
    record(
        tx,
        at=now,
        kind=EventKind.NODE_STATE,
        subject=Subject.NODE,
        subject_id=node.id,
        node_id=node.id,
        reason=reason,
        message=f"node {node.id}: {node.state} → {state}: {message}",
        details={
            "state": {"from": str(node.state), "to": str(state)},
            "last_heartbeat": node.last_heartbeat,
        },
    )


def _silence(node: Node, now: float) -> str:
    silent = now - (node.last_heartbeat or now)
    return f"no heartbeat for {silent:.0f} s"


def _connectable(tx: Transaction, node_id: str) -> Node:
    node = repository.fetch_node(tx, node_id)
    if node is None:
        raise NodeNotFound(node_id)
    if node.revoked_at is not None:
        raise NodeCredentialRevoked(node_id)
    return node


class NodeStates:
    """Records connections and heartbeats, and sweeps silent nodes to unreachable or lost.

    :param unreachable_after: seconds without a heartbeat before a node is unreachable.
    :param lost_after: seconds without a heartbeat before it is lost (at least
        ``unreachable_after``).
    :param clock: wall-clock seconds.
    :param controller_id: this controller's name: connections are fenced per controller.
    """

    def __init__(
        self,
        store: Store,
        *,
        unreachable_after: float,
        lost_after: float,
        clock: Callable[[], float],
        controller_id: str = "",
    ) -> None:
        self.store = store
        self.controller_id = controller_id
        self.unreachable_after = unreachable_after
        self.lost_after = max(lost_after, unreachable_after)
        self.clock = clock
        #: Store failures of heartbeats and sweeps (one warning per outage).
        self.outage = OutageLog("node heartbeats and states", logger=log)
        #: Since when this controller can hear every node: when its sweep started (its
        #: start, or its taking the lease) or the store answered again after an outage.
        #: Silence counts from then (``clock`` seconds; None before the sweep runs), so
        #: a node is never made unreachable or lost for heartbeats it could not send
        #: while this controller was away.
        self.resumed_at: float | None = None

    async def connect(self, node_id: str, connection_id: str) -> None:
        """Record ``connection_id`` as the node's newest connection (refused when revoked)."""

        def write(tx: Transaction) -> None:
            _connectable(tx, node_id)
            repository.set_connection(tx, node_id, connection_id, self.controller_id)

        await self.store.write(write)

    async def heartbeat(
        self,
        node_id: str,
        connection_id: str,
        snapshot: ExecutorSnapshot,
        attempts: Sequence[Mapping[str, Any]] = (),
    ) -> Node:
        """Record a heartbeat: the node is connected; its snapshot and attempts are current.

        ``attempts`` are the agent's report (``attempt_id``, ``generation``,
        ``plan_digest``, ``provider``, ``state``); they replace what the node
        reported before.
        """
        if snapshot.node_id != node_id:
            raise InvalidRequest(
                f"the snapshot names node {snapshot.node_id!r}, but this is node {node_id!r}",
                code="node_mismatch",
            )
        document = canonical_json(snapshot).decode("utf-8")
        now = self.clock()
        reported = [NodeAttempt.from_report(attempt, updated_at=now) for attempt in attempts]

        def write(tx: Transaction) -> Node:
            before = _connectable(tx, node_id)
            if repository.link_connection(tx, node_id, self.controller_id) != connection_id:
                raise ConnectionFenced(
                    f"a newer connection of node {node_id!r} replaced this one",
                    details={"node": node_id},
                )
            repository.record_heartbeat(tx, node_id, now=now, snapshot=document, attempts=reported)
            node_changed(
                tx,
                before,
                NodeState.CONNECTED,
                now,
                reason="heartbeat",
                message="its heartbeats arrive"
                + ("" if before.last_heartbeat is None else f" again ({_silence(before, now)})"),
            )
            node = repository.fetch_node(tx, node_id)
            assert node is not None  # checked above, in this transaction
            return node

        return await self.store.write(write)

    async def sweep(self) -> list[tuple[str, NodeState]]:
        """Move silent nodes to unreachable or lost; return the ``(node, state)`` changes.

        Within ``unreachable_after`` (``lost_after``) of the sweep's start, or of the
        store's return after an outage, no node is made unreachable (lost): while no
        controller ran, or the store failed, its heartbeats could not be recorded.
        """
        now = self.clock()
        since = now - (self.resumed_at if self.resumed_at is not None else -float("inf"))
        expire_unreachable = since > self.unreachable_after
        expire_lost = since > self.lost_after

        def write(tx: Transaction) -> list[tuple[str, NodeState]]:
            lost = (
                repository.silent_node_ids(
                    tx,
                    now=now,
                    silent_for=self.lost_after,
                    states=(NodeState.CONNECTED, NodeState.UNREACHABLE),
                )
                if expire_lost
                else []
            )
            unreachable = (
                [
                    node_id
                    for node_id in repository.silent_node_ids(
                        tx,
                        now=now,
                        silent_for=self.unreachable_after,
                        states=(NodeState.CONNECTED,),
                    )
                    if node_id not in lost
                ]
                if expire_unreachable
                else []
            )
            for node_id in lost:
                before = repository.fetch_node(tx, node_id)
                repository.set_state(tx, node_id, NodeState.LOST)
                forget_attempts(tx, node_id, now)
                if before is not None:
                    node_changed(
                        tx,
                        before,
                        NodeState.LOST,
                        now,
                        reason="node_lost",
                        message=f"{_silence(before, now)}; what it ran is unknown",
                    )
            for node_id in unreachable:
                before = repository.fetch_node(tx, node_id)
                repository.set_state(tx, node_id, NodeState.UNREACHABLE)
                if before is not None:
                    node_changed(
                        tx,
                        before,
                        NodeState.UNREACHABLE,
                        now,
                        reason="no_heartbeat",
                        message=f"{_silence(before, now)}; no new work goes there",
                    )
            changes = [(node_id, NodeState.LOST) for node_id in lost]
            changes += [(node_id, NodeState.UNREACHABLE) for node_id in unreachable]
            return sorted(changes)

        return await self.store.write(write)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep node states on a short period until cancelled; a store that fails
        pauses the sweep (tried again with a bounded backoff), never ends it."""
        period = max(0.05, min(1.0, self.unreachable_after / 4))
        backoff = Backoff()
        # A node silent since before this controller started (it was stopped, or the
        # previous leader went) gets the whole of unreachable_after to connect again.
        self.resumed_at = self.clock()
        task_status.started()
        while True:
            try:
                if self.outage.failing:
                    # The store failed (a sweep's or a heartbeat's write): silence counts
                    # from its return, so the sweep waits for a read to go through first.
                    await self.store.read(lambda tx: None)
                    self.resumed_at = self.clock()
                    self.outage.answered()
                await self.sweep()
            except Exception as exc:
                if not is_store_failure(exc):
                    raise
                self.outage.failed(exc, "the sweep of silent nodes")
                await backoff.wait()
                continue
            backoff.reset()
            await trio.sleep(period)
