"""Rollouts and restarts of a running service, without an outage.

A **rollout** (:func:`begin`) takes a running service's next specification —
context, concurrency, replica count, placements, engine options — and starts its
next generation by its strategy (:mod:`~ficc_core.inference.operations.strategies`): by default
*beside* the serving one, planned beside every reservation, the service's own
included (both generations run until the cut-over); in place (``rolling``,
``recreate``) when the operator says so. Its reservations are recorded with a
:class:`~ficc_core.inference.records.RolloutRecord` in one transaction. The
reconciler cuts traffic over once every replica of the next generation is ready,
then drains and stops the previous one (:mod:`~ficc_core.inference.reconciliation.generations`); a
replica that stops retrying, or the ``replica_ready_timeout`` bound, fails the
rollout and the serving generation goes on (an in-place one starts its stopped
replicas again). A scale-down is applied at once, without a new generation. The
contract's ``PUT`` still replaces only a stopped service.

A **restart** (:class:`Restarter`) dismisses a replica's serving attempt: it drains
and stops, and the replica's task starts the next one on the same placement. A
service restart does that one replica at a time, each waiting until its
replacement is ready, so a service of two or more replicas never has fewer than one
ready replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import trio

from ...base.errors import Conflict, FiccError
from ...schema import Specification, canonical_json
from ...store import Transaction
from .. import repository
from ..reconciliation.generations import rollout_event
from ..reconciliation.publication import routed
from ..records import ACTIVE, AttemptRecord, Desired, RolloutRecord, ServiceRecord
from ..specification.transitions import check_revision, next_generation, writable
from .refusals import nothing_to_do
from .strategies import SCALE_DOWN, Choice, choose, refuse_choice, scale_down

if TYPE_CHECKING:
    from ...auth import Principal
    from ..reconciliation.reconciler import Reconciler
    from ..specification.model_context import ModelContext


__all__ = ["Choice", "Restarter", "begin", "preview", "rollout_view"]


def _running(tx: Transaction, record: ServiceRecord, action: str, replica: int | None) -> None:
    if record.desired != Desired.RUNNING:
        raise nothing_to_do(action, record, replica, None, "not_running")
    if repository.rollout(tx, record.id) is not None:
        raise nothing_to_do(action, record, replica, None, "rollout_in_progress")


def begin(
    tx: Transaction,
    project_id: str,
    service_id: str,
    revision: int,
    specification: Specification,
    model: ModelContext,
    *,
    now: float,
    timeout: float,
    strategy: str = "auto",
) -> tuple[RolloutRecord | None, Choice]:
    """Record a rollout of the running service to ``specification`` (see the module docs);
    a scale-down is applied at once (no rollout: None)."""
    record = writable(tx, project_id, service_id)
    check_revision(record, revision)
    _running(tx, record, "rollout", None)
    if specification.alias != record.alias:
        raise Conflict(
            f"a rollout keeps the alias {record.alias!r} that clients send; to rename the "
            "service, stop it and replace it",
            code="alias_change_not_allowed",
            details={"alias": record.alias, "requested": specification.alias},
        )
    generation = next_generation(tx, record)
    choice = choose(tx, record, specification, model, generation, strategy)
    if choice.chosen is None:
        raise refuse_choice(choice)
    if choice.chosen == SCALE_DOWN:
        scale_down(tx, record, specification, choice.plan, now)
        return None, choice
    steps = len(choice.following) if choice.chosen == "rolling" else 1
    rollout = RolloutRecord(
        service_id=service_id,
        generation=generation,
        spec=canonical_json(specification).decode("utf-8"),
        plan_digest=choice.plan.digest,
        started_at=now,
        deadline=now + timeout * max(steps, 1),
        strategy=choice.chosen,
        step=1 if choice.chosen == "rolling" else 0,
    )
    repository.insert_reservations(tx, choice.plan.reservations, now)
    repository.insert_rollout(tx, rollout)
    repository.update_service(tx, attrs.evolve(record, reason=None), now)
    after = repository.service(tx, service_id)
    assert after is not None
    how = {
        "surge": f"beside generation {record.generation}",
        "rolling": f"in place of generation {record.generation}, one replica at a time",
        "recreate": f"in place of generation {record.generation}, every replica at once",
    }[choice.chosen]
    rollout_event(
        tx, after, rollout, "started", f"rollout to generation {generation} started {how}", now
    )
    return rollout, choice


def preview(
    tx: Transaction,
    project_id: str,
    service_id: str,
    specification: Specification,
    model: Any,
    strategy: str = "auto",
) -> Choice:
    """A rollout's plans and the strategy it would take (see :func:`choose`)."""
    record = writable(tx, project_id, service_id)
    return choose(tx, record, specification, model, next_generation(tx, record), strategy)


