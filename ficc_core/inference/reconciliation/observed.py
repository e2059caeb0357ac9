"""What the reconciler records of what it observes: attempts' and services' states.

Every write of an attempt bumps its service's revision (clients see the change),
and a write that changes nothing writes nothing. Each change is also an event,
written in the same transaction (:mod:`~ficc_core.inference.history`). ``changed`` is called
after each attempt change so the service's driver looks again at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ... import contributors
from ...contributors.records import Node
from ...events import EventKind
from ...store import Store, Transaction
from .. import history, repository
from ..records import AttemptRecord, Desired, ServiceRecord, ServiceState


def _update(
    tx: Transaction,
    current: ServiceRecord,
    changed: ServiceRecord,
    now: float,
    action: str | None = None,
) -> None:
    """Write the service's change, and its event."""
    repository.update_service(tx, changed, now)
    history.service_changed(tx, current, changed, now, action=action)


class Observations:
    """The reconciler's reads and writes of one store.

    :param store: the store the services are recorded in.
    :param clock: seconds since the epoch, for the records' times.
    :param changed: called with a service's id after one of its attempts changed.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float],
        changed: Callable[[str], None] = lambda _service_id: None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.changed = changed

    async def service_ids(self) -> list[str]:
        """Every service on record."""
        return await self.store.read(repository.service_ids)

    async def read(self, service_id: str) -> tuple[ServiceRecord | None, list[AttemptRecord]]:
        """The service (None once removed) and its attempts, in one transaction."""

        def read(tx: Transaction) -> tuple[ServiceRecord | None, list[AttemptRecord]]:
            return repository.service(tx, service_id), repository.attempts(tx, service_id)

        return await self.store.read(read)

    async def add_attempt(self, record: AttemptRecord) -> None:
        """Record a new attempt (before anything is sent to its node)."""

        def write(tx: Transaction) -> None:
            earlier = [
                a
                for a in repository.attempts(tx, record.service_id)
                if (a.replica, a.generation) == (record.replica, record.generation)
            ]
            repository.insert_attempt(tx, record)
            repository.bump(tx, record.service_id, record.created_at)
            service = repository.service(tx, record.service_id)
            previous = earlier[-1] if earlier else None
            history.attempt_added(tx, service, record, previous, record.created_at)

        await self.store.write(write)

    async def set_attempt(self, service_id: str, attempt_id: str, **changes: Any) -> None:
        """Change fields of an attempt (``state``, ``reason``, ``released``...)."""
        now = self.clock()

        def write(tx: Transaction) -> None:
            current = repository.attempt(tx, attempt_id)
            if current is None:
                return
            changed = attrs.evolve(current, **changes)
            if changed == current:
                return
            repository.update_attempt(tx, changed, now)
            repository.bump(tx, service_id, now)
            history.attempt_changed(tx, repository.service(tx, service_id), current, changed, now)

        await self.store.write(write)
        self.changed(service_id)

    async def set_service(self, service_id: str, **changes: Any) -> None:
        """Change the service's observed fields (``state``, ``reason``)."""
        now = self.clock()

        def write(tx: Transaction) -> None:
            current = repository.service(tx, service_id)
            if current is None:
                return
            changed = attrs.evolve(current, **changes)
            if changed != current:
                _update(tx, current, changed, now)

        await self.store.write(write)

    async def clear_reason(self, service_id: str, reason: str) -> None:
        """Drop the service's reason if it is still ``reason`` (no step replaced it)."""
        now = self.clock()

        def write(tx: Transaction) -> None:
            current = repository.service(tx, service_id)
            if current is not None and current.reason == reason:
                _update(tx, current, attrs.evolve(current, reason=None), now)

        await self.store.write(write)

    async def drained(self, service_id: str) -> None:
        """The drain is over: the service stops (unless something else was asked meanwhile)."""
        now = self.clock()

        def write(tx: Transaction) -> None:
            current = repository.service(tx, service_id)
            if current is not None and current.desired == Desired.DRAINING:
                stopping = attrs.evolve(
                    current, desired=Desired.STOPPED, state=ServiceState.STOPPING
                )
                _update(tx, current, stopping, now, action="drained")

        await self.store.write(write)

    async def settle_stop(self, service_id: str, held: set[int]) -> bool:
        """Every attempt but the unknown ones of replicas ``held`` ended: release the rest.

        A removed service holding nothing is deleted; returns whether it is gone.
        """
        now = self.clock()

        def write(tx: Transaction) -> bool:
            current = repository.service(tx, service_id)
            if current is None:
                return True
            if current.desired not in (Desired.STOPPED, Desired.REMOVED):
                return False  # started again meanwhile
            if current.desired == Desired.REMOVED and not held:
                repository.delete_service(tx, service_id)
                history.service_event(
                    tx,
                    current,
                    EventKind.SERVICE_REMOVED,
                    now,
                    reason="removed",
                    message=f"service {current.alias} removed: it holds nothing any more",
                    details={"alias": current.alias},
                )
                return True
            # A stopped service keeps no reason of its own: what its unknown replicas
            # mean is derived from them in the view, so it goes when they resolve.
            if current.state == ServiceState.STOPPED:
                # A created service keeps the reservations its plan made.
                if current.reason is not None:
                    _update(tx, current, attrs.evolve(current, reason=None), now)
                return False
            for reservation in repository.reservations(tx, service_id):
                if reservation.replica not in held:
                    repository.delete_reservation(tx, service_id, reservation.replica)
            removed = current.desired == Desired.REMOVED
            state = ServiceState.REMOVING if removed else ServiceState.STOPPED
            if (current.state, current.reason) != (state, None):
                _update(tx, current, attrs.evolve(current, state=state, reason=None), now)
            return False

        return await self.store.write(write)

    async def node(self, node_id: str) -> Node | None:
        """The node's record (its state, whether it is the embedded one), or None."""
        return await self.store.read(lambda tx: contributors.fetch_node(tx, node_id))
