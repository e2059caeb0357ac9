"""Watching an invoke request's client, once the request has lasted or streams.

While a request waits (in a band's queue, for an activation, for an engine's whole
answer) or is relayed, its client may go away: then everything the handler awaits is
cancelled, and so is the engine request, whose slot is freed at once, not when the
engine would have finished. Noticing that takes a task that waits on the ASGI
``receive`` for ``http.disconnect``: nothing else tells a handler its client left.

Spawning that task for every request, and cancelling it when the handler is done,
cost about a tenth of the gateway's CPU per request (docs/performance.md), and most
requests to a fast engine are answered before a client leaving them could matter.
So :class:`ClientWatch` arms a request's watcher only when the request is still
running :data:`GRACE` seconds after its body was read; a client that left before
then is noticed then (its ``http.disconnect`` waits in the request's queue). One
scheduler task per server does the arming, waking at most every ``GRACE / 2``. A
streamed response is watched from its head on (:meth:`Watcher.relay`): a stream
lasts, and one its client closes early frees its slot at once.

Without the scheduler (an application served without its ASGI lifespan, as a test
client may), each request's watcher starts with it, in a nursery of its own.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from ..gateway import ResponseChunks

log = logging.getLogger("ficc.api")

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

#: Seconds a request runs before its client is watched. A client that leaves is
#: noticed at most this late (plus the scheduler's tick, half of it), so a request
#: whose client left holds its slot that much longer at most.
GRACE = 0.1


class Watcher:
    """One request's watch over its client, from its body's end until the handler is
    done: when the client goes away (or, once a response exists, at its send deadline:
    the client stopped reading), the handler's scope is cancelled."""

    __slots__ = (
        "_clients",
        "_deadline",
        "_scope",
        "done",
        "handler",
        "left",
        "receive",
        "response",
    )

    def __init__(
        self, receive: Receive, handler: trio.CancelScope, clients: ClientWatch | None = None
    ) -> None:
        self.receive = receive
        self.handler = handler
        self._clients = clients
        self.left = False
        self.done = False
        self._deadline = float("inf")
        #: The watching task's scope, once it is armed.
        self._scope: trio.CancelScope | None = None
        #: The stream being relayed, closed here at the send deadline.
        self.response: ResponseChunks | None = None

    def until(self, deadline: float) -> None:
        """Stop waiting for the client at ``deadline`` (the response's send deadline)."""
        self._deadline = deadline
        if self._scope is not None:
            self._scope.deadline = deadline

    def relay(self, response: ResponseChunks) -> None:
        """``response`` is streamed: watch from now on (a stream lasts; a client that
        closes one early is noticed at once, not after the grace)."""
        self.response = response
        if self._scope is None and self._clients is not None:
            self._clients.now(self)

    def arm(self) -> trio.CancelScope:
        """The scope the watching task runs in (set before it starts, so that
        :meth:`finish` can cancel a task that has not run yet)."""
        self._scope = trio.CancelScope(deadline=self._deadline)
        return self._scope

    def finish(self) -> None:
        """The handler is done: stop watching (a task armed but not yet run never waits)."""
        self.done = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self) -> None:
        scope = self._scope
        assert scope is not None
        with scope:
            try:
                while (await self.receive())["type"] != "http.disconnect":
                    pass
            except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the server dropped the connection: nobody to answer either
            except Exception:  # never the scheduler's end: this request goes unwatched
                log.warning("watching a request's client failed", exc_info=True)
                return
            self.left = True
        if self.done:
            return
        self.handler.cancel()
        if scope.cancelled_caught and self.response is not None:
            # hypercorn shields its socket writes, so a send blocked on a client that
            # stopped reading is not cancelled: free the slot here, not after it.
            log.info("response cut at its send deadline: the client stopped reading")
            with trio.CancelScope(shield=True):
                try:
                    await self.response.aclose()
                except Exception:
                    log.warning("closing a response at its send deadline failed", exc_info=True)


class ClientWatch:
    """Arms the watchers of requests that last longer than :data:`GRACE` (see the module)."""

    def __init__(self, grace: float = GRACE) -> None:
        self.grace = grace
        self._pending: deque[tuple[float, Watcher]] = deque()
        self._nursery: trio.Nursery | None = None
        self._wake: trio.Event | None = None
        self._stop = trio.CancelScope()

    def stop(self) -> None:
        """End :meth:`run` (the watchers it armed are cancelled with it)."""
        self._stop.cancel()

    @property
    def running(self) -> bool:
        return self._nursery is not None

    def watching(self, receive: Receive) -> Watching:
        """``async with`` around a handler's work: it yields the request's
        :class:`Watcher`, and the work is cancelled when the watcher sees the client go."""
        return Watching(self, receive)

    def now(self, watcher: Watcher) -> None:
        """Watch ``watcher``'s client from now on (when it is not watched yet)."""
        nursery = self._nursery
        if nursery is not None and not watcher.done:
            watcher.arm()
            nursery.start_soon(watcher.run)

    def _add(self, watcher: Watcher) -> None:
        self._pending.append((trio.current_time() + self.grace, watcher))
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Arm the watchers that are due, until cancelled or :meth:`stop`."""
        try:
            with self._stop:
                await self._arm(task_status)
        finally:
            self._nursery = None
            self._wake = None
            self._pending.clear()

    async def _arm(self, task_status: trio.TaskStatus[None]) -> None:
        pending = self._pending
        tick = self.grace / 2
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                if not pending:
                    self._wake = wake = trio.Event()
                    await wake.wait()
                    continue
                now = trio.current_time()
                while pending and (pending[0][1].done or pending[0][0] <= now):
                    _, watcher = pending.popleft()
                    if not watcher.done and watcher._scope is None:
                        watcher.arm()
                        nursery.start_soon(watcher.run)
                if pending:
                    await trio.sleep_until(max(pending[0][0], now + tick))


class Watching:
    """The context of :meth:`ClientWatch.watching`: a cancel scope around the handler's
    work, registered for arming; without the scheduler, a nursery with the watcher in it."""

    __slots__ = ("_nursery", "_scope", "clients", "receive", "watcher")

    def __init__(self, clients: ClientWatch, receive: Receive) -> None:
        self.clients = clients
        self.receive = receive
        self._nursery: Any = None
        self._scope: trio.CancelScope | None = None

    async def __aenter__(self) -> Watcher:
        if self.clients.running:
            self._scope = scope = trio.CancelScope()
            scope.__enter__()
            self.watcher = Watcher(self.receive, scope, self.clients)
            self.clients._add(self.watcher)
        else:
            self._nursery = trio.open_nursery()
            nursery = await self._nursery.__aenter__()
            self.watcher = Watcher(self.receive, nursery.cancel_scope)
            self.watcher.arm()
            nursery.start_soon(self.watcher.run)
        return self.watcher

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self.watcher.finish()
        if self._scope is not None:
            return self._scope.__exit__(exc_type, exc, tb)
        return bool(await self._nursery.__aexit__(exc_type, exc, tb))