def rollout_view(rollout: RolloutRecord | None, record: ServiceRecord) -> dict[str, Any]:
    """A service's rollout as the API shows it."""
    return {
        "service_id": record.id,
        "generation": record.generation,
        "pending": rollout is not None,
        "rollout": None
        if rollout is None
        else {
            "generation": rollout.generation,
            "started_at": rollout.started_at,
            "deadline": rollout.deadline,
            "plan_digest": rollout.plan_digest,
            "strategy": rollout.strategy,
            "step": rollout.step,
        },
        "state": str(record.state),
        "reason": record.reason,
        "revision": record.revision,
    }


# -- restarts -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Target:
    record: ServiceRecord
    attempts: tuple[AttemptRecord, ...]


class Restarter:
    """Restarts replicas through the reconciler (see the module docs)."""

    def __init__(self, *, reconciler: Reconciler, ready_timeout: float) -> None:
        self.reconciler = reconciler
        self.store = reconciler.store
        self.ready_timeout = ready_timeout

    async def _prepare(
        self, principal: Principal, service_id: str, revision: int, replica: int | None
    ) -> _Target:
        def read(tx: Transaction) -> _Target:
            record = writable(tx, principal.project_id, service_id)
            check_revision(record, revision)
            _running(tx, record, "restart", replica)
            count = len(record.specification().placements)
            if replica is not None and replica >= count:
                raise nothing_to_do("restart", record, replica, None, "replica_not_found")
            attempts = repository.attempts(tx, service_id)
            wanted = range(count) if replica is None else [replica]
            current = []
            for index in wanted:
                mine = [
                    a
                    for a in attempts
                    if a.replica == index
                    and a.generation == record.generation
                    and not a.released
                    and a.state in ACTIVE
                ]
                if mine:
                    current.append(mine[-1])
            if not current:
                node = None if replica is None else record.specification().placements[replica]
                raise nothing_to_do(
                    "restart",
                    record,
                    replica,
                    None if node is None else node.node_id,
                    "not_running" if replica is None else "replica_not_ready",
                )
            return _Target(record=record, attempts=tuple(current))

        return await self.store.read(read)

    async def restart(
        self, principal: Principal, service_id: str, revision: int, replica: int | None = None
    ) -> dict[str, Any]:
        """Restart one replica, or every one in turn (rolling); answer what each did."""
        target = await self._prepare(principal, service_id, revision, replica)
        # A replica whose node's agent is away cannot be stopped, nor started again there:
        # refused at once (it waited for the replacement up to replica_ready_timeout).
        nodes = self.reconciler.attempts.contributors
        for attempt in target.attempts:
            nodes.require_connected(attempt.node_id, "restart")
        driver = await self.reconciler.driver_of(service_id)
        results: list[dict[str, Any]] = []
        count = len(target.record.specification().placements)
        for attempt in target.attempts:
            began = trio.current_time()
            if count > 1:
                # Never below one ready replica: another serves before this one goes.
                await self._another_serving(target.record, attempt)
            driver.dismissed[attempt.attempt_id] = "restart_requested"
            self.reconciler.wake(service_id)
            try:
                replacement = await self._replaced(target.record, attempt)
            except FiccError as exc:
                results.append(
                    {
                        "replica": attempt.replica,
                        "ok": False,
                        "from_attempt": attempt.attempt_id,
                        "error": exc.message,
                    }
                )
                break
            results.append(
                {
                    "replica": attempt.replica,
                    "ok": True,
                    "from_attempt": attempt.attempt_id,
                    "to_attempt": replacement.attempt_id,
                    "node_id": replacement.node_id,
                    "ms": round((trio.current_time() - began) * 1000, 1),
                }
            )
        return {
            "service_id": service_id,
            "restarted": sum(1 for r in results if r["ok"]),
            "replicas": results,
        }

    async def _another_serving(self, record: ServiceRecord, attempt: AttemptRecord) -> None:
        count = len(record.specification().placements)
        with trio.move_on_after(self.ready_timeout):
            while True:
                attempts = await self.store.read(lambda tx: repository.attempts(tx, record.id))
                serving = routed(attempts, record.generation, count)
                if any(index != attempt.replica for index in serving):
                    return
                await trio.sleep(self.reconciler.attempts.loading_period)

    async def _replaced(self, record: ServiceRecord, old: AttemptRecord) -> AttemptRecord:
        count = len(record.specification().placements)
        with trio.move_on_after(self.ready_timeout):
            while True:
                attempts = await self.store.read(lambda tx: repository.attempts(tx, record.id))
                serving = routed(attempts, record.generation, count).get(old.replica)
                if serving is not None and serving.number > old.number:
                    return serving
                await trio.sleep(self.reconciler.attempts.loading_period)
        raise FiccError(
            f"replica {old.replica} was not ready again within {self.ready_timeout:g} s",
            code="restart_timed_out",
            status=504,
        )
