"""Prometheus metrics of one controller, in a registry of its own (no global state but
prometheus_client's switch that leaves out the ``*_created`` series)."""

from __future__ import annotations

import prometheus_client as prom


class Metrics:
    """The controller's collectors; ``render()`` produces the exposition text."""

    def __init__(self) -> None:
        # No ``*_created`` series: each would double its counter's or histogram's family
        # with a timestamp no dashboard reads (Prometheus sees a reset by itself). The
        # switch is prometheus_client's, for the whole process: FICC never wants them.
        prom.disable_created_metrics()
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
        self.login_lockouts = prom.Counter(
            "ficc_login_lockouts",
            "Login locks after repeated wrong passwords, by the limit reached "
            "(user_address, address or user).",
            ("limit",),
            registry=self.registry,
        )

        # -- the inference gateway (per service, and per replica: its attempt ID) -----------
        latency = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
        self.gateway_requests = prom.Counter(
            "ficc_gateway_requests",
            "Inference requests relayed to a replica, by service and replica.",
            ("service", "replica"),
            registry=self.registry,
        )
        self.gateway_errors = prom.Counter(
            "ficc_gateway_errors",
            "Inference requests refused or ended by an error, by service, replica "
            "(empty before one was chosen) and error code.",
            ("service", "replica", "code"),
            registry=self.registry,
        )
        self.gateway_retries = prom.Counter(
            "ficc_gateway_retries",
            "Requests moved to another replica before their first byte, by service and "
            "the replica that failed.",
            ("service", "replica"),
            registry=self.registry,
        )
        self.gateway_inflight = prom.Gauge(
            "ficc_gateway_inflight_requests",
            "Inference requests being served now, by service and replica.",
            ("service", "replica"),
            registry=self.registry,
        )
        self.gateway_queued = prom.Gauge(
            "ficc_gateway_queued_requests",
            "Inference requests waiting for a free replica slot, by service.",
            ("service",),
            registry=self.registry,
        )
        self.gateway_queue_wait = prom.Histogram(
            "ficc_gateway_queue_wait_seconds",
            "Time a request waited for a free replica slot, by service.",
            ("service",),
            registry=self.registry,
            buckets=(0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.gateway_ttft = prom.Histogram(
            "ficc_gateway_time_to_first_byte_seconds",
            "From admission to the first response body byte, by service and replica.",
            ("service", "replica"),
            registry=self.registry,
            buckets=latency,
        )
        self.gateway_duration = prom.Histogram(
            "ficc_gateway_request_duration_seconds",
            "From admission to the end of the response, by service and replica.",
            ("service", "replica"),
            registry=self.registry,
            buckets=latency,
        )
        self.gateway_tokens = prom.Counter(
            "ficc_gateway_tokens",
            "Tokens the engines reported in responses' usage, by service, replica and "
            "kind (prompt or completion).",
            ("service", "replica", "kind"),
            registry=self.registry,
        )
        # -- the project endpoint (docs/gateway.md#the-project-endpoint) --
        self.gateway_fallbacks = prom.Counter(
            "ficc_gateway_fallbacks",
            "Project-endpoint requests a fallback served because the service their model "
            "named could not, by that service and the fallback that served.",
            ("service", "fallback"),
            registry=self.registry,
        )

        # -- gateway resilience: breakers, timeouts, refusals before a replica (docs/gateway.md)
        self.gateway_breaker_state = prom.Gauge(
            "ficc_gateway_breaker_state",
            "A replica's breaker: 0 closed, 1 open (out of the pool for its cooldown), "
            "2 half-open (one request may try it), by service and replica.",
            ("service", "replica"),
            registry=self.registry,
        )
        self.gateway_breaker_opens = prom.Counter(
            "ficc_gateway_breaker_opens",
            "Times a replica's breaker opened after consecutive failures, by service and replica.",
            ("service", "replica"),
            registry=self.registry,
        )
        self.gateway_timeouts = prom.Counter(
            "ficc_gateway_timeouts",
            "Engine waits that ran past their bound, by service, replica and the bound "
            "(timeout_dial, timeout_response_header, timeout_generation, timeout_first_token, "
            "timeout_idle).",
            ("service", "replica", "bound"),
            registry=self.registry,
        )
        self.gateway_tokenize = prom.Counter(
            "ficc_gateway_tokenize_calls",
            "Prompts whose length the safe bounds could not settle, counted by the engine's "
            "tokenizer route, by service and outcome (counted, or fallback when the engine "
            "could not answer in time).",
            ("service", "outcome"),
            registry=self.registry,
        )

        # -- priority bands (docs/priority.md): per service and band ------------------------
        self.gateway_band_waiting = prom.Gauge(
            "ficc_gateway_band_waiting_requests",
            "Inference requests waiting for a replica slot, by service and band.",
            ("service", "band"),
            registry=self.registry,
        )
        self.gateway_band_queue_wait = prom.Histogram(
            "ficc_gateway_band_queue_wait_seconds",
            "Time a request waited for its first replica slot (0 when one was free), by "
            "service and band.",
            ("service", "band"),
            registry=self.registry,
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
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        # Not counted for a request that found a slot free (the queue wait histogram's
        # count is every request): the hot path pays for no second counter.
        self.gateway_band_granted = prom.Counter(
            "ficc_gateway_band_granted",
            "Freed slots handed to a waiting request, by service, band and how: priority "
            "(the highest band that may take it) or share (a band owed its minimum share).",
            ("service", "band", "via"),
            registry=self.registry,
        )
        self.gateway_band_refusals = prom.Counter(
            "ficc_gateway_band_refusals",
            "Requests refused while asking for a slot, by service, band and code "
            "(service_saturated: the band's queue was full; no_ready_replica: it waited "
            "past the queue TTL or no replica was left).",
            ("service", "band", "code"),
            registry=self.registry,
        )

        # -- routing: engine load scraped, and how replicas were chosen (docs/routing.md) ----
        per_replica = ("service", "replica")
        self.routing_scraped_running = prom.Gauge(
            "ficc_gateway_engine_running_requests",
            "Requests a replica's engine said it was generating for at its last scrape.",
            per_replica,
            registry=self.registry,
        )
        self.routing_scraped_waiting = prom.Gauge(
            "ficc_gateway_engine_waiting_requests",
            "Requests a replica's engine said it held in its own queue at its last scrape.",
            per_replica,
            registry=self.registry,
        )
        self.routing_scraped_kv = prom.Gauge(
            "ficc_gateway_engine_kv_cache_usage_ratio",
            "KV cache use (0 to 1) a replica's engine reported at its last scrape, where it "
            "reports one.",
            per_replica,
            registry=self.registry,
        )
        self.routing_scrape_age = prom.Gauge(
            "ficc_gateway_engine_scrape_age_seconds",
            "Seconds since a replica's engine load was last read (or since it joined); over "
            "scrape_stale_after the replica is scored as stale.",
            per_replica,
            registry=self.registry,
        )
        self.routing_scrape_failures = prom.Counter(
            "ficc_gateway_engine_scrape_failures",
            "Reads of a replica engine's /metrics that failed (timeout, error, not 200).",
            per_replica,
            registry=self.registry,
        )
        # -- liveness of ready replicas (docs/inference.md) ---------------------------------
        self.liveness_misses = prom.Counter(
            "ficc_replica_liveness_misses",
            "Liveness probes of a ready replica's engine that got no answer in "
            "liveness_timeout (or a 5xx, or a failed stream), by service and replica.",
            per_replica,
            registry=self.registry,
        )
        self.liveness_unresponsive = prom.Gauge(
            "ficc_replica_unresponsive",
            "1 while a replica is out of routing for missing liveness_misses probes in a "
            "row (until it answers again or is restarted), by service and replica.",
            per_replica,
            registry=self.registry,
        )
        self.liveness_unresponsive_seconds = prom.Histogram(
            "ficc_replica_unresponsive_seconds",
            "How long replicas were out of routing as unresponsive, by service and how it "
            "ended (answered: put back; restarted; ended: the attempt ended otherwise).",
            ("service", "outcome"),
            registry=self.registry,
            buckets=(1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
        )
        self.routing_decisions = prom.Counter(
            "ficc_gateway_routing_decisions",
            "How the gateway chose each request's replica, by service and reason: session "
            "(its session's replica), prefix (the replica holding its prompt's prefix), "
            "score (the lowest score), balanced (affinity abandoned by the imbalance guard).",
            ("service", "reason"),
            registry=self.registry,
        )

        # -- quotas (docs/limits.md) -------------------------------------------------------
        self.quota_sync_failures = prom.Counter(
            "ficc_quota_sync_failures",
            "Syncs of this process's rate-limit and budget counts with the store that failed "
            "(counting went on in memory; the counts are written at the next that succeeds).",
            registry=self.registry,
        )
        # -- usage accounting (docs/usage.md#accounting) --
        self.usage_buffered = prom.Gauge(
            "ficc_usage_buffered_records",
            "Usage records waiting to be written to the store, summary rows included.",
            registry=self.registry,
        )
        self.usage_aggregated = prom.Counter(
            "ficc_usage_aggregated",
            "Usage records folded into a summary row (per credential, service, model, outcome "
            "and minute) because the buffer was full: their totals are kept, not their detail.",
            registry=self.registry,
        )
        self.usage_dropped = prom.Counter(
            "ficc_usage_dropped",
            "Usage records lost because the buffer and its summary rows were full.",
            registry=self.registry,
        )
        self.usage_write_failures = prom.Counter(
            "ficc_usage_write_failures",
            "Usage writes the store refused or failed; their batch is kept and retried.",
            registry=self.registry,
        )
        # -- on-demand services and scaling (docs/inference.md, "Scaling") --
        self.activations = prom.Counter(
            "ficc_activations",
            "Activations of idle on-demand services, by service and outcome (started, "
            "no_capacity, failed: the woken replica failed).",
            ("service", "outcome"),
            registry=self.registry,
        )
        self.activation_waiting = prom.Gauge(
            "ficc_activation_waiting",
            "Requests waiting for their service's activation now, by service.",
            ("service",),
            registry=self.registry,
        )
        self.activation_wait = prom.Histogram(
            "ficc_activation_wait_seconds",
            "How long requests waited for an activation, by service and outcome (served, "
            "timeout, failed, left).",
            ("service", "outcome"),
            registry=self.registry,
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
        )
        self.scaling_decisions = prom.Counter(
            "ficc_scaling_decisions",
            "Scaling decisions, by service, direction (out, in) and reason (activation, "
            "queue, wait, idle, pin).",
            ("service", "direction", "reason"),
            registry=self.registry,
        )
        self.scaling_replicas = prom.Gauge(
            "ficc_scaling_replicas",
            "Replicas a scaled service runs now (its active placements), by service.",
            ("service",),
            registry=self.registry,
        )

        # -- state, read from the store (ficc_core/inference/state_metrics.py) -------------
        def gauge(name: str, text: str, labels: tuple[str, ...]) -> prom.Gauge:
            return prom.Gauge(name, text, labels, registry=self.registry)

        self.service_state = gauge(
            "ficc_service_state",
            "1 for each inference service's current state (stopped, starting, ready, "
            "degraded, failed, idle, ...), by service ID, alias and project.",
            ("service", "alias", "project", "state"),
        )
        self.service_replicas = gauge(
            "ficc_service_replicas",
            "An inference service's replicas: desired (its placements) and ready.",
            ("service", "alias", "kind"),
        )
        self.replica_state = gauge(
            "ficc_replica_state",
            "1 for each replica's current state, by service, alias, placement index and node.",
            ("service", "alias", "index", "node", "state"),
        )
        self.replica_info = gauge(
            "ficc_replica_info",
            "1 per running attempt: joins the gateway's per-replica series (replica = attempt "
            "ID) to its service alias, placement index and node.",
            ("service", "replica", "alias", "index", "node"),
        )
        self.node_state = gauge(
            "ficc_node_state",
            "1 for each contributor node's state (registered, connected, unreachable, lost, "
            "revoked).",
            ("node", "state"),
        )
        self.node_heartbeat_age = gauge(
            "ficc_node_heartbeat_age_seconds",
            "Seconds since a node's last recorded heartbeat.",
            ("node",),
        )
        self.node_cpus = gauge(
            "ficc_node_cpus", "A node's CPU cores: capacity and reserved.", ("node", "kind")
        )
        self.node_memory = gauge(
            "ficc_node_memory_bytes", "A node's memory: capacity and reserved.", ("node", "kind")
        )
        self.node_gpu_memory = gauge(
            "ficc_node_gpu_memory_bytes",
            "Each GPU's memory on a node: total, reserved by replicas, and free as the "
            "driver last reported it.",
            ("node", "gpu", "kind"),
        )
        self.transfer_bytes = gauge(
            "ficc_model_transfer_bytes",
            "Model files being uploaded or acquired: bytes durably received and the size, "
            "by model and file index (gone once verified).",
            ("model", "file", "kind"),
        )
        self.controller_leader = gauge(
            "ficc_controller_leader",
            "1 while this controller holds the leader lease (it places work), 0 on a standby.",
            ("controller",),
        )
        self.controller_term = gauge(
            "ficc_controller_term",
            "The leader lease's fencing term this controller last saw.",
            ("controller",),
        )
        self.quota_budget_used = gauge(
            "ficc_quota_budget_used_ratio",
            "The share of a budget spent in its current period (1: spent; requests are "
            "refused past it), by scope (credential, project, user) and subject ID.",
            ("scope", "subject"),
        )
        self.gateway_output_rate = prom.Histogram(
            "ficc_gateway_output_tokens_per_second",
            "Completion tokens per second of generation (from the first byte to the end), by "
            "service and replica.",
            ("service", "replica"),
            registry=self.registry,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
        )

    def remove_replica(self, service: str, replica: str) -> None:
        """Remove every per-replica series of ``replica`` (an attempt ID) of ``service``."""
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

    def render(self) -> tuple[bytes, str]:
        """Return the exposition body and its content type."""
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
