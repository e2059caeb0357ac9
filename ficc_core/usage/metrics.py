"""Usage accounting's series (docs/usage.md#accounting): the buffer and its losses."""

from __future__ import annotations

import prometheus_client as prom


class UsageMetrics:
    """Usage accounting's collectors, registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.usage_buffered = prom.Gauge(
            "ficc_usage_buffered_records",
            "Usage records waiting to be written to the store, summary rows included.",
            registry=registry,
        )
        self.usage_aggregated = prom.Counter(
            "ficc_usage_aggregated",
            "Usage records folded into a summary row (per credential, service, model, outcome "
            "and minute) because the buffer was full: their totals are kept, not their detail.",
            registry=registry,
        )
        self.usage_dropped = prom.Counter(
            "ficc_usage_dropped",
            "Usage records lost because the buffer and its summary rows were full.",
            registry=registry,
        )
        self.usage_write_failures = prom.Counter(
            "ficc_usage_write_failures",
            "Usage writes the store refused or failed; their batch is kept and retried.",
            registry=registry,
        )
