"""Prometheus metrics of one controller, in a registry of its own (no global state)."""

from __future__ import annotations

import prometheus_client as prom


class Metrics:
    """The controller's collectors; ``render()`` produces the exposition text."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.http_requests = prom.Counter(
            "ficc_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.http_duration = prom.Histogram(
            "ficc_http_request_duration_seconds",
            "Time to produce the response head, by route template.",
            ("route",),
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
        )

    def render(self) -> tuple[bytes, str]:
        """Return the exposition body and its content type."""
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
