"""Two generations of one service, and two attempts of one replica, in the store.

A running service holds one reservation per ``(generation, replica, node)`` its
attempts need: its generation's placements, a pending rollout's next generation
(:class:`~ficc_core.inference.records.RolloutRecord`) beside it, and every attempt
whose end is not yet confirmed (a move's source until it is released, the previous
generation until it drained and stopped). :func:`settle_reservations` drops any
other in the transaction that reads what is held, so a reservation goes only once
its attempt's end is confirmed and nothing else needs it.

A rollout becomes the service's own in one transaction (:func:`cut_over`) once every
replica of the next generation is ready; a failed one (:func:`abandon_rollout`) is
forgotten, its attempts retire and the serving generation goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from ...events import EventKind
from ...store import Transaction
from .. import history, repository
from ..records import AttemptRecord, RolloutRecord, ServiceRecord
from ..specification.replicas import running_indices

if TYPE_CHECKING:
    from ...schema import Specification
    from ..records import Reservation

#: The rollout strategies that replace the serving generation's replicas where they run.
IN_PLACE = ("rolling", "recreate")


@attrs.frozen(kw_only=True)
class Running:
    """What a running service's driver reads in one transaction."""

    record: ServiceRecord
    rollout: RolloutRecord | None
    #: What the service holds (read with the rest, so a step sees whether any went stale).
    reservations: tuple[Reservation, ...] = ()

    def specifications(self) -> dict[int, Specification]:
        """Each generation still wanted, with its specification (the service's, and a
        pending rollout's next one)."""
        wanted = {self.record.generation: self.record.specification()}
        if self.rollout is not None:
            wanted[self.rollout.generation] = self.rollout.specification()
        return wanted

    def wanted(self) -> dict[int, tuple[int, ...]]:
        """Each generation still wanted, with the placements whose replicas run
        (:func:`~ficc_core.inference.specification.replicas.running_indices`: every one,
        or a scaled service's active ones).

        An in-place rollout hands replicas over: ``recreate`` all at once (the serving
        generation runs none), ``rolling`` its ``step`` first (the serving generation runs
        the rest of its own)."""
        active = self.record.active
        wanted = {g: running_indices(s, active) for g, s in self.specifications().items()}
        rollout = self.rollout
        if rollout is not None and rollout.strategy in IN_PLACE:
            serving, following = wanted[self.record.generation], wanted[rollout.generation]
            step = len(following) if rollout.strategy == "recreate" else rollout.step
            wanted[self.record.generation] = serving[step:]
            wanted[rollout.generation] = following[:step]
        return wanted

    def following(self) -> tuple[int, ...]:
        """The replicas a pending rollout's next generation runs once it is complete."""
        assert self.rollout is not None
        specification = self.rollout.specification()
        return running_indices(specification, self.record.active)


def needed_keys(running: Running, attempts: Iterable[AttemptRecord]) -> set[tuple[int, int, str]]:
    """The reservation keys the running service needs (see the module docs): each wanted
    generation's placements, and every attempt whose end is not confirmed."""
    keep: set[tuple[int, int, str]] = set()
    wanted = running.wanted()
    if running.rollout is not None and running.rollout.strategy in IN_PLACE:
        # Every reservation of both generations stays until the cut-over: a failed
        # in-place rollout starts the serving generation's replicas again where they were.
        wanted = {
            running.record.generation: running_indices(
                running.record.specification(), running.record.active
            ),
            running.rollout.generation: running.following(),
        }
    for generation, specification in running.specifications().items():
        placements = specification.placements
        keep |= {(generation, i, placements[i].node_id) for i in wanted[generation]}
    keep |= {(a.generation, a.replica, a.node_id) for a in attempts if not a.released}
    return keep


def predecessor_stopping(
    running: Running, attempts: Iterable[AttemptRecord], generation: int, index: int
) -> bool:
    """Whether replica ``index`` of an in-place rollout's next ``generation`` waits before
    it launches: an attempt of the serving generation that it replaces (no longer wanted)
    has not ended yet on the node it goes to."""
    rollout = running.rollout
    if rollout is None or rollout.strategy not in IN_PLACE or generation != rollout.generation:
        return False
    placements = rollout.specification().placements
    if index >= len(placements):
        return False
    node_id = placements[index].node_id
    serving = running.wanted().get(running.record.generation, ())
    return any(
        not a.released
        and a.generation < generation
        and a.node_id == node_id
        and a.replica not in serving
        for a in attempts
    )


