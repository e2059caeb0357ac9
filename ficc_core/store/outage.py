"""Living through a store outage: what counts as one, one log line per outage, a bounded backoff.

The controller keeps serving while the database is down (docs/operations.md, "When
the database is down"): the gateway from memory, and every background loop (the
reconciler's drivers, the node registry's heartbeats and sweep, the autoscaler,
acquisitions, event retention) waits and tries again instead of ending ``ficc serve``.
:func:`is_store_failure` says whether an exception is such an outage (not a defect);
:class:`OutageLog` says so once per outage, not once per loop turn, and once more when
the store answers again; :class:`Backoff` is the wait between tries.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable

import attrs
import trio

from ..base.errors import StoreUnavailable

__all__ = [
    "OUTAGE_BACKOFF_CAP",
    "Backoff",
    "OutageLog",
    "RefusalLog",
    "as_store_unavailable",
    "is_store_failure",
]

#: The longest wait between two tries of a loop the store failed, in seconds: short
#: enough that work resumes within seconds of the store's return.
OUTAGE_BACKOFF_CAP = 5.0
#: The first wait after a failure, in seconds (doubling up to the cap).
OUTAGE_BACKOFF_FIRST = 0.25

log = logging.getLogger("ficc.store")

#: What SQLite's ``OperationalError`` says when the database cannot be used right now.
_SQLITE_UNAVAILABLE = (
    "locked",
    "busy",
    "disk i/o",
    "unable to open",
    "readonly",
    "disk is full",
    "interrupted",
)


def is_store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the store is down or slow (retry later), not a defect.

    :class:`~ficc_core.base.errors.StoreUnavailable` (both backends raise it when the
    database cannot be reached or a connection cannot be had in time), SQLite's
    ``OperationalError`` when it says the file cannot be used now (locked, busy, an
    I/O error, unopenable, read-only, full), and an exception group made only of
    those (a nursery whose tasks all met the outage).
    """
    if isinstance(exc, BaseExceptionGroup):
        return all(is_store_failure(inner) for inner in exc.exceptions)
    if isinstance(exc, sqlite3.OperationalError):
        # Only what says the file cannot be used now; "no such column" is a defect.
        return any(word in str(exc).lower() for word in _SQLITE_UNAVAILABLE)
    return isinstance(exc, StoreUnavailable)


def as_store_unavailable(exc: BaseException) -> StoreUnavailable:
    """The 503 ``store_unavailable`` refusal for a store failure (see :func:`is_store_failure`)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, StoreUnavailable):
        return exc
    return StoreUnavailable(f"the store failed ({type(exc).__name__}); retry shortly")


@attrs.define
class Backoff:
    """A capped exponential wait: ``first`` seconds, doubling up to ``cap``."""

    first: float = OUTAGE_BACKOFF_FIRST
    cap: float = OUTAGE_BACKOFF_CAP
    delay: float = 0.0

    async def wait(self) -> None:
        """Wait the current delay, then double it (up to the cap)."""
        self.delay = min(self.cap, max(self.first, self.delay * 2))
        await trio.sleep(self.delay)

    def reset(self) -> None:
        """The store answered: the next failure waits ``first`` again."""
        self.delay = 0.0


@attrs.define
class OutageLog:
    """One warning when ``component`` first meets a store failure, one line when the store
    answers it again; the failures between are counted, not logged.

    :param component: what is waiting (``"the reconciler"``), for the log lines.
    :param on_failure: called with each failure (a metric's ``inc``, say).
    """

    component: str
    on_failure: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.monotonic
    logger: logging.Logger = log
    #: Failures since the store last answered (0: it answers).
    failures: int = 0
    #: When the current outage began (``clock``), while there is one.
    since: float | None = None

    @property
    def failing(self) -> bool:
        """Whether the last try failed."""
        return self.failures > 0

    def failed(self, exc: BaseException, what: str = "") -> None:
        """Note one failed try (logged only when it starts an outage)."""
        self.failures += 1
        self.on_failure()
        if self.failures == 1:
            self.since = self.clock()
            doing = f" ({what})" if what else ""
            self.logger.warning(
                "the store failed for %s%s: %s; it goes on from memory and tries again "
                "(logged once until the store answers)",
                self.component,
                doing,
                _describe(exc),
            )

    def answered(self) -> None:
        """Note a try that went through (logs the outage's end, if there was one)."""
        if self.failures:
            lasted = self.clock() - (self.since if self.since is not None else self.clock())
            self.logger.warning(
                "the store answers %s again (after %d failed tries over %.1f s)",
                self.component,
                self.failures,
                lasted,
            )
        self.failures = 0
        self.since = None


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {message}"


@attrs.define
class RefusalLog:
    """Requests refused 503 ``store_unavailable``: one log line per ``every`` seconds
    with how many were refused since the last, instead of one line per request."""

    every: float = 30.0
    clock: Callable[[], float] = time.monotonic
    logger: logging.Logger = log
    #: Refusals not yet told in a log line.
    untold: int = 0
    _logged_at: float = -float("inf")

    def refused(self, exc: BaseException, what: str) -> None:
        """Note one request refused because the store failed (``what``: the route)."""
        self.untold += 1
        now = self.clock()
        if now - self._logged_at >= self.every:
            self.logger.warning(
                "the store is unavailable: %d request(s) refused 503 store_unavailable "
                "(the latest %s: %s)",
                self.untold,
                what,
                _describe(exc),
            )
            self._logged_at, self.untold = now, 0
