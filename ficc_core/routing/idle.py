"""The replica-idle signal: the reconciler waits until the gateway has no request in
flight on an attempt.

A retiring attempt (a move's source, a rollout's previous generation) drains before it
stops. The gateway counts the requests in flight per attempt and serves
:class:`IdleSignal` with its wait when it is built; the reconciler only waits on it. The
assembly builds one and hands it to both, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

#: Returns once no request is in flight on one attempt.
WaitIdle = Callable[[str], Awaitable[None]]


async def idle_at_once(_attempt_id: str) -> None:
    """No gateway counts requests: nothing is in flight."""


class IdleSignal:
    """Whether an attempt has requests in flight, as the reconciler waits on it."""

    def __init__(self) -> None:
        self._wait: WaitIdle = idle_at_once

    def serve(self, wait_idle: WaitIdle | None) -> None:
        """Answer :meth:`wait` with ``wait_idle`` from now on (None: nothing is in flight)."""
        self._wait = idle_at_once if wait_idle is None else wait_idle

    async def wait(self, attempt_id: str) -> None:
        """Return once no request is in flight on ``attempt_id``."""
        await self._wait(attempt_id)


__all__ = ["IdleSignal", "WaitIdle", "idle_at_once"]
