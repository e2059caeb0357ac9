"""The typed protocol every executor provider implements.

Hooks only register provider *classes* (``ficc_register_executor_providers``); a
node agent instantiates one with its configuration, starts it with
``await nursery.start(provider.run)`` and then awaits the methods below. Every
call that concerns an attempt carries its :class:`~ficc_core.schema.Fence`: an
unknown attempt ID raises :class:`UnknownAttempt`, a known ID with another
generation or plan digest raises :class:`StaleFence`.

Optional (API 1, so providers without it keep working; agents look it up with
``getattr``): ``hold(fence, seconds) -> None``, called on every lease grant and
renewal with the seconds the attempt's lease now runs. It must not block. A
provider that has it stops the engine on the node once the last lease passes with
the agent's process gone (:class:`SupervisingProvider` does, with a watchdog).
It is not a member of the protocol class, so ``isinstance`` checks of providers
written before it still pass.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import trio

from .types import AttemptStatus, ReadEvent

if TYPE_CHECKING:
    from ..schema import ExecutorSnapshot, Fence, Job, ResourceLimits, Runtime

__all__ = ["EndpointAction", "ExecutorProvider", "Headers"]

#: Request headers as the endpoint action takes them: pairs, or a mapping.
Headers = Sequence[tuple[str, str]] | Mapping[str, str]


@runtime_checkable
class EndpointAction(Protocol):
    """The fenced endpoint action: ``open`` a stream to an attempt's engine, ``read``, ``cancel``.

    A provider implements it (:class:`ExecutorProvider` includes it, and
    :class:`~ficc_core.executor.EndpointStreams` does the work for the built-in
    ones); so does the node agent (it routes to the attempt's provider) and a
    remote node's relay (:class:`~ficc_core.nodelink.relay_controller.RelayEndpoint`).
    A gateway holds one per node and never connects to an engine itself.
    """

    async def open(
        self,
        fence: Fence,
        stream_id: str,
        method: str,
        path: str,
        headers: Headers,
        body: bytes,
        *,
        input_id: str | None = None,
    ) -> None:
        """Send one request to the engine through the endpoint contract.

        With ``input_id`` (and an empty ``body``), the executor streams that admitted
        input's file as the body: the engine's native model-blob upload route.
        """
        ...

    async def read(self, fence: Fence, stream_id: str) -> ReadEvent:
        """Return the stream's next event: the head, a body chunk, then the end or an error."""
        ...

    async def cancel(self, fence: Fence, stream_id: str) -> None:
        """Close the stream's engine connection at once."""
        ...


@runtime_checkable
class ExecutorProvider(EndpointAction, Protocol):
    """What an executor provider class declares and what its instances do.

    Besides the methods below, the endpoint action (:class:`EndpointAction`):
    ``open``, ``read``, ``cancel``.
    """

    #: Must be 1, the plugin API version.
    API_VERSION: ClassVar[int]
    #: The executor name runtimes bind (``process``, ``container``, ...).
    name: ClassVar[str]

    def __init__(self, *, state_dir: str | os.PathLike[str], node_id: str, **options: Any) -> None:
        """The node agent builds each provider with its node's configuration: a state
        directory of its own, the node's ID, and options its kind takes."""
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Clean up what an earlier run left, report started, then serve until cancelled.

        Cancelling it stops every attempt it launched (no orphans).
        """
        ...

    async def snapshot(self) -> ExecutorSnapshot:
        """Describe the node: resources, installed runtimes, isolation, endpoint version."""
        ...

    async def launch(
        self,
        job: Job,
        fence: Fence,
        *,
        limits: ResourceLimits | None = None,
        runtime: Runtime | None = None,
    ) -> AttemptStatus:
        """Start ``job`` as the attempt ``fence`` names, isolated and limited.

        Returns at once with state ``starting``; readiness is probed in the background.
        Raises :class:`IsolationUnavailable` when network isolation cannot be ensured.
        """
        ...

    async def status(self, fence: Fence) -> AttemptStatus:
        """Return where the attempt stands."""
        ...

    async def wait_ready(self, fence: Fence) -> AttemptStatus:
        """Wait until the attempt is ready or has ended; return its status."""
        ...

    async def stop(self, fence: Fence, grace: float = 10.0) -> AttemptStatus:
        """Stop the attempt: SIGTERM (or equivalent), ``grace`` seconds, then kill."""
        ...

    async def logs(self, fence: Fence, tail: int = 100) -> list[str]:
        """Return the last ``tail`` lines of the attempt's bounded log."""
        ...

    def follow_logs(self, fence: Fence, tail: int | None = None) -> AsyncGenerator[str, None]:
        """Yield the attempt's log lines as they are written, until it ends.

        Every line from the start, or with ``tail`` only the last ``tail`` lines there
        are when it starts, then the new ones (none missed or repeated between).
        """
        ...
