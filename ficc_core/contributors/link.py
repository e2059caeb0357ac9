"""How the controller sends commands to a node: one interface, local or over a connection.

A command is a JSON object with an ``op`` (``launch``, ``stop``, ``status``) and
its arguments in wire form; the reply is ``{"ok": true, "status": {...}}`` or
``{"ok": false, "error": {"code", "message", "status"}}``. The embedded agent
answers in-process (:class:`LocalNodeLink`); a remote one answers over its
WebSocket (:class:`~ficc_core.contributors.connection.ConnectionLink`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ..errors import FiccError

if TYPE_CHECKING:
    from ..agent import Agent
    from ..executor.types import AttemptStatus, ReadEvent
    from ..schema import Fence


class NodeEndpoint(Protocol):
    """A node's endpoint action: the same ``open`` / ``read`` / ``cancel`` as a provider's.

    The embedded agent is its own; a remote node's is relayed over its connection
    (:class:`~ficc_core.contributors.relay.RelayEndpoint`).
    """

    async def open(
        self,
        fence: Fence,
        stream_id: str,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]] | Mapping[str, str],
        body: bytes,
        *,
        input_id: str | None = None,
    ) -> None:
        """Open a stream to the attempt's engine."""

    async def read(self, fence: Fence, stream_id: str) -> ReadEvent:
        """The stream's next event."""

    async def cancel(self, fence: Fence, stream_id: str) -> None:
        """Close the stream."""


class NodeLink(Protocol):
    """Carries one command to a node and returns its reply (raising the node's error)."""

    #: The node's endpoint action.
    endpoint: NodeEndpoint

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Run ``message`` on the node; return the reply of a successful command."""


def status_to_wire(status: AttemptStatus) -> dict[str, Any]:
    """An :class:`AttemptStatus` as JSON."""
    document = attrs.asdict(status)
    document["log_tail"] = list(status.log_tail)
    return document


def status_from_wire(document: dict[str, Any]) -> AttemptStatus:
    """An :class:`AttemptStatus` from its JSON."""
    from ..executor.types import AttemptStatus

    return AttemptStatus(**{**document, "log_tail": tuple(document.get("log_tail", ()))})


def raise_for_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """Return a successful reply; raise the node's error for a failed one."""
    if reply.get("ok"):
        return reply
    from .relay import error_from_wire

    # As its own class (StaleFence, UnknownAttempt...) when it is one: callers catch by class.
    raise error_from_wire(reply.get("error") or {"message": "the node refused the command"})


async def run_command(agent: Agent, message: dict[str, Any]) -> dict[str, Any]:
    """Run one command on ``agent``; return its reply (errors become ``ok: false``)."""
    from ..schema import Fence, Job, ResourceLimits, Runtime, structure

    try:
        op = message.get("op")
        fence = structure(message.get("fence"), Fence, what="fence")
        if op == "launch":
            limits = message.get("limits")
            runtime = message.get("runtime")
            status = await agent.launch(
                str(message.get("provider")),
                structure(message.get("job"), Job, what="job"),
                fence,
                limits=None if limits is None else structure(limits, ResourceLimits),
                runtime=None if runtime is None else structure(runtime, Runtime),
                blobs=structure(message.get("blobs") or {}, dict[str, int], what="blobs"),
                directories=structure(
                    message.get("directories") or {},
                    dict[str, dict[str, tuple[str, int]]],
                    what="directories",
                ),
            )
        elif op == "stop":
            status = await agent.stop(fence, float(message.get("grace", agent.stop_grace)))
        elif op == "status":
            status = await agent.status(fence)
        else:
            raise FiccError(f"unknown command {op!r}", code="unknown_command", status=400)
    except FiccError as exc:
        return {
            "ok": False,
            "error": {"code": exc.code, "message": exc.message, "status": exc.status},
        }
    return {"ok": True, "status": status_to_wire(status)}


class LocalNodeLink:
    """The embedded agent's link: commands run in this process, no wire between."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        #: The endpoint action: the agent's own, called directly.
        self.endpoint: NodeEndpoint = agent

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Run ``message`` on the local agent."""
        return raise_for_reply(await run_command(self.agent, message))
