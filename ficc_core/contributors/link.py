"""How the controller sends commands to a node: one interface, local or over a connection.

A command is a JSON object with an ``op`` (``launch``, ``stop``, ``status``) and
its arguments in wire form; the reply is ``{"ok": true, "status": {...}}`` or
``{"ok": false, "error": {"code", "message", "status"}}``. The embedded agent
answers in-process (:class:`LocalNodeLink`); a remote one answers over its
WebSocket (:class:`~ficc_core.contributors.connection.ConnectionLink`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ..errors import FiccError

if TYPE_CHECKING:
    from ..agent import Agent
    from ..executor.types import AttemptStatus


class NodeLink(Protocol):
    """Carries one command to a node and returns its reply (raising the node's error)."""

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
    error = reply.get("error") or {}
    raise FiccError(
        str(error.get("message", "the node refused the command")),
        code=str(error.get("code", "node_error")),
        status=int(error.get("status", 502)),
        details={"node_error": True},
    )


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

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Run ``message`` on the local agent."""
        return raise_for_reply(await run_command(self.agent, message))
