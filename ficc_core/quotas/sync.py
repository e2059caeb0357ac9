"""Quotas across processes: every ``limits_sync_interval`` each process adds what it
counted to the store's counters and reads everyone's totals and the limit records back,
in one write transaction.

Processes sharing a store can together pass a limit by at most what the others admit
in one interval (``(processes - 1) x`` one process's admissions per interval) before
each sees the others' counts. The request path never waits on the store: a sync that
fails or is slow leaves the gate counting in memory; what it could not write is kept
for the next one (a window that no longer decides is dropped), a warning is logged
once per outage and ``ficc_quota_sync_failures`` counts each failed sync.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..config.prices import MILLI
from . import repository
from .meters import MINUTE, Pending, add

if TYPE_CHECKING:
    from .gate import Quotas
    from .metrics import QuotaMetrics

log = logging.getLogger("ficc.quotas")

__all__ = ["QuotaSync"]


class QuotaSync:
    """The background task that shares a :class:`~.gate.Quotas`' counts (module docs).

    :param interval: seconds between syncs (``limits_sync_interval``).
    """

    def __init__(self, quotas: Quotas, metrics: QuotaMetrics, *, interval: float) -> None:
        self.quotas = quotas
        self.metrics = metrics
        self.interval = interval
        #: Syncs that succeeded (tests wait on it).
        self.synced = 0
        #: Whether the last sync failed (one warning per outage).
        self.failing = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sync every ``interval`` until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            await self.sync()
            self.show_budgets()

    def show_budgets(self) -> None:
        """Set each budget's used share (spend over budget, of its current period)."""
        gauge = self.metrics.quota_budget_used
        for subject, (scope, budget, period) in list(self.quotas.budgets.items()):
            meter = self.quotas.meters.get(subject)
            if meter is None or budget <= 0:
                continue
            key = subject.partition(":")[2]
            gauge.labels(scope, key).set(meter.spent(period) / (budget * MILLI))

    def _collect(self, minute: int) -> Pending:
        quotas = self.quotas
        pending, quotas.pending = quotas.pending, {}
        for meter in quotas.meters.values():
            if meter.d_requests or meter.d_tokens:
                key = (meter.subject, "minute", meter.minute)
                add(pending, key, meter.d_requests, meter.d_tokens, 0)
                meter.d_requests = meter.d_tokens = 0
            if meter.d_day_spend:
                add(pending, (meter.subject, "day", meter.day), 0, 0, meter.d_day_spend)
                meter.d_day_spend = 0
            if meter.d_month_spend:
                add(pending, (meter.subject, "month", meter.month), 0, 0, meter.d_month_spend)
                meter.d_month_spend = 0
        return pending

    async def sync(self) -> bool:
        """One sync (see the module docs); whether it reached the store."""
        quotas = self.quotas
        now = quotas.clock()
        minute = int(now // MINUTE) * MINUTE
        day, month = quotas.periods.start("day", now), quotas.periods.start("month", now)
        pending = self._collect(minute)
        version = quotas.version
        try:
            counters, limits = await quotas.store.write(
                lambda tx: repository.sync(tx, pending, minute, day, month)
            )
        except Exception as exc:
            self._keep(pending, minute)
            self.metrics.quota_sync_failures.inc()
            if not self.failing:
                self.failing = True
                log.warning(
                    "quotas: the store did not take this process's counts (%s); counting "
                    "goes on in memory and they are written at the next sync that succeeds",
                    exc,
                )
            return False
        if self.failing:
            self.failing = False
            log.warning("quotas: the store takes this process's counts again")
        if version == quotas.version:
            quotas.replace_limits(limits)
        quotas.apply_counters(counters, now)
        self._prune(minute, day, month)
        self.synced += 1
        return True

    def _keep(self, pending: Pending, minute: int) -> None:
        """Hand ``pending`` back for the next sync, less the minutes that stopped deciding."""
        kept = self.quotas.pending
        for key, (requests, tokens, spend) in pending.items():
            if key[1] != "minute" or key[2] >= minute - MINUTE:
                add(kept, key, requests, tokens, spend)

    def _prune(self, minute: int, day: int, month: int) -> None:
        """Forget meters idle for two minutes with nothing in flight or to write, and no
        spend in the current day or month (``day``, ``month``: their starts)."""
        quotas = self.quotas
        stale = [
            subject
            for subject, meter in quotas.meters.items()
            if meter.minute < minute - MINUTE
            and not (
                meter.inflight
                or meter.d_requests
                or meter.d_tokens
                or meter.d_day_spend
                or meter.d_month_spend
            )
            and not (meter.day_spend and meter.day == day)
            and not (meter.month_spend and meter.month == month)
        ]
        for subject in stale:
            meter = quotas.meters.pop(subject)
            scope, _, key = subject.partition(":")
            quotas.forget(scope, key, meter)
