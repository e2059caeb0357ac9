"""The HTTP API's series (every route's requests and time to the response head), and what
the metrics endpoints need of the one registry that holds every package's series."""

from __future__ import annotations

from typing import Protocol

import prometheus_client as prom


class Exposition(Protocol):
    """The controller's registry as ``/metrics`` serves it."""

    def render(self) -> tuple[bytes, str]:
        """Return the exposition body and its content type."""
        ...


class HttpMetrics:
    """The API's collectors, registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.http_requests = prom.Counter(
            "ficc_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ("route", "method", "status"),
            registry=registry,
        )
        self.http_duration = prom.Histogram(
            "ficc_http_request_duration_seconds",
            "Time to produce the response head, by route template.",
            ("route",),
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
        )
