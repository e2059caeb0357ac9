"""The controller serves one node connection: welcome, heartbeats, lease renewals, fencing.

The messages are the node protocol's (:mod:`ficc_core.nodelink`); what is here
is their effect on the :class:`~ficc_core.contributors.registry.NodeRegistry`:
the connection registered (and an older one of the node to this controller fenced
out), heartbeats recorded, the first report reconciled with what the controller
wanted, and attempts the controller no longer wants stopped through the node.
Heartbeats are recorded by a task beside the loop that receives the node's messages,
so a store that is slow or down never holds up the relayed streams (docs/operations.md,
"When the database is down").

With several controllers (docs/operations.md, "Several controllers") a node keeps a
connection to each. Every one records its heartbeats and relays its endpoint action
and logs; only the leader's renews the node's leases, reconciles its report and
stops what it does not want, each message carrying the leader's term. The welcome
says which this controller is (``role``, ``term``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from ..base.errors import FiccError, InvalidRequest
from ..nodelink.links import ConnectionLink, MessageChannel, NodeLink
from ..nodelink.wire import GOODBYE, MAX_MESSAGE, PROTOCOL_VERSION, heartbeat_attempts
from ..schema import ExecutorSnapshot, Fence, SchemaError, unstructure
from ..schema.snapshot import snapshot_from_wire
from ..store.outage import is_store_failure
from .assignments import Reconciliation
from .errors import ConnectionFenced
from .registry import NodeRegistry

log = logging.getLogger("ficc.contributors")


async def serve_node_connection(
    registry: NodeRegistry,
    node_id: str,
    channel: MessageChannel,
    *,
    heartbeat_interval: float,
    lease_duration: float,
    agent_version: str | None = None,
) -> None:
    """Serve one authenticated node connection until it ends, is fenced out or fails.

    ``agent_version`` is the node protocol version the agent dialled with (None: an
    agent before versions), already negotiated (:func:`~ficc_core.nodelink.wire.negotiate`).
    """
    if registry.live.closing:
        await _last_word(channel, GOODBYE)  # the controller is stopping: come back later
        return
    link = ConnectionLink(channel, node=node_id)
    leadership = registry.leadership
    # What the controller wanted before this connection: reconciled with the first report.
    known = await registry.wanted_attempt_ids(node_id)
    reconciled = False
    ignored: set[str] = set()  # a newer agent's snapshot fields, logged once each
    async with trio.open_nursery() as nursery:
        connection_id = await registry.connect(node_id, nursery.cancel_scope, link)
        log.info("node %s connected (connection %s)", node_id, connection_id)
        try:
            await channel.send(
                json.dumps(
                    {
                        "type": "welcome",
                        "node_id": node_id,
                        "connection_id": connection_id,
                        "heartbeat_interval": heartbeat_interval,
                        "lease_duration": lease_duration,
                        "role": "leader" if leadership.leading else "standby",
                        "term": leadership.term,
                        "protocol_version": PROTOCOL_VERSION,
                    }
                )
            )

            async def renew() -> None:
                # Only the leader renews: a standby's renewal would keep alive what the
                # leader may have given up. A controller that just took the lease renews
                # at once (within a second), not a third of a lease later: the node's
                # leases went unrenewed for the whole takeover already.
                period = lease_duration / 3
                renewed_term, renewed_at = None, -math.inf
                while True:
                    now = trio.current_time()
                    term = leadership.term
                    due = term != renewed_term or now - renewed_at >= period
                    if leadership.renewing and due:
                        renewal = {"type": "renew", "duration": lease_duration, "term": term}
                        await channel.send(json.dumps(renewal))
                        renewed_term, renewed_at = term, now
                    await trio.sleep(min(1.0, period))

            nursery.start_soon(renew)
            await nursery.start(link.endpoint.run)
            heartbeats = _Heartbeats()

            async def record(receiving: trio.CancelScope) -> None:
                # Heartbeats are written beside the receiving loop, never in it: a slow or
                # failing store must not hold up the relayed streams' messages behind it.
                nonlocal reconciled
                try:
                    while True:
                        snapshot, attempts = await heartbeats.take()
                        recorded = await registry.heartbeat(
                            node_id, connection_id, snapshot, attempts
                        )
                        # Reconciled with the first heartbeat the store took (while it
                        # fails, the connection goes on and a later heartbeat tries again).
                        # A standby leaves the report to the leader (it stops nothing).
                        if reconciled or recorded is None or not leadership.leading:
                            continue
                        try:
                            result = await registry.reconcile(
                                node_id, connection_id, attempts, known
                            )
                        except Exception as exc:
                            if not is_store_failure(exc):
                                raise
                            registry.states.outage.failed(exc, f"reconciling node {node_id}")
                            continue
                        reconciled = True
                        _log_reconciliation(node_id, result)
                        if result.stop:
                            nursery.start_soon(
                                _stop_unwanted, link, node_id, result.stop, leadership.term
                            )
                except FiccError as exc:  # fenced out, or refused: the connection ends
                    heartbeats.failure = exc
                    receiving.cancel()

            with trio.CancelScope() as receiving:
                nursery.start_soon(record, receiving)
                while True:
                    raw = await channel.receive()
                    if len(raw) > MAX_MESSAGE:
                        raise InvalidRequest("the message is too large", code="bad_heartbeat")
                    if isinstance(raw, bytes):
                        link.endpoint.deliver_binary(raw)
                        continue
                    try:
                        message = json.loads(raw)
                    except ValueError:
                        raise InvalidRequest(
                            "messages must be JSON", code="bad_heartbeat"
                        ) from None
                    if not isinstance(message, dict):
                        continue
                    if message.get("type") == "reply":
                        link.deliver(message)
                        continue
                    if message.get("type") == "relay":
                        try:
                            link.endpoint.deliver(message)
                        except (KeyError, TypeError, ValueError):
                            log.warning("node %s sent a malformed relay message", node_id)
                        continue
                    if message.get("type") != "heartbeat":
                        continue
                    try:
                        snapshot, dropped = snapshot_from_wire(message.get("snapshot"))
                    except SchemaError as exc:
                        raise InvalidRequest(exc.message, code="bad_heartbeat") from None
                    if not ignored.issuperset(dropped):
                        ignored.update(dropped)
                        log.info(
                            "node %s (protocol %s) sent fields this controller does not "
                            "know, ignored: %s",
                            node_id,
                            agent_version,
                            ", ".join(dropped),
                        )
                    heartbeats.put(snapshot, heartbeat_attempts(message.get("attempts", [])))
            if heartbeats.failure is not None:
                raise heartbeats.failure
        except ConnectionFenced:
            pass  # said in the finally block below
        except FiccError as exc:
            log.warning("node %s: %s [%s]", node_id, exc.message, exc.code)
            await _last_word(channel, {"type": "error", "code": exc.code, "message": exc.message})
        finally:
            link.close()
            if registry.replaced(node_id, connection_id):
                await _last_word(channel, {"type": "fenced"})
            elif registry.live.closing:
                await _last_word(channel, GOODBYE)
            registry.disconnect(node_id, connection_id)
            nursery.cancel_scope.cancel()


class _Heartbeats:
    """The newest heartbeat not yet recorded (each report is whole: a newer one replaces
    one still waiting), and what recording one raised."""

    def __init__(self) -> None:
        self.latest: tuple[ExecutorSnapshot, list[dict[str, Any]]] | None = None
        self.arrived = trio.Event()
        self.failure: FiccError | None = None

    def put(self, snapshot: ExecutorSnapshot, attempts: list[dict[str, Any]]) -> None:
        self.latest = (snapshot, attempts)
        self.arrived.set()

    async def take(self) -> tuple[ExecutorSnapshot, list[dict[str, Any]]]:
        await self.arrived.wait()
        self.arrived = trio.Event()
        latest, self.latest = self.latest, None
        assert latest is not None
        return latest


def _log_reconciliation(node_id: str, result: Reconciliation) -> None:
    if result.adopted or result.stop or result.missing:
        log.info(
            "node %s reconnected: adopted %s, stopping %s, no longer running %s",
            node_id,
            list(result.adopted),
            [fence.attempt_id for fence in result.stop],
            list(result.missing),
        )


async def _stop_unwanted(link: NodeLink, node_id: str, fences: Sequence[Fence], term: int) -> None:
    """Stop, through the node, the attempts a reconciliation does not want."""
    for fence in fences:
        try:
            await link.call({"op": "stop", "fence": unstructure(fence), "term": term})
        except FiccError as exc:
            log.warning(
                "node %s: could not stop unwanted attempt %s: %s",
                node_id,
                fence.attempt_id,
                exc.message,
            )


async def _last_word(channel: MessageChannel, message: Mapping[str, Any]) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(1):
        try:
            await channel.send(json.dumps(message))
        except Exception:  # the peer may already be gone; nothing more to say then
            pass
