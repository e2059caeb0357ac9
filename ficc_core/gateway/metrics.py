"""The gateway's series: requests relayed per service and replica, queues and priority
bands, breakers and timeouts, engine load scraped and routing decisions."""

from __future__ import annotations

from typing import Any

import prometheus_client as prom


class GatewayMetrics:
    """The gateway's collectors, registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        # -- per service, and per replica: its attempt ID ----------------------------------
        latency = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
        self.gateway_requests = prom.Counter(
            "ficc_gateway_requests",
            "Inference requests relayed to a replica, by service and replica.",
            ("service", "replica"),
            registry=registry,
        )
        self.gateway_errors = prom.Counter(
            "ficc_gateway_errors",
            "Inference requests refused or ended by an error, by service, replica "
            "(empty before one was chosen) and error code.",
            ("service", "replica", "code"),
            registry=registry,
        )
        self.gateway_retries = prom.Counter(
            "ficc_gateway_retries",
            "Requests moved to another replica before their first byte, by service and "
            "the replica that failed.",
            ("service", "replica"),
            registry=registry,
        )
        self.gateway_inflight = prom.Gauge(
            "ficc_gateway_inflight_requests",
            "Inference requests being served now, by service and replica.",
            ("service", "replica"),
            registry=registry,
        )
        self.gateway_queued = prom.Gauge(
            "ficc_gateway_queued_requests",
            "Inference requests waiting for a free replica slot, by service.",
            ("service",),
            registry=registry,
        )
        self.gateway_queue_wait = prom.Histogram(
            "ficc_gateway_queue_wait_seconds",
            "Time a request waited for a free replica slot, by service.",
            ("service",),
            registry=registry,
            buckets=(0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.gateway_ttft = prom.Histogram(
            "ficc_gateway_time_to_first_byte_seconds",
            "From admission to the first response body byte, by service and replica.",
            ("service", "replica"),
            registry=registry,
            buckets=latency,
        )
        self.gateway_duration = prom.Histogram(
            "ficc_gateway_request_duration_seconds",
            "From admission to the end of the response, by service and replica.",
            ("service", "replica"),
            registry=registry,
            buckets=latency,
        )
        self.gateway_tokens = prom.Counter(
            "ficc_gateway_tokens",
            "Tokens the engines reported in responses' usage, by service, replica and "
            "kind (prompt or completion).",
            ("service", "replica", "kind"),
            registry=registry,
        )
        # -- the project endpoint (docs/gateway.md#the-project-endpoint) --
        self.gateway_fallbacks = prom.Counter(
            "ficc_gateway_fallbacks",
            "Project-endpoint requests a fallback served because the service their model "
            "named could not, by that service and the fallback that served.",
            ("service", "fallback"),
            registry=registry,
        )

        # -- resilience: breakers, timeouts, refusals before a replica (docs/gateway.md) ---
        self.gateway_breaker_state = prom.Gauge(
            "ficc_gateway_breaker_state",
            "A replica's breaker: 0 closed, 1 open (out of the pool for its cooldown), "
            "2 half-open (one request may try it), by service and replica.",
            ("service", "replica"),
            registry=registry,
        )
        self.gateway_breaker_opens = prom.Counter(
            "ficc_gateway_breaker_opens",
            "Times a replica's breaker opened after consecutive failures, by service and replica.",
            ("service", "replica"),
            registry=registry,
        )
        self.gateway_timeouts = prom.Counter(
            "ficc_gateway_timeouts",
            "Engine waits that ran past their bound, by service, replica and the bound "
            "(timeout_dial, timeout_response_header, timeout_generation, timeout_first_token, "
            "timeout_idle).",
            ("service", "replica", "bound"),
            registry=registry,
        )
        self.gateway_tokenize = prom.Counter(
            "ficc_gateway_tokenize_calls",
            "Prompts whose length the safe bounds could not settle, counted by the engine's "
            "tokenizer route, by service and outcome (counted, or fallback when the engine "
            "could not answer in time).",
            ("service", "outcome"),
            registry=registry,
        )

        # -- priority bands (docs/priority.md): per service and band ------------------------
        self.gateway_band_waiting = prom.Gauge(
            "ficc_gateway_band_waiting_requests",
            "Inference requests waiting for a replica slot, by service and band.",
            ("service", "band"),
            registry=registry,
        )
        self.gateway_band_queue_wait = prom.Histogram(
            "ficc_gateway_band_queue_wait_seconds",
            "Time a request waited for its first replica slot (0 when one was free), by "
            "service and band.",
            ("service", "band"),
            registry=registry,
            buckets=(
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ),
        )  # fmt: skip
        self.gateway_band_queue_position = prom.Histogram(
            "ficc_gateway_band_queue_position",
            "The place a request took when it joined the wait queue (1: next; counting "
            "the requests of its band and higher ones before it), by service and band.",
            ("service", "band"),
            registry=registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        # Not counted for a request that found a slot free (the queue wait histogram's
        # count is every request): the hot path pays for no second counter.
        self.gateway_band_granted = prom.Counter(
            "ficc_gateway_band_granted",
            "Freed slots handed to a waiting request, by service, band and how: priority "
            "(the highest band that may take it) or share (a band owed its minimum share).",
            ("service", "band", "via"),
            registry=registry,
        )
        self.gateway_band_refusals = prom.Counter(
            "ficc_gateway_band_refusals",
            "Requests refused while asking for a slot, by service, band and code "
            "(service_saturated: the band's queue was full; no_ready_replica: it waited "
            "past the queue TTL or no replica was left).",
            ("service", "band", "code"),
            registry=registry,
        )

        # -- routing: engine load scraped, and how replicas were chosen (docs/routing.md) ----
        per_replica = ("service", "replica")
        self.routing_scraped_running = prom.Gauge(
            "ficc_gateway_engine_running_requests",
            "Requests a replica's engine said it was generating for at its last scrape.",
            per_replica,
            registry=registry,
        )
        self.routing_scraped_waiting = prom.Gauge(
            "ficc_gateway_engine_waiting_requests",
            "Requests a replica's engine said it held in its own queue at its last scrape.",
            per_replica,
            registry=registry,
        )
        self.routing_scraped_kv = prom.Gauge(
            "ficc_gateway_engine_kv_cache_usage_ratio",
            "KV cache use (0 to 1) a replica's engine reported at its last scrape, where it "
            "reports one.",
            per_replica,
            registry=registry,
        )
        self.routing_scrape_age = prom.Gauge(
            "ficc_gateway_engine_scrape_age_seconds",
            "Seconds since a replica's engine load was last read (or since it joined); over "
            "scrape_stale_after the replica is scored as stale.",
            per_replica,
            registry=registry,
        )
        self.routing_scrape_failures = prom.Counter(
            "ficc_gateway_engine_scrape_failures",
            "Reads of a replica engine's /metrics that failed (timeout, error, not 200).",
            per_replica,
            registry=registry,
        )
        self.routing_decisions = prom.Counter(
            "ficc_gateway_routing_decisions",
            "How the gateway chose each request's replica, by service and reason: session "
            "(its session's replica), prefix (the replica holding its prompt's prefix), "
            "score (the lowest score), balanced (affinity abandoned by the imbalance guard).",
            ("service", "reason"),
            registry=registry,
        )

        # -- requests waiting for an on-demand service's activation (docs/inference.md) ----
        self.activation_waiting = prom.Gauge(
            "ficc_activation_waiting",
            "Requests waiting for their service's activation now, by service.",
            ("service",),
            registry=registry,
        )
        self.activation_wait = prom.Histogram(
            "ficc_activation_wait_seconds",
            "How long requests waited for an activation, by service and outcome (served, "
            "timeout, failed, left).",
            ("service", "outcome"),
            registry=registry,
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
        )
        self.gateway_output_rate = prom.Histogram(
            "ficc_gateway_output_tokens_per_second",
            "Completion tokens per second of generation (from the first byte to the end), by "
            "service and replica.",
            ("service", "replica"),
            registry=registry,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
        )

    def remove_replica(self, service: str, replica: str) -> None:
        """Remove every per-replica series of ``replica`` (an attempt ID) of ``service``."""
        family: Any
        for family in (
            self.gateway_requests,
            self.gateway_errors,
            self.gateway_retries,
            self.gateway_inflight,
            self.gateway_ttft,
            self.gateway_duration,
            self.gateway_tokens,
            self.gateway_timeouts,
            self.gateway_output_rate,
        ):
            # prometheus_client keeps a family's children by label values; no public
            # iteration exists, so its own mapping is read under its own lock.
            with family._lock:
                held = [labels for labels in family._metrics if labels[:2] == (service, replica)]
            for labels in held:
                family.remove(*labels)
