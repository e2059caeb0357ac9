"""The quotas' series (docs/limits.md): failed syncs, budgets spent."""

from __future__ import annotations

import prometheus_client as prom


class QuotaMetrics:
    """The quotas' collectors, registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.quota_sync_failures = prom.Counter(
            "ficc_quota_sync_failures",
            "Syncs of this process's rate-limit and budget counts with the store that failed "
            "(counting went on in memory; the counts are written at the next that succeeds).",
            registry=registry,
        )
        self.quota_budget_used = prom.Gauge(
            "ficc_quota_budget_used_ratio",
            "The share of a budget spent in its current period (1: spent; requests are "
            "refused past it), by scope (credential, project, user) and subject ID.",
            ("scope", "subject"),
            registry=registry,
        )
