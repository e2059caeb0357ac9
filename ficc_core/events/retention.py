"""Bounded retention: events older than a period, or beyond a count per service, go.

Pruning runs in its own write on a period (:meth:`EventRetention.run`), never on
the request path: an event is written with its change and nothing more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from ..store import Store
from ..store.outage import OutageLog, is_store_failure
from . import repository

log = logging.getLogger("ficc.events.retention")


class EventRetention:
    """Deletes events past ``retention`` seconds, and all but each service's newest
    ``max_per_service`` (and each node's newest as many of its own).

    :param period: seconds between prunes.
    :param clock: seconds since the epoch (tests pass their own).
    """

    def __init__(
        self,
        store: Store,
        *,
        retention: float,
        max_per_service: int,
        period: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.retention = retention
        self.max_per_service = max(1, max_per_service)
        self.period = period
        self.clock = clock
        #: Store failures of prunes (one warning per outage).
        self.outage = OutageLog("event retention", logger=log)

    async def prune(self) -> int:
        """Delete what is past the bounds now; return how many events went."""
        before = self.clock() - self.retention
        return await self.store.write(
            lambda tx: repository.prune(tx, before=before, keep=self.max_per_service)
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Prune at once, then every ``period`` seconds, until cancelled."""
        task_status.started()
        while True:
            try:
                deleted = await self.prune()
            except Exception as exc:  # a failed prune is retried on the next period
                if is_store_failure(exc):
                    self.outage.failed(exc, "pruning events")
                else:
                    log.exception("cannot prune the events")
            else:
                self.outage.answered()
                if deleted:
                    log.debug("pruned %d events", deleted)
            await trio.sleep(self.period)


__all__ = ["EventRetention"]
