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
from typing import TYPE_CHECKING, Any

import trio

from ..store import Store, Transaction

if TYPE_CHECKING:
    from ..gateway import UsageRecord

log = logging.getLogger("ficc.inference.usage")

_COLUMNS = (
    "service_id",
    "generation",
    "replica",
    "node_id",
    "credential_id",
    "path",
    "status",
    "outcome",
    "prompt_tokens",
    "completion_tokens",
    "queue_wait",
    "ttfb",
    "duration",
    "finished_at",
)
_INSERT = (
    f"INSERT INTO inference_usage ({', '.join(_COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in _COLUMNS)})"
)


class UsageLedger:
    """Buffers usage records and writes them to the store in batches.

    :param store: where ``inference_usage`` rows go.
    :param period: seconds between batch writes.
    :param capacity: records held while waiting for a write; older ones are dropped.
    """

    def __init__(self, store: Store, *, period: float = 1.0, capacity: int = 100_000) -> None:
        self.store = store
        self.period = period
        self._pending: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._wake = trio.Event()
        #: Records dropped because the buffer overflowed before a write.
        self.dropped = 0

    def record(self, usage: UsageRecord) -> None:
        """Queue one request's usage (called by the gateway; never blocks)."""
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append(tuple(getattr(usage, column) for column in _COLUMNS))

    async def flush(self) -> int:
        """Write every queued record now; return how many were written."""
        if not self._pending:
            return 0
        batch = list(self._pending)
        self._pending.clear()

        def write(tx: Transaction) -> None:
            for row in batch:
                tx.execute(_INSERT, row)

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
    ) -> dict[str, Any]:
        """Totals, per-credential totals and the latest requests of one service."""
        await self.flush()
        start = 0.0 if since is None else since

        def read(tx: Transaction) -> dict[str, Any]:
            totals = tx.fetch_one(
                "SELECT COUNT(*) AS requests,"
                " SUM(CASE WHEN outcome NOT IN ('ok', 'cancelled') THEN 1 ELSE 0 END) AS errors,"
                " COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,"
                " COALESCE(SUM(completion_tokens), 0) AS completion_tokens,"
                " AVG(ttfb) AS mean_ttfb, AVG(duration) AS mean_duration"
                " FROM inference_usage WHERE service_id = ? AND finished_at >= ?",
                (service_id, start),
            )
            by_credential = tx.fetch_all(
                "SELECT credential_id, COUNT(*) AS requests,"
                " COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,"
                " COALESCE(SUM(completion_tokens), 0) AS completion_tokens"
                " FROM inference_usage WHERE service_id = ? AND finished_at >= ?"
                " GROUP BY credential_id ORDER BY credential_id",
                (service_id, start),
            )
            latest = tx.fetch_all(
                f"SELECT {', '.join(_COLUMNS)} FROM inference_usage"
                " WHERE service_id = ? AND finished_at >= ? ORDER BY id DESC LIMIT ?",
                (service_id, start, recent),
            )
            return {
                "service_id": service_id,
                "since": since,
                "totals": {**totals, "errors": totals["errors"] or 0},
                "by_credential": by_credential,
                "recent": latest,
            }

        return await self.store.read(read)
