"""The reconciliation's series: ready replicas' liveness, and the state gauges
:class:`~.state_metrics.StateMetrics` keeps in step with the store (services, replicas,
nodes, model transfers)."""

from __future__ import annotations

import prometheus_client as prom


def _gauge(
    registry: prom.CollectorRegistry, name: str, text: str, labels: tuple[str, ...]
) -> prom.Gauge:
    return prom.Gauge(name, text, labels, registry=registry)


class ReconciliationMetrics:
    """The reconciliation's collectors, registered in ``registry``."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        # -- liveness of ready replicas (docs/inference.md) ---------------------------------
        per_replica = ("service", "replica")
        self.liveness_misses = prom.Counter(
            "ficc_replica_liveness_misses",
            "Liveness probes of a ready replica's engine that got no answer in "
            "liveness_timeout (or a 5xx, or a failed stream), by service and replica.",
            per_replica,
            registry=registry,
        )
        self.liveness_unresponsive = prom.Gauge(
            "ficc_replica_unresponsive",
            "1 while a replica is out of routing for missing liveness_misses probes in a "
            "row (until it answers again or is restarted), by service and replica.",
            per_replica,
            registry=registry,
        )
        self.liveness_unresponsive_seconds = prom.Histogram(
            "ficc_replica_unresponsive_seconds",
            "How long replicas were out of routing as unresponsive, by service and how it "
            "ended (answered: put back; restarted; ended: the attempt ended otherwise).",
            ("service", "outcome"),
            registry=registry,
            buckets=(1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
        )

        # -- state, read from the store (state_metrics.py) ---------------------------------
        self.service_state = _gauge(
            registry,
            "ficc_service_state",
            "1 for each inference service's current state (stopped, starting, ready, "
            "degraded, failed, idle, ...), by service ID, alias and project.",
            ("service", "alias", "project", "state"),
        )
        self.service_replicas = _gauge(
            registry,
            "ficc_service_replicas",
            "An inference service's replicas: desired (its placements) and ready.",
            ("service", "alias", "kind"),
        )
        self.replica_state = _gauge(
            registry,
            "ficc_replica_state",
            "1 for each replica's current state, by service, alias, placement index and node.",
            ("service", "alias", "index", "node", "state"),
        )
        self.replica_info = _gauge(
            registry,
            "ficc_replica_info",
            "1 per running attempt: joins the gateway's per-replica series (replica = attempt "
            "ID) to its service alias, placement index and node.",
            ("service", "replica", "alias", "index", "node"),
        )
        self.node_state = _gauge(
            registry,
            "ficc_node_state",
            "1 for each contributor node's state (registered, connected, unreachable, lost, "
            "revoked).",
            ("node", "state"),
        )
        self.node_heartbeat_age = _gauge(
            registry,
            "ficc_node_heartbeat_age_seconds",
            "Seconds since a node's last recorded heartbeat.",
            ("node",),
        )
        self.node_cpus = _gauge(
            registry,
            "ficc_node_cpus",
            "A node's CPU cores: capacity and reserved.",
            ("node", "kind"),
        )
        self.node_memory = _gauge(
            registry,
            "ficc_node_memory_bytes",
            "A node's memory: capacity and reserved.",
            ("node", "kind"),
        )
        self.node_gpu_memory = _gauge(
            registry,
            "ficc_node_gpu_memory_bytes",
            "Each GPU's memory on a node: total, reserved by replicas, and free as the "
            "driver last reported it.",
            ("node", "gpu", "kind"),
        )
        self.transfer_bytes = _gauge(
            registry,
            "ficc_model_transfer_bytes",
            "Model files being uploaded or acquired: bytes durably received and the size, "
            "by model and file index (gone once verified).",
            ("model", "file", "kind"),
        )
