"""Usage accounting: every invoke request's tokens and latency, kept in the store.

The gateway hands each finished request's :class:`~ficc_core.gateway.UsageRecord`
to :meth:`UsageLedger.record`, a synchronous append to a bounded buffer: nothing
on the request path touches SQLite. A background task writes the buffer in one
transaction per second (and once more at shutdown). If the store falls behind by
more than the buffer holds, the oldest unwritten records are dropped and counted.
"""

from __future__ import annotations

import logging
from collections import deque

import attrs
import trio

from ..store import Store, Transaction
from . import repository
from .records import UsageEntry, UsageSummary

log = logging.getLogger("ficc.inference.usage")

#: What of a gateway's usage record is kept.
_ENTRY_FIELDS = tuple(field.name for field in attrs.fields(UsageEntry))


class UsageLedger:
    """Buffers usage records and writes them to the store in batches.

    :param store: where ``inference_usage`` rows go.
    :param period: seconds between batch writes.
    :param capacity: records held while waiting for a write; older ones are dropped.
    """

    def __init__(self, store: Store, *, period: float = 1.0, capacity: int = 100_000) -> None:
        self.store = store
        self.period = period
        self._pending: deque[UsageEntry] = deque(maxlen=capacity)
        self._wake = trio.Event()
        #: Records dropped because the buffer overflowed before a write.
        self.dropped = 0

    def record(self, usage: object) -> None:
        """Queue one request's usage (called by the gateway; never blocks).

        ``usage`` is the gateway's ``UsageRecord``, read by the fields of
        :class:`UsageEntry` (so this package does not import the gateway, which
        imports it).
        """
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append(UsageEntry(**{name: getattr(usage, name) for name in _ENTRY_FIELDS}))

    async def flush(self) -> int:
        """Write every queued record now; return how many were written."""
        if not self._pending:
            return 0
        batch = list(self._pending)
        self._pending.clear()

        def write(tx: Transaction) -> None:
            repository.insert_usage(tx, batch)

        await self.store.write(write)
        return len(batch)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches every ``period`` seconds until cancelled, then write the rest."""
        task_status.started()
        try:
            while True:
                await trio.sleep(self.period)
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.flush()
                except Exception:  # the store may already be closing
                    log.exception("could not write the last usage records")

    async def summary(
        self, service_id: str, *, since: float | None = None, recent: int = 50
    ) -> UsageSummary:
        """Totals, per-credential totals and the latest requests of one service."""
        await self.flush()
        return await self.store.read(
            lambda tx: repository.usage_summary(tx, service_id, since, recent)
        )