def stale_reservations(running: Running, attempts: Iterable[AttemptRecord]) -> bool:
    """Whether the service holds a reservation nothing needs any more."""
    keep = needed_keys(running, attempts)
    return any(r.key not in keep for r in running.reservations)


def needed(tx: Transaction, service_id: str) -> set[tuple[int, int, str]]:
    """The reservation keys the running service needs now, read in ``tx``."""
    record = repository.service(tx, service_id)
    if record is None:
        return set()
    running = Running(record=record, rollout=repository.rollout(tx, service_id))
    return needed_keys(running, repository.unreleased_attempts(tx, service_id))


def settle_reservations(tx: Transaction, service_id: str) -> list[tuple[int, int, str]]:
    """Drop the running service's reservations nothing needs any more; return their keys."""
    keep = needed(tx, service_id)
    dropped = [r.key for r in repository.reservations(tx, service_id) if r.key not in keep]
    for key in dropped:
        repository.delete_reservation_key(tx, service_id, key)
    return dropped


def rollout_event(
    tx: Transaction,
    record: ServiceRecord,
    rollout: RolloutRecord,
    reason: str,
    message: str,
    now: float,
) -> None:
    """The ``service.rollout`` event of ``rollout`` (``started``, ``cut_over``, ``failed``,
    ``abandoned``), in the transaction of that change."""
    history.service_event(
        tx,
        record,
        EventKind.SERVICE_ROLLOUT,
        now,
        reason=reason,
        message=message,
        details={"rollout_generation": rollout.generation, "plan_digest": rollout.plan_digest},
    )


def cut_over(tx: Transaction, service_id: str, generation: int, now: float) -> bool:
    """The rollout to ``generation`` becomes the service's specification and generation."""
    record = repository.service(tx, service_id)
    rollout = repository.rollout(tx, service_id)
    if record is None or rollout is None or rollout.generation != generation:
        return False
    specification = rollout.specification()
    repository.update_service(
        tx,
        attrs.evolve(
            record,
            alias=specification.alias,
            model_id=specification.model_id,
            spec=rollout.spec,
            plan_digest=rollout.plan_digest,
            generation=rollout.generation,
            reason=None,
        ),
        now,
    )
    repository.delete_rollout(tx, service_id)
    scaled = specification.scaling is not None
    active = running_indices(specification, record.active) if scaled else None
    if active != record.active:
        # The placements that ran carry over (those the next generation still has).
        repository.set_scale(tx, service_id, active, now, decided=False, bump=False)
    after = repository.service(tx, service_id)
    assert after is not None
    rollout_event(
        tx,
        after,
        rollout,
        "cut_over",
        f"generation {generation} is ready on every replica and takes the traffic; "
        f"generation {record.generation} drains",
        now,
    )
    return True


def abandon_rollout(
    tx: Transaction, service_id: str, reason: str | None, now: float
) -> RolloutRecord | None:
    """Forget the service's pending rollout (its attempts then retire); the service's
    reason says why when ``reason`` is given. Returns the rollout, or None."""
    rollout = repository.rollout(tx, service_id)
    if rollout is None:
        return None
    repository.delete_rollout(tx, service_id)
    record = repository.service(tx, service_id)
    if record is not None and reason is not None:
        repository.update_service(tx, attrs.evolve(record, reason=reason), now)
    else:
        repository.bump(tx, service_id, now)
    record = repository.service(tx, service_id)
    if record is not None:
        # A failure's reason already says which rollout failed, and why.
        word = "failed" if reason else "abandoned"
        message = reason or (
            f"rollout to generation {rollout.generation} abandoned: the service stopped"
        )
        rollout_event(tx, record, rollout, word, message, now)
    return rollout


def read_running(tx: Transaction, service_id: str) -> Running | None:
    """The service and its pending rollout, or None once it is removed."""
    record = repository.service(tx, service_id)
    if record is None:
        return None
    return Running(
        record=record,
        rollout=repository.rollout(tx, service_id),
        reservations=tuple(repository.reservations(tx, service_id)),
    )
