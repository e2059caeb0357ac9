"""Usage accounting: every invoke request's tokens, cost and latency, kept in the store.

The gateway hands each finished (or refused) request's
:class:`~ficc_core.usage.records.UsageRecord` to :meth:`UsageLedger.record`, a synchronous
O(1) append to a bounded buffer: nothing on the request path touches the store. A
background task writes the buffer every ``usage_flush_interval``, at most
``usage_batch_size`` records per transaction, and at once when a batch is full.

The store being slow or down never blocks a request (docs/usage.md#accounting):

- a failed write keeps its batch for the next try, which waits longer each time
  (up to :data:`MAX_BACKOFF` seconds); failures are counted and logged;
- beyond ``usage_buffer_size`` records, a record is folded into a summary row of its
  credential, service, replica, model, outcome and minute (requests, tokens and cost
  summed, times averaged), so totals stay right while the detail is lost;
- beyond as many summary rows, a record is dropped; drops are counted in
  ``ficc_usage_dropped`` and logged at most once per :data:`LOG_EVERY` seconds.

With a spool (:mod:`.spool`, the controller's), each record is also appended to a
file as it is made, so a SIGKILLed controller's buffer is replayed at the next start
(:meth:`UsageLedger.replay`); each row carries its ``record_id`` and is written once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Hashable
from functools import partial
from itertools import islice
from operator import attrgetter
from typing import Any

import attrs
import prometheus_client as prom
import trio

from ..store import Store, Transaction
from . import repository
from .metrics import UsageMetrics
from .records import UsageRecord, UsageSummary
from .report import UsageQuery, UsageReport, usage_report
from .spool import UsageSpool

log = logging.getLogger("ficc.inference.usage")

#: A record's values in a usage row's column order. The row is its values: no other
#: object per request.
_values = attrgetter(*repository.USAGE_FIELDS)
#: Seconds one summary row covers (its ``finished_at`` is the start of that minute).
SUMMARY_PERIOD = 60
#: The longest wait between tries after failed writes, in seconds.
MAX_BACKOFF = 30.0
#: Seconds between two log lines about aggregated or dropped records.
LOG_EVERY = 60.0
#: Seconds the last write at shutdown may take (between batches).
SHUTDOWN_WAIT = 5.0


@attrs.define(slots=True)
class _Summary:
    """Records of one (credential, service, replica, model, outcome, status, path, minute)
    folded into one row."""

    first: UsageRecord
    period: int
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: int = 0
    queue_wait: float = 0.0
    ttfb: float = 0.0
    ttfbs: int = 0
    duration: float = 0.0

    def add(self, usage: UsageRecord) -> None:
        self.requests += 1
        self.prompt_tokens += usage.prompt_tokens or 0
        self.completion_tokens += usage.completion_tokens or 0
        self.cost += usage.cost
        self.queue_wait += usage.queue_wait
        self.duration += usage.duration
        if usage.ttfb is not None:
            self.ttfb += usage.ttfb
            self.ttfbs += 1

    def merge(self, other: _Summary) -> None:
        for name in ("requests", "prompt_tokens", "completion_tokens", "cost", "ttfbs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.queue_wait += other.queue_wait
        self.ttfb += other.ttfb
        self.duration += other.duration

    def entry(self) -> UsageRecord:
        """The summary row: the first record's service, credential, replica, model,
        outcome, status and path, the sums and means of them all, at the minute's start."""
        n = self.requests
        return attrs.evolve(
            self.first,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            queue_wait=self.queue_wait / n,
            ttfb=self.ttfb / self.ttfbs if self.ttfbs else None,
            duration=self.duration / n,
            finished_at=float(self.period),
            cost=self.cost,
            requests=n,
        )


def _summary_key(usage: UsageRecord) -> tuple[Hashable, ...]:
    return (
        usage.credential_id,
        usage.service_id,
        usage.replica,
        usage.model,
        usage.outcome,
        usage.status,
        usage.path,
        int(usage.finished_at) // SUMMARY_PERIOD * SUMMARY_PERIOD,
    )


