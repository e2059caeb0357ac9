"""The controller's metrics: its own series (the leader lease), and :class:`Metrics`, the one
registry the assembly builds and hands to every package as that package's own series.

Each package declares its series beside its code (``api/metrics.py``, ``auth/metrics.py``,
``gateway/metrics.py``, ``inference/reconciliation/metrics.py``,
``inference/scaling/metrics.py``, ``quotas/metrics.py``, ``usage/metrics.py``); a
component takes its package's class, which :class:`Metrics` is, so that it neither sees
nor imports another package's series. No global state but prometheus_client's switch that
leaves out the ``*_created`` series.
"""

from __future__ import annotations

import prometheus_client as prom

from ..api.metrics import HttpMetrics
from ..auth.metrics import AuthMetrics
from ..gateway.metrics import GatewayMetrics
from ..inference.reconciliation.metrics import ReconciliationMetrics
from ..inference.scaling.metrics import ScalingMetrics
from ..quotas.metrics import QuotaMetrics
from ..usage.metrics import UsageMetrics


class ControllerMetrics:
    """The controller's own collectors (the leader lease), registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.controller_leader = prom.Gauge(
            "ficc_controller_leader",
            "1 while this controller holds the leader lease (it places work), 0 on a standby.",
            ("controller",),
            registry=registry,
        )
        self.controller_term = prom.Gauge(
            "ficc_controller_term",
            "The leader lease's fencing term this controller last saw.",
            ("controller",),
            registry=registry,
        )


class Metrics(
    HttpMetrics,
    AuthMetrics,
    GatewayMetrics,
    ReconciliationMetrics,
    QuotaMetrics,
    UsageMetrics,
    ScalingMetrics,
    ControllerMetrics,
):
    """Every package's collectors in one registry of this controller's own; ``render()``
    produces the exposition text."""

    def __init__(self) -> None:
        # No ``*_created`` series: each would double its counter's or histogram's family
        # with a timestamp no dashboard reads (Prometheus sees a reset by itself). The
        # switch is prometheus_client's, for the whole process: FICC never wants them.
        prom.disable_created_metrics()
        self.registry = prom.CollectorRegistry()
        HttpMetrics.__init__(self, self.registry)
        AuthMetrics.__init__(self, self.registry)
        GatewayMetrics.__init__(self, self.registry)
        ReconciliationMetrics.__init__(self, self.registry)
        QuotaMetrics.__init__(self, self.registry)
        UsageMetrics.__init__(self, self.registry)
        ScalingMetrics.__init__(self, self.registry)
        ControllerMetrics.__init__(self, self.registry)

    def render(self) -> tuple[bytes, str]:
        """Return the exposition body and its content type."""
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
