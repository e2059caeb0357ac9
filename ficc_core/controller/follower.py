"""A standby's routing table: it follows the store, so invoke requests through it keep working.

On the leader the reconciler publishes each service's routing view as it drives
it. A standby drives nothing, so every ``follow_interval`` it reads every service
with its attempts in one transaction and publishes each with the same pure function
(:func:`~ficc_core.inference.reconciliation.publication.publish`): a replica is routed here when
the store says it is ready and its node is connected to this controller. When a
read fails (the store is down) the last table stays as it was: the replicas it
names keep serving.

Polling with a bound is the simple, portable way to follow; PostgreSQL's
``LISTEN/NOTIFY`` would make it prompter and is a later optimisation.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from .. import inference
from ..base.errors import FiccError
from ..inference.reconciliation.generations import Running, read_running
from ..inference.reconciliation.publication import publish
from ..inference.records import Desired

if TYPE_CHECKING:
    from ..contributors import NodeRegistry
    from ..inference import Reconciler
    from ..inference.records import AttemptRecord
    from ..routing.live import Admission, LiveTable
    from ..store import Store, Transaction

log = logging.getLogger("ficc.controller")

#: Each service as read: what its driver would read, and its attempts.
Snapshot = list[tuple[Running, list["AttemptRecord"]]]


def read_services(tx: Transaction) -> Snapshot:
    """Every service with its pending rollout, reservations and attempts."""
    found = []
    for service_id in inference.service_ids(tx):
        running = read_running(tx, service_id)
        if running is not None:
            found.append((running, inference.attempts(tx, service_id)))
    return found


class RoutingFollower:
    """Publishes every service's routing view from the store, once an ``interval``.

    :param reconciler: not run here; its adapters and model contexts say what an
        engine serves (the capabilities a published service answers with).
    """

    def __init__(
        self,
        store: Store,
        *,
        live: LiveTable,
        contributors: NodeRegistry,
        reconciler: Reconciler,
        interval: float,
    ) -> None:
        self.store = store
        self.live = live
        self.contributors = contributors
        self.reconciler = reconciler
        self.interval = interval
        self._capabilities: dict[tuple[str, int], tuple[str, ...]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh the table every ``interval`` until cancelled (started after the first)."""
        await self.refresh()
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            await self.refresh()

    async def refresh(self) -> bool:
        """Read the store and publish every service; False (the table kept) when the
        read failed."""
        try:
            services = await self.store.read(read_services)
        except Exception as exc:  # whatever the store raised: the table stays as it was
            message = exc.message if isinstance(exc, FiccError) else repr(exc)
            log.warning("cannot read the services to route: %s; keeping the table", message)
            return False
        seen = set()
        for running, attempts in services:
            seen.add(running.record.id)
            try:
                await self._publish(running, attempts)
            except Exception:
                log.exception("cannot publish service %s", running.record.id)
        for view in self.live.services():
            if view.id not in seen:
                self.live.remove(view.id)
        return True

    async def _publish(self, running: Running, attempts: list[AttemptRecord]) -> None:
        record = running.record
        specification = record.specification()
        admission: Admission
        wanted: tuple[int, ...] | None = None
        if record.desired == Desired.RUNNING:
            admission, wanted = "serving", running.wanted()[record.generation]
        elif record.desired == Desired.DRAINING:
            admission = "draining"
        else:
            admission = "stopped"
        capabilities: tuple[str, ...] = ()
        model = None
        if admission != "stopped":
            key = (record.id, record.generation)
            if key not in self._capabilities:
                computed = await self.reconciler.attempts.capabilities(record, specification)
                if computed is None:
                    computed = ()
                else:
                    self._capabilities[key] = computed
            capabilities = self._capabilities.get(key, ())
            try:
                model = (await self.reconciler.attempts.model(record, specification)).record
            except FiccError:
                pass  # the model is gone: the service is still published without its name
        activation, failure = self.reconciler.on_demand.activation(record, specification, wanted)
        publish(
            self.live,
            self.contributors,
            record,
            specification,
            attempts,
            capabilities,
            admission,
            model=model,
            wanted=wanted,
            activation=activation,
            activation_error=None if failure is None else failure.public(),
        )


__all__ = ["RoutingFollower", "read_services"]
