"""How a running service's driver lets a successor take over from its predecessor.

The :class:`~ficc_core.inference.reconciliation.reconciler.Reconciler` calls these each step of a
running service: a pending rollout is cut over or given up (:meth:`Succession.rollout_step`),
each retiring attempt (:func:`~ficc_core.inference.reconciliation.publication.retiring`) drains and
stops (:meth:`Succession.retire`), and the reservations nothing holds any more go
(:meth:`Succession.settle_reservations`). :func:`strays` finds the attempts a move left
on another node than their placement's when nothing holds them any more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from .. import repository
from ..records import ROUTABLE, AttemptRecord, ServiceRecord, ServiceState
from ..specification.replicas import running_indices
from .generations import (
    IN_PLACE,
    Running,
    abandon_rollout,
    cut_over,
    settle_reservations,
    stale_reservations,
)
from .publication import given_up, routed

if TYPE_CHECKING:
    from ...schema import Specification
    from .reconciler import Reconciler
    from .reconciler import _Driver as Driver

log = logging.getLogger("ficc.inference")


class Succession:
    """A reconciler's successor handling (see the module docs)."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler

    async def settle_reservations(
        self, running: Running, attempts: Sequence[AttemptRecord]
    ) -> None:
        """Drop the reservations nothing holds any more; mostly there are none, which the
        step's own read shows (the write looks again in its transaction)."""
        if not stale_reservations(running, attempts):
            return
        service_id = running.record.id
        dropped = await self.reconciler.store.write(lambda tx: settle_reservations(tx, service_id))
        if dropped:
            log.info("service %s: released reservations %s", service_id, dropped)

    async def rollout_step(
        self, running: Running, attempts: Sequence[AttemptRecord], driver: Driver
    ) -> bool:
        """Cut a ready rollout over, or give a failed one up; True when either happened."""
        record, rollout = running.record, running.rollout
        assert rollout is not None
        service_id, generation = record.id, rollout.generation
        indices = running.wanted()[generation]
        ready = routed(attempts, generation, indices)
        now = self.reconciler.clock()
        connected = all(
            self.reconciler.contributors.connected_here(a.node_id) for a in ready.values()
        )
        complete = len(indices) == len(running.following())
        if len(ready) == len(indices) and connected and not complete:
            # A rolling rollout's handed-over replicas are ready: the next one goes.
            step = len(indices) + 1
            await self.reconciler.store.write(
                lambda tx: repository.set_rollout_step(tx, service_id, generation, step)
            )
            log.info("service %s: rolling rollout hands replica %d over", service_id, step - 1)
            return True
        if len(ready) == len(indices) and connected:
            if await self.reconciler.store.write(
                lambda tx: cut_over(tx, service_id, generation, now)
            ):
                log.info(
                    "service %s: generation %d is ready on every replica; traffic moves to it "
                    "and generation %d drains",
                    service_id,
                    generation,
                    record.generation,
                )
                driver.notice = None
            return True
        why = None
        for index in indices:
            last = given_up(attempts, generation, index, self.reconciler.give_up_after)
            if last is not None:
                said = f": {last.message}" if last.message else ""
                why = f"replica {index} stopped retrying ({last.reason}){said}"
                break
        if why is None and now >= rollout.deadline:
            why = f"not every replica was ready within {rollout.deadline - rollout.started_at:g} s"
        if why is None:
            return False
        if rollout.strategy in IN_PLACE:
            then = (
                f"generation {record.generation} starts again on the replicas the "
                f"{rollout.strategy} rollout had stopped, and serves once they are ready"
            )
        else:
            then = f"generation {record.generation} keeps serving"
        reason = f"the rollout to generation {generation} failed: {why}; {then}"
        await self.reconciler.store.write(lambda tx: abandon_rollout(tx, service_id, reason, now))
        log.warning("service %s: %s", service_id, reason)
        driver.notice = reason
        return True

    async def retire(self, record: ServiceRecord, attempt: AttemptRecord, driver: Driver) -> None:
        """Drain a retiring attempt's in-flight requests (bounded), then stop it."""
        attempt_id = attempt.attempt_id
        try:
            await unwatch(driver, attempt_id)
            if attempt.state in ROUTABLE:
                with trio.move_on_after(self.reconciler.drain_timeout):
                    await self.reconciler.replica_idle(attempt_id)
            if attempt_id in driver.dismissed:
                why = driver.dismissed[attempt_id]
            elif attempt.generation < record.generation:
                why = "rolled_out"
            elif attempt.generation > record.generation:
                why = "rollout_abandoned"
            elif attempt.replica >= len(record.specification().placements):
                why = "scaled_down"  # a scale-down applied in place
            else:
                why = _scaled_in(record, attempt) or "superseded"
            current = await self.reconciler.store.read(
                lambda tx: repository.attempt(tx, attempt_id)
            )
            if current is not None and not current.released:
                if not await self.reconciler.attempts.stop(current, reason=why):
                    # The node could not be asked: the next try comes after a pause, not at
                    # once (a node that is down was asked, and logged, several times a second).
                    await trio.sleep(self.reconciler.attempts.ready_period)
        finally:
            driver.retiring.discard(attempt_id)
            driver.wake.set()


def in_place_state(
    running: Running,
    attempts: Sequence[AttemptRecord],
    state: ServiceState,
    reason: str | None,
) -> tuple[ServiceState, str | None]:
    """A running service's state while an in-place rollout replaces its replicas: starting
    while none serves, degraded while fewer than all do; the reason says how far it is."""
    rollout = running.rollout
    if rollout is None or rollout.strategy not in IN_PLACE:
        return state, reason
    wanted = running.wanted()
    record = running.record
    serving = routed(attempts, record.generation, wanted[record.generation])
    handed = routed(attempts, rollout.generation, wanted[rollout.generation])
    total = len(running_indices(record.specification(), record.active))
    if not serving and not handed:
        state = ServiceState.STARTING
    elif len(serving) + len(handed) < total:
        state = ServiceState.DEGRADED
    said = (
        f"rollout to generation {rollout.generation} ({rollout.strategy}, in place): "
        f"{len(handed)} of {len(running.following())} next replica(s) ready"
    )
    return state, reason or said


def _scaled_in(record: ServiceRecord, attempt: AttemptRecord) -> str | None:
    """The autoscaler's reason when ``attempt`` retires because its placement no longer
    runs: ``idle`` when none runs any more (an on-demand service went idle), else
    ``scale_in``; None when its placement still runs."""
    specification = record.specification()
    if specification.scaling is None:
        return None
    running = running_indices(specification, record.active)
    if attempt.replica in running:
        return None
    return "scale_in" if running else "idle"


async def unwatch(driver: Driver, attempt_id: str) -> None:
    """End the replica task watching ``attempt_id`` (the next step starts another)."""
    for key, task in list(driver.replicas.items()):
        if task.watching == attempt_id:
            task.scope.cancel()
            await task.done.wait()
            if driver.replicas.get(key) is task:
                del driver.replicas[key]


def strays(
    attempts: Sequence[AttemptRecord], wanted: Mapping[int, Specification], held: set[str]
) -> list[AttemptRecord]:
    """Unreleased attempts of a wanted generation on another node than their placement's
    that no operation holds."""
    found = []
    for attempt in attempts:
        specification = wanted.get(attempt.generation)
        if attempt.released or attempt.attempt_id in held or specification is None:
            continue
        placements = specification.placements
        if attempt.replica < len(placements):
            if placements[attempt.replica].node_id != attempt.node_id:
                found.append(attempt)
    return found
