"""State gauges for ``/metrics``: services, replicas, nodes, reservations, transfers.

The gateway's counters say what requests did; these say what the installation *is*:
each service's and replica's state, each node's state and heartbeat age, what is
reserved against what a node offers (GPU memory included), and the model files still
being uploaded or acquired. They are read from the store every ``interval`` seconds
by a task of their own (never while a scrape waits), so every controller of an
installation exports the same values; dashboards take ``max without (instance)``.

Cardinality is bounded by what exists: a service, replica, node or transfer that is
gone has its series removed at the next read, and a replica is labelled by its
placement index and node, never by attempt ID (``ficc_replica_info`` joins the
gateway's per-attempt series to alias, index and node).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from ...models import list_partials
from .. import repository
from .status import current_attempts

if TYPE_CHECKING:
    from ...contributors import NodeRegistry
    from ...store import Store, Transaction
    from .metrics import ReconciliationMetrics

log = logging.getLogger("ficc.metrics")


class _Series:
    """The label sets one gauge was given in the last read, to remove those now gone."""

    def __init__(self, gauge: Any) -> None:
        self.gauge = gauge
        self.shown: set[tuple[str, ...]] = set()

    def update(self, values: dict[tuple[str, ...], float]) -> None:
        for labels, value in values.items():
            self.gauge.labels(*labels).set(value)
        for gone in self.shown - set(values):
            try:
                self.gauge.remove(*gone)
            except KeyError:
                pass
        self.shown = set(values)


def _read(tx: Transaction) -> tuple[list[Any], list[Any]]:
    details = [repository.detail(tx, sid) for sid in repository.service_ids(tx)]
    return [d for d in details if d is not None], list_partials(tx)


class StateMetrics:
    """Keep the state gauges of :class:`~.metrics.ReconciliationMetrics` in step with the store."""

    def __init__(
        self,
        *,
        store: Store,
        contributors: NodeRegistry,
        metrics: ReconciliationMetrics,
        interval: float = 5.0,
    ) -> None:
        self.store = store
        self.contributors = contributors
        self.metrics = metrics
        self.interval = interval
        m = metrics
        self._series = {
            name: _Series(getattr(m, name))
            for name in (
                "service_state",
                "service_replicas",
                "replica_state",
                "replica_info",
                "node_state",
                "node_heartbeat_age",
                "node_cpus",
                "node_memory",
                "node_gpu_memory",
                "transfer_bytes",
            )
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failing = False
        while True:
            try:
                await self.read_once()
                failing = False
            except Exception as exc:  # the store is down: keep the last values shown
                if not failing:
                    log.warning("state metrics not refreshed: %s", exc)
                failing = True
            await trio.sleep(self.interval)

    async def read_once(self) -> None:
        details, partials = await self.store.read(_read)
        nodes = await self.contributors.list()
        self._services(details)
        self._nodes(nodes, time.time())
        self._transfers(partials)

    def _services(self, details: Iterable[Any]) -> None:
        states: dict[tuple[str, ...], float] = {}
        counts: dict[tuple[str, ...], float] = {}
        replicas: dict[tuple[str, ...], float] = {}
        info: dict[tuple[str, ...], float] = {}
        for detail in details:
            service = detail.service
            ident = (service.id, service.alias, service.project_id)
            states[(*ident, str(service.state))] = 1
            placements = service.document()["placements"]
            latest = current_attempts(detail.attempts, service.generation)
            ready = 0
            for index, placement in enumerate(placements):
                attempt = latest.get(index)
                state = "stopped" if attempt is None else str(attempt.state)
                node = placement["node_id"] if attempt is None else attempt.node_id
                replicas[(service.id, service.alias, str(index), node, state)] = 1
                ready += state == "ready"
                if attempt is not None and not attempt.released:
                    info[(service.id, attempt.attempt_id, service.alias, str(index), node)] = 1
            counts[(service.id, service.alias, "desired")] = len(placements)
            counts[(service.id, service.alias, "ready")] = ready
        self._series["service_state"].update(states)
        self._series["service_replicas"].update(counts)
        self._series["replica_state"].update(replicas)
        self._series["replica_info"].update(info)

    def _nodes(self, nodes: Iterable[Any], now: float) -> None:
        states: dict[tuple[str, ...], float] = {}
        ages: dict[tuple[str, ...], float] = {}
        cpus: dict[tuple[str, ...], float] = {}
        memory: dict[tuple[str, ...], float] = {}
        gpu_memory: dict[tuple[str, ...], float] = {}
        for node in nodes:
            states[(node.id, str(node.state))] = 1
            if node.last_heartbeat is not None:
                ages[(node.id,)] = max(0.0, now - node.last_heartbeat)
            resources = (node.snapshot or {}).get("resources") or {}
            reserved_gpu: dict[int, int] = {}
            reserved_cpus = reserved_memory = 0.0
            for held in node.reservations:
                reserved_cpus += held.cpus
                reserved_memory += held.memory_bytes
                for share in held.gpus:
                    reserved_gpu[share.index] = (
                        reserved_gpu.get(share.index, 0) + share.memory_bytes
                    )
            cpus[(node.id, "reserved")] = reserved_cpus
            memory[(node.id, "reserved")] = reserved_memory
            if resources:
                cpus[(node.id, "capacity")] = resources.get("cpus", 0)
                memory[(node.id, "capacity")] = resources.get("memory_bytes", 0)
            for gpu in resources.get("gpus") or ():
                index = str(gpu["index"])
                gpu_memory[(node.id, index, "total")] = gpu.get("memory_bytes", 0)
                gpu_memory[(node.id, index, "reserved")] = reserved_gpu.get(gpu["index"], 0)
                if gpu.get("memory_free_bytes") is not None:
                    gpu_memory[(node.id, index, "free")] = gpu["memory_free_bytes"]
        self._series["node_state"].update(states)
        self._series["node_heartbeat_age"].update(ages)
        self._series["node_cpus"].update(cpus)
        self._series["node_memory"].update(memory)
        self._series["node_gpu_memory"].update(gpu_memory)

    def _transfers(self, partials: Iterable[Any]) -> None:
        values: dict[tuple[str, ...], float] = {}
        for partial, verified in partials:
            if verified:
                continue
            ref = partial.ref
            values[(ref.model_id, str(ref.index), "received")] = partial.durable_offset
            values[(ref.model_id, str(ref.index), "size")] = ref.size
        self._series["transfer_bytes"].update(values)


__all__ = ["StateMetrics"]