def _insert(records: list[Any], tx: Transaction) -> None:
    """Write pending rows (a record's values, 1 request, its ``record_id``) in one
    transaction, as one batch; a row already stored (a replayed spool's) is skipped."""
    repository.insert_usage_records(tx, records)


#: A pending row's values: :data:`repository.USAGE_FIELDS`, then the ``record_id``.
_ROW_WIDTH = len(repository.USAGE_FIELDS) + 1


class UsageLedger:
    """Buffers usage records and writes them to the store in batches (see the module docs).

    :param store: where ``inference_usage`` rows go.
    :param period: seconds between batch writes (``usage_flush_interval``).
    :param batch_size: records written per transaction; a full batch is written at once.
    :param capacity: records held while waiting for a write (``usage_buffer_size``), and
        summary rows held beyond them.
    :param metrics: the controller's collectors (default: a registry of its own).
    :param spool: where each record is also appended as it is made (opened), so a
        killed controller's buffer survives it; None keeps records in memory only.
    """

    def __init__(
        self,
        store: Store,
        *,
        period: float = 1.0,
        batch_size: int = 500,
        capacity: int = 100_000,
        metrics: UsageMetrics | None = None,
        spool: UsageSpool | None = None,
    ) -> None:
        self.store = store
        self.spool = spool
        self.period = period
        self.batch_size = batch_size
        self.capacity = capacity
        metrics = UsageMetrics(prom.CollectorRegistry()) if metrics is None else metrics
        self._buffered = metrics.usage_buffered
        self._aggregated = metrics.usage_aggregated
        self._dropped = metrics.usage_dropped
        self._write_failures = metrics.usage_write_failures
        # Rows: a record's values, 1 request and its ``record_id`` (None without a spool).
        self._pending: deque[tuple[Any, ...]] = deque()
        self._summaries: dict[tuple[Hashable, ...], _Summary] = {}
        self._wake = trio.Event()
        self._lock = trio.Lock()
        self._logged_at = -LOG_EVERY
        #: Records folded into summary rows, and records dropped, since the start.
        self.aggregated = 0
        self.dropped = 0
        #: Writes failed in a row (0 once one succeeds).
        self.failures = 0

    def record(self, usage: UsageRecord) -> None:
        """Queue one request's usage (called by the gateway; O(1), never blocks)."""
        spool, pending = self.spool, self._pending
        if spool is None:
            row = (*_values(usage), None)
        else:  # on disk before anything else: a kill from here on loses nothing
            row = (*_values(usage), spool.next_id())
            spool.append(row)
        if len(pending) < self.capacity:
            pending.append(row)
            if len(pending) >= self.batch_size:
                self._wake.set()
            return
        key = _summary_key(usage)
        summary = self._summaries.get(key)
        if summary is None:
            if len(self._summaries) >= self.capacity:
                self.dropped += 1
                self._dropped.inc()
                self._note("dropped")
                return
            summary = self._summaries[key] = _Summary(first=usage, period=key[-1])  # type: ignore[arg-type]
        summary.add(usage)
        self.aggregated += 1
        self._aggregated.inc()
        self._note("aggregated")

    def _note(self, what: str) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            log.warning(
                "the usage buffer is full (%d records, the store is behind): %d records "
                "aggregated into %d summary rows and %d dropped since the start (this one %s)",
                len(self._pending),
                self.aggregated,
                len(self._summaries),
                self.dropped,
                what,
            )

    @property
    def buffered(self) -> int:
        """Records and summary rows waiting to be written."""
        return len(self._pending) + len(self._summaries)

    async def flush(self) -> int:
        """Write every queued record now, a batch per transaction; return how many.

        A failed write raises and keeps its batch (and everything after it) queued.
        """
        async with self._lock:
            if self.spool is not None:
                await self.spool.seal()
            try:
                written = await self._write_all()
            finally:
                self._buffered.set(self.buffered)
            if self.spool is not None:  # what the sealed segments hold is stored
                await self.spool.drop_sealed()
            return written

    async def _write_all(self) -> int:
        written, pending = 0, self._pending
        while pending:
            batch = list(islice(pending, self.batch_size))
            await self.store.write(partial(_insert, batch))
            for _ in batch:
                pending.popleft()
            written += len(batch)
        if not self._summaries:
            return written
        summaries, self._summaries = self._summaries, {}
        keys = list(summaries)
        try:
            for start in range(0, len(keys), self.batch_size):
                chunk = keys[start : start + self.batch_size]
                entries = [summaries[key].entry() for key in chunk]
                await self.store.write(partial(repository.insert_usage, entries=entries))
                for key in chunk:
                    written += summaries.pop(key).requests
        finally:
            # What was not written goes back, beside what was folded meanwhile.
            for key, summary in summaries.items():
                newer = self._summaries.get(key)
                if newer is None:
                    self._summaries[key] = summary
                else:
                    summary.merge(newer)
                    self._summaries[key] = summary
        return written

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the buffer every ``period`` seconds (or once a batch is full) until
        cancelled, then write the rest; a failure never ends it (see the module docs)."""
        task_status.started()
        try:
            while True:
                if self.failures:
                    await trio.sleep(min(self.period * 2**self.failures, MAX_BACKOFF))
                else:
                    with trio.move_on_after(self.period):
                        await self._wake.wait()
                self._wake = trio.Event()
                await self._try_flush()
        finally:
            with trio.move_on_after(SHUTDOWN_WAIT) as scope:
                scope.shield = True
                await self._try_flush()
                if self.spool is not None:  # what is left is replayed at the next start
                    await trio.to_thread.run_sync(
                        partial(self.spool.close, remove=not self.buffered)
                    )

    async def replay(self) -> int:
        """Write the records of the spools whose controller is gone (killed before it
        wrote them) and delete those spools; return how many rows were replayed (those
        already stored are skipped). A spool the store refuses is kept for the next
        start. Called at start and when this controller takes the lead."""
        if self.spool is None:
            return 0
        try:
            orphans = await trio.to_thread.run_sync(self.spool.orphans)
        except OSError as exc:
            log.warning("cannot look for usage spools to replay: %s", exc)
            return 0
        replayed = 0
        for orphan in orphans:
            try:
                rows = await trio.to_thread.run_sync(orphan.rows, _ROW_WIDTH)
                for start in range(0, len(rows), self.batch_size):
                    batch = rows[start : start + self.batch_size]
                    await self.store.write(partial(_insert, batch))
            except Exception as exc:  # the store is down: the next start tries again
                await trio.to_thread.run_sync(orphan.release)
                log.warning("cannot replay the usage spool %s (kept): %s", orphan.name, exc)
                continue
            await trio.to_thread.run_sync(orphan.remove)
            replayed += len(rows)
            log.info("replayed %d usage records of the spool %s", len(rows), orphan.name)
        return replayed

    async def _try_flush(self) -> None:
        try:
            await self.flush()
        except Exception as exc:  # the store is slow, down or closing: keep the records
            self.failures += 1
            self._write_failures.inc()
            if self.failures == 1 or self.failures % 10 == 0:
                log.warning(
                    "cannot write usage records (%d failures in a row, %d waiting): %s",
                    self.failures,
                    self.buffered,
                    exc,
                )
        else:
            if self.failures:
                log.info("usage records are written again after %d failures", self.failures)
            self.failures = 0

    async def summary(
        self, service_id: str, *, since: float | None = None, recent: int = 50
    ) -> UsageSummary:
        """Totals, per-credential totals and the latest requests of one service."""
        await self._try_flush()
        return await self.store.read(
            lambda tx: repository.usage_summary(tx, service_id, since, recent)
        )

    async def report(self, query: UsageQuery) -> UsageReport:
        """The usage ``query`` selects, what is buffered written first (when the store takes it)."""
        await self._try_flush()
        return await self.store.read(partial(usage_report, query=query))
