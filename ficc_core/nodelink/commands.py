"""The node's end of commands: run one controller command on the node's agent.

A command is a JSON object with an ``op`` (``launch``, ``stop``, ``status``,
``logs``) and its arguments in wire form; :func:`run_command` answers ``{"ok":
true, "status": {...}}`` (``logs``: ``{"ok": true, "lines": [...]}``, the newest
lines that fit :data:`~ficc_core.nodelink.wire.MAX_LOG_REPLY`), or ``{"ok": false,
"error": {...}}`` with the refusal (:func:`~ficc_core.nodelink.wire.error_to_wire`).
Following a log is a relayed stream (:mod:`~ficc_core.nodelink.relay_node`), not a
command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import FiccError
from ..schema import Fence, Job, ResourceLimits, Runtime, structure
from .wire import error_to_wire, log_lines, status_to_wire

if TYPE_CHECKING:
    from ..executor.types import AttemptStatus


class CommandTarget(Protocol):
    """What commands run on: the node agent (:class:`~ficc_core.agent.Agent`)."""

    #: Seconds between SIGTERM and SIGKILL when a stop names none.
    stop_grace: float

    async def launch(
        self,
        provider: str,
        job: Job,
        fence: Fence,
        *,
        limits: ResourceLimits | None = None,
        runtime: Runtime | None = None,
        blobs: Mapping[str, int] | None = None,
        directories: Mapping[str, Mapping[str, tuple[str, int]]] | None = None,
    ) -> AttemptStatus:
        """Launch the job as the fenced attempt on the named provider."""
        ...

    async def stop(self, fence: Fence, grace: float | None = None) -> AttemptStatus:
        """Stop the attempt."""
        ...

    async def status(self, fence: Fence) -> AttemptStatus:
        """Where the attempt stands."""
        ...

    async def logs(self, fence: Fence, tail: int = 100) -> list[str]:
        """The last ``tail`` lines of the attempt's log (also once it ended)."""
        ...


async def run_command(target: CommandTarget, message: dict[str, Any]) -> dict[str, Any]:
    """Run one command on ``target``; return its reply (refusals become ``ok: false``)."""
    try:
        op = message.get("op")
        fence = structure(message.get("fence"), Fence, what="fence")
        if op == "launch":
            limits = message.get("limits")
            runtime = message.get("runtime")
            status = await target.launch(
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
            status = await target.stop(fence, float(message.get("grace", target.stop_grace)))
        elif op == "status":
            status = await target.status(fence)
        elif op == "logs":
            tail = message.get("tail", 100)
            if not isinstance(tail, int) or isinstance(tail, bool) or tail < 0:
                raise FiccError("tail must be a whole number", code="bad_command", status=400)
            return {"ok": True, "lines": log_lines(await target.logs(fence, tail))}
        else:
            raise FiccError(f"unknown command {op!r}", code="unknown_command", status=400)
    except FiccError as exc:
        return {"ok": False, "error": error_to_wire(exc)}
    return {"ok": True, "status": status_to_wire(status)}
