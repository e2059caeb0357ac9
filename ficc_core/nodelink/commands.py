"""The node's end of commands: run one controller command on the node's agent.

A command is a JSON object with an ``op`` (``launch``, ``stop``, ``status``,
``logs``) and its arguments in wire form; :func:`run_command` answers ``{"ok":
true, "status": {...}}`` (``logs``: ``{"ok": true, "lines": [...]}``, the newest
lines that fit :data:`~ficc_core.nodelink.wire.MAX_LOG_REPLY`), or ``{"ok": false,
"error": {...}}`` with the refusal (:func:`~ficc_core.nodelink.wire.error_to_wire`).
Following a log is a relayed stream (:mod:`~ficc_core.nodelink.relay_node`), not a
command.

Commands are fenced by the sender's leader term (``"term"``, 0 when absent): a
``launch`` or ``stop`` below the highest term the node has seen is refused
:class:`~ficc_core.nodelink.wire.StaleTerm` and runs nothing, and a higher one
raises that term (durably, before the command runs) so every older leader is
refused from then on. ``status`` and ``logs`` change nothing and are answered for
any term.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..base.errors import FiccError
from ..schema import Fence, Job, ResourceLimits, Runtime, structure
from .wire import StaleTerm, error_to_wire, log_lines, message_term, status_to_wire

if TYPE_CHECKING:
    from ..executor.types import AttemptStatus


class CommandTarget(Protocol):
    """What commands run on: the node agent (:class:`~ficc_core.agent.Agent`)."""

    #: Seconds between SIGTERM and SIGKILL when a stop names none.
    stop_grace: float

    @property
    def term_seen(self) -> int:
        """The highest leader term a command or renewal has carried here."""
        ...

    async def doctor(self) -> list[dict[str, Any]]:
        """``ficc doctor``'s findings about this node, as JSON objects."""
        ...

    async def see_term(self, term: int) -> None:
        """Raise :attr:`term_seen` to ``term`` (a higher one) and keep it across restarts."""
        ...

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
        origin: str | None = None,
        term: int | None = None,
    ) -> AttemptStatus:
        """Launch the job as the fenced attempt on the named provider.

        ``origin`` is the base URL of the controller that sent the launch (inputs
        this node lacks are fetched from it first); None in-process. ``term`` is the
        sender's leader term, checked again once the inputs are staged.
        """
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


#: The commands that change what runs, and so are refused from a superseded leader.
FENCED_OPS = frozenset({"launch", "stop"})


async def admit_term(target: CommandTarget, term: int) -> None:
    """Refuse ``term`` below the target's :attr:`~CommandTarget.term_seen`; raise it to a
    higher one."""
    if term < target.term_seen:
        raise StaleTerm(term=term, current=target.term_seen)
    if term > target.term_seen:
        await target.see_term(term)


async def run_command(
    target: CommandTarget, message: dict[str, Any], *, origin: str | None = None
) -> dict[str, Any]:
    """Run one command on ``target``; return its reply (refusals become ``ok: false``).

    ``origin`` is the base URL of the controller the command came from (a remote
    agent's link says; None in-process).
    """
    try:
        op = message.get("op")
        if op == "doctor":
            # What the node finds about itself (ficc doctor's checks), and its clock.
            return {"ok": True, "findings": await target.doctor(), "time": time.time()}
        term = message_term(message)
        fence = structure(message.get("fence"), Fence, what="fence")
        if op in FENCED_OPS:
            await admit_term(target, term)
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
                origin=origin,
                term=term,
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
        return {"ok": False, "error": error_to_wire(exc, details=True)}
    return {"ok": True, "status": status_to_wire(status)}
