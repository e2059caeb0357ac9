"""The scaling series of on-demand services (docs/inference.md, "Scaling"): activations
and scaling decisions."""

from __future__ import annotations

import prometheus_client as prom


class ScalingMetrics:
    """The autoscaler's collectors, registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.activations = prom.Counter(
            "ficc_activations",
            "Activations of idle on-demand services, by service and outcome (started, "
            "no_capacity, failed: the woken replica failed).",
            ("service", "outcome"),
            registry=registry,
        )
        self.scaling_decisions = prom.Counter(
            "ficc_scaling_decisions",
            "Scaling decisions, by service, direction (out, in) and reason (activation, "
            "queue, wait, idle, pin).",
            ("service", "direction", "reason"),
            registry=registry,
        )
        self.scaling_replicas = prom.Gauge(
            "ficc_scaling_replicas",
            "Replicas a scaled service runs now (its active placements), by service.",
            ("service",),
            registry=registry,
        )
