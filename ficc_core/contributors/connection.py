"""The controller's side of one node connection: welcome, heartbeats, lease renewals, fencing.

The wire is JSON text messages over any transport with ``send(str)`` and
``receive() -> str`` (the WebSocket route uses Quart's):

- controller → agent ``{"type": "welcome", "node_id", "connection_id",
  "heartbeat_interval", "lease_duration"}`` once, first;
- agent → controller ``{"type": "heartbeat", "snapshot": {...}, "attempts": [...]}``;
- controller → agent ``{"type": "renew", "duration": seconds}`` from a task of its
  own, every third of the lease, so no slow request can delay a renewal;
- controller → agent ``{"type": "command", "request_id", "op", ...}`` (see
  :mod:`~ficc_core.contributors.link`), answered by agent → controller
  ``{"type": "reply", "request_id", "ok", ...}``;
- both ways ``{"type": "relay", ...}`` and binary frames: relayed endpoint streams
  (see :mod:`~ficc_core.contributors.relay`);
- controller → agent ``{"type": "fenced"}`` or ``{"type": "error", "code", "message"}``
  just before the controller closes the connection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from ..auth import secrets as sec
from ..errors import FiccError, InvalidRequest
from ..schema import ExecutorSnapshot, Fence, SchemaError, structure, unstructure
from .assignments import Reconciliation
from .errors import ConnectionFenced
from .link import NodeLink, raise_for_reply
from .registry import NodeRegistry
from .relay import RelayEndpoint

log = logging.getLogger("ficc.contributors")

#: The largest message an agent may send (a snapshot with many runtimes and attempts).
MAX_MESSAGE = 1 << 20


class MessageChannel(Protocol):
    """What a node connection runs over."""

    async def send(self, data: str | bytes) -> None:
        """Send one text (str) or binary (bytes) message."""

    async def receive(self) -> str | bytes:
        """Receive one message."""


class ConnectionLink:
    """Commands to a remote node over its connection, each matched to its reply by ID."""

    def __init__(self, channel: MessageChannel, *, timeout: float = 60.0) -> None:
        self.channel = channel
        self.timeout = timeout
        self._pending: dict[str, list[Any]] = {}
        self._closed = False
        #: The node's endpoint action, relayed over this connection.
        self.endpoint = RelayEndpoint(channel.send)

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one command and wait (bounded) for its reply."""
        if self._closed:
            raise NodeGone("the node's connection closed", code="node_unavailable", status=409)
        request_id = sec.new_id()
        slot: list[Any] = [trio.Event()]
        self._pending[request_id] = slot
        try:
            await self.channel.send(
                json.dumps({**message, "type": "command", "request_id": request_id})
            )
            with trio.fail_after(self.timeout):
                await slot[0].wait()
        except trio.TooSlowError:
            raise NodeGone(
                f"the node did not answer {message.get('op')!r} within {self.timeout:g} s",
                code="node_timeout",
                status=504,
            ) from None
        finally:
            self._pending.pop(request_id, None)
        if len(slot) == 1:
            raise NodeGone("the node's connection closed", code="node_unavailable", status=409)
        return raise_for_reply(slot[1])

    def deliver(self, message: dict[str, Any]) -> None:
        """Hand a reply to the command waiting for it (unknown IDs are dropped)."""
        slot = self._pending.get(str(message.get("request_id")))
        if slot is not None and len(slot) == 1:
            slot.append(message)
            slot[0].set()

    def close(self) -> None:
        """Fail every waiting command: peer loss ends them without replay."""
        self._closed = True
        for slot in self._pending.values():
            slot[0].set()
        self.endpoint.close()


class NodeGone(FiccError):
    """The node could not answer a command: its connection closed or it timed out."""


def _attempts(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise InvalidRequest("attempts must be a list", code="bad_heartbeat")
    found = []
    for item in value:
        if not isinstance(item, dict):
            raise InvalidRequest("each attempt must be an object", code="bad_heartbeat")
        try:
            found.append(
                {
                    "attempt_id": str(item["attempt_id"])[:128],
                    "generation": int(item["generation"]),
                    "plan_digest": str(item["plan_digest"])[:80],
                    "provider": str(item["provider"])[:64],
                    "state": str(item["state"])[:32],
                }
            )
        except (KeyError, TypeError, ValueError):
            raise InvalidRequest(
                "an attempt needs attempt_id, generation, plan_digest, provider and state",
                code="bad_heartbeat",
            ) from None
    return found


async def serve_node_connection(
    registry: NodeRegistry,
    node_id: str,
    channel: MessageChannel,
    *,
    heartbeat_interval: float,
    lease_duration: float,
) -> None:
    """Serve one authenticated node connection until it ends, is fenced out or fails."""
    link = ConnectionLink(channel)
    # What the controller wanted before this connection: reconciled with the first report.
    known = await registry.wanted_attempt_ids(node_id)
    reconciled = False
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
                    }
                )
            )

            async def renew() -> None:
                while True:
                    await channel.send(json.dumps({"type": "renew", "duration": lease_duration}))
                    await trio.sleep(lease_duration / 3)

            nursery.start_soon(renew)
            await nursery.start(link.endpoint.run)
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
                    raise InvalidRequest("messages must be JSON", code="bad_heartbeat") from None
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
                    snapshot = structure(message.get("snapshot"), ExecutorSnapshot, what="snapshot")
                except SchemaError as exc:
                    raise InvalidRequest(exc.message, code="bad_heartbeat") from None
                attempts = _attempts(message.get("attempts", []))
                await registry.heartbeat(node_id, connection_id, snapshot, attempts)
                if not reconciled:
                    reconciled = True
                    result = await registry.reconcile(node_id, connection_id, attempts, known)
                    _log_reconciliation(node_id, result)
                    if result.stop:
                        nursery.start_soon(_stop_unwanted, link, node_id, result.stop)
        except ConnectionFenced:
            pass  # said in the finally block below
        except FiccError as exc:
            log.warning("node %s: %s [%s]", node_id, exc.message, exc.code)
            await _last_word(channel, {"type": "error", "code": exc.code, "message": exc.message})
        finally:
            link.close()
            if registry.replaced(node_id, connection_id):
                await _last_word(channel, {"type": "fenced"})
            registry.disconnect(node_id, connection_id)
            nursery.cancel_scope.cancel()


def _log_reconciliation(node_id: str, result: Reconciliation) -> None:
    if result.adopted or result.stop or result.missing:
        log.info(
            "node %s reconnected: adopted %s, stopping %s, no longer running %s",
            node_id,
            list(result.adopted),
            [fence.attempt_id for fence in result.stop],
            list(result.missing),
        )


async def _stop_unwanted(link: NodeLink, node_id: str, fences: Sequence[Fence]) -> None:
    """Stop, through the node, the attempts a reconciliation does not want."""
    for fence in fences:
        try:
            await link.call({"op": "stop", "fence": unstructure(fence)})
        except FiccError as exc:
            log.warning(
                "node %s: could not stop unwanted attempt %s: %s",
                node_id,
                fence.attempt_id,
                exc.message,
            )


async def _last_word(channel: MessageChannel, message: dict[str, Any]) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(1):
        try:
            await channel.send(json.dumps(message))
        except Exception:  # the peer may already be gone; nothing more to say then
            pass
