"""Moving one replica of a running service to another node, without an outage.

Five steps, as operators of other clusters know them: ``deploy_target`` (reserve
the target beside everything else and launch the replica's next attempt there),
``wait_target_health`` (until it is ready; the source serves meanwhile),
``stop_source`` (the source leaves the routing view, its in-flight requests finish
within the drain bound, then its node stops it), ``undeploy_source`` (its node
confirmed the end: the attempt is released) and ``update_binding`` (the placement
and the reservations in one transaction; the revision moves on). The answer says
how it ended (:data:`FINAL_STATES`) and what each step did.

A failure before the source stopped rolls the target back (``failed``,
``failed_rolled_back``); after it (undeploy, binding) the target is rolled back and
the replica starts again on its source node (``failed_rolled_back_source_restarted``,
``failed_rolled_back``); a rollback that fails too is ``failed_rollback_dirty``.
Reservations are settled before the answer: whatever the outcome, the service holds
exactly what its specification and its unreleased attempts need.

:attr:`Mover.hook` is awaited with each step's name (and ``rollback_target``,
``restart_source``) before that step acts; an exception it raises fails the step.
Tests inject faults through it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..contributors import repository as contributors_repository
from ..errors import FiccError, InvalidRequest
from ..events import EventKind, Subject
from ..events import record as record_event
from ..schema import canonical_json
from ..store import Transaction
from . import history, repository
from .admission import plan_in
from .generations import settle_reservations
from .placement import PlacementNode, Reservation, plan
from .publication import routed
from .records import AttemptRecord, AttemptState, Desired, ServiceRecord
from .refusals import nothing_to_do, operation_details
from .transitions import check_revision, writable

if TYPE_CHECKING:
    from ..auth import Principal
    from ..schema import Placement, Specification
    from .model_context import ModelContext, ModelContexts
    from .reconciler import Reconciler

STEPS = ("deploy_target", "wait_target_health", "stop_source", "undeploy_source", "update_binding")
FINAL_STATES = (
    "moved",
    "failed",
    "failed_rolled_back",
    "failed_rolled_back_source_restarted",
    "failed_rollback_dirty",
)
_CAPACITY = frozenset(
    {"insufficient_cpu", "insufficient_memory", "insufficient_gpu_memory", "insufficient_disk"}
)


async def _no_fault(_step: str) -> None:
    return None


@attrs.define
class Step:
    """One step's outcome."""

    name: str
    ok: bool
    ms: float
    details: dict[str, Any] = attrs.Factory(dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "ms": round(self.ms, 1), "details": self.details}


@attrs.frozen(kw_only=True)
class MoveResult:
    """How a move ended, from where to where, and each step."""

    service_id: str
    replica: int
    final_state: str
    from_node: str
    to_node: str
    steps: tuple[Step, ...]

    @property
    def ok(self) -> bool:
        return self.final_state == "moved"

    def to_json(self) -> dict[str, Any]:
        return {
            "service_id": self.service_id,
            "replica": self.replica,
            "final_state": self.final_state,
            "from_node": self.from_node,
            "to_node": self.to_node,
            "steps": [step.to_json() for step in self.steps],
        }


@attrs.frozen(kw_only=True)
class _Plan:
    record: ServiceRecord
    specification: Specification
    moved: Specification
    source: AttemptRecord
    target: AttemptRecord
    reservation: Reservation


class _StepFailed(Exception):
    def __init__(self, details: dict[str, Any]) -> None:
        super().__init__(details.get("error", "failed"))
        self.details = details


def target_placement(
    placement: Placement, node_id: str, gpu_index: int | None, *, details: dict[str, Any]
) -> Placement:
    """``placement`` on ``node_id`` (its GPU reservation on ``gpu_index`` when given)."""
    limits = placement.limits
    if gpu_index is not None:
        if len(limits.gpus) != 1:
            raise InvalidRequest(
                f"target_gpu_index needs a replica that reserves one GPU; this one reserves "
                f"{len(limits.gpus)}",
                code="invalid_request",
                details={**details, "reason": "gpu_index_not_applicable"},
            )
        limits = attrs.evolve(limits, gpus=(attrs.evolve(limits.gpus[0], index=gpu_index),))
    return attrs.evolve(placement, node_id=node_id, limits=limits)


def check_target(
    tx: Transaction, record: ServiceRecord, moved: Specification, index: int, model: ModelContext
) -> Reservation:
    """The target's reservation; refused when the replica does not fit there beside every
    reservation held (the service's own too: its source stays held until the move ends)."""
    placement = moved.placements[index]
    node_id = placement.node_id
    one = attrs.evolve(moved, placements=(placement,))
    node = contributors_repository.fetch_node(tx, node_id)
    nodes = {} if node is None else {node_id: PlacementNode.of(node)}
    result = plan(
        record.id,
        one,
        nodes,
        repository.reservations_but(tx, ""),
        model_bytes=model.size,
        model_revision=model.record.revision,
        generation=record.generation,
    )
    reasons = [reason for replica in result.replicas for reason in replica.reasons]
    if not reasons:
        return attrs.evolve(result.reservations[0], replica=index)
    gpus = [gpu.index for gpu in placement.limits.gpus]
    details = operation_details("move", record, index, node_id)
    capacity = all(reason.code in _CAPACITY for reason in reasons)
    details["reason"] = "over_subscribed_target" if capacity else reasons[0].code
    details["target_gpu_index"] = gpus[0] if gpus else None
    details["reasons"] = [reason.to_json() for reason in reasons]
    refusal = InvalidRequest(
        f"cannot move replica {index} of {record.alias} to node {node_id}: {reasons[0].message}",
        code="over_subscribed_target" if capacity else "move_target_unsuitable",
        details=details,
    )
    refusal.status = 422
    raise refusal


class Mover:
    """Runs moves (see the module docs).

    :param reconciler: the service's driver holds the two attempts meanwhile.
    :param contexts: the verified models (the moved replica's job inputs).
    :param ready_timeout: how long the target (or the restarted source) may take to be ready.
    """

    def __init__(
        self,
        *,
        reconciler: Reconciler,
        contexts: ModelContexts,
        ready_timeout: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reconciler = reconciler
        self.store = reconciler.store
        self.attempts = reconciler.attempts
        self.contexts = contexts
        self.ready_timeout = ready_timeout
        self.clock = clock
        #: Awaited with each step's name before it acts (see the module docs).
        self.hook: Callable[[str], Awaitable[None]] = _no_fault

    # -- pre-flight -----------------------------------------------------------------------

    async def _prepare(
        self,
        principal: Principal,
        service_id: str,
        index: int,
        node_id: str,
        gpu_index: int | None,
        revision: int | None,
    ) -> _Plan:
        current = await self.store.read(lambda tx: repository.service(tx, service_id))
        model = None
        if current is not None and current.project_id == principal.project_id:
            model = await self.contexts.get(principal.project_id, current.model_id)

        def read(tx: Transaction) -> _Plan:
            record = writable(tx, principal.project_id, service_id)
            if revision is not None:
                check_revision(record, revision)
            specification = record.specification()
            if record.desired != Desired.RUNNING:
                raise nothing_to_do("move", record, index, None, "not_running")
            if index >= len(specification.placements):
                raise nothing_to_do("move", record, index, None, "replica_not_found")
            if repository.rollout(tx, service_id) is not None:
                raise nothing_to_do("move", record, index, None, "rollout_in_progress")
            source_node = specification.placements[index].node_id
            details = operation_details("move", record, index, source_node)
            attempts = repository.attempts(tx, service_id)
            source = routed(attempts, record.generation, len(specification.placements)).get(index)
            if source is None or source.node_id != source_node:
                raise nothing_to_do("move", record, index, source_node, "replica_not_ready")
            if node_id == source_node:
                raise InvalidRequest(
                    f"replica {index} of {record.alias} already runs on node {node_id}; "
                    "name another target node",
                    code="move_target_is_source",
                    details={**details, "reason": "target_is_source"},
                )
            if contributors_repository.fetch_node(tx, node_id) is None:
                raise InvalidRequest(
                    f"no node {node_id!r} is registered; list them with 'ficc admin nodes'",
                    code="node_not_found",
                    details={**details, "reason": "target_not_found", "target": node_id},
                )
            placement = target_placement(
                specification.placements[index], node_id, gpu_index, details=details
            )
            placements = list(specification.placements)
            placements[index] = placement
            moved = attrs.evolve(specification, placements=tuple(placements))
            assert model is not None
            reservation = check_target(tx, record, moved, index, model)
            mine = [a.number for a in attempts if a.replica == index]
            target = self.attempts.new(record, moved, index, max(mine) + 1)
            return _Plan(
                record=record,
                specification=specification,
                moved=moved,
                source=source,
                target=target,
                reservation=reservation,
            )

        return await self.store.read(read)

    # -- the steps ----------------------------------------------------------------------------

    async def move(
        self,
        principal: Principal,
        service_id: str,
        index: int,
        *,
        target_node_id: str,
        target_gpu_index: int | None = None,
        start_after_move: bool = True,
        revision: int | None = None,
    ) -> MoveResult:
        """Move replica ``index`` of the running service to ``target_node_id``."""
        prepared = await self._prepare(
            principal, service_id, index, target_node_id, target_gpu_index, revision
        )
        run = _Run(self, prepared, start_after_move)
        return await run.go()

    async def settle(self, service_id: str) -> None:
        """Drop the reservations nothing needs any more (before an answer)."""
        await self.store.write(lambda tx: settle_reservations(tx, service_id))


class _Run:
    """One move in progress: its steps, their outcomes, and the rollback."""

    def __init__(self, mover: Mover, prepared: _Plan, start_after_move: bool) -> None:
        self.mover = mover
        self.plan = prepared
        self.start_after_move = start_after_move
        self.steps: list[Step] = []
        self.reconciler = mover.reconciler
        self.service_id = prepared.record.id
        self.source = prepared.source
        self.target = prepared.target

    def _result(self, final_state: str) -> MoveResult:
        return MoveResult(
            service_id=self.service_id,
            replica=self.target.replica,
            final_state=final_state,
            from_node=self.source.node_id,
            to_node=self.target.node_id,
            steps=tuple(self.steps),
        )

    async def _step(self, name: str, action: Callable[[], Awaitable[dict[str, Any]]]) -> bool:
        began = trio.current_time()
        try:
            await self.mover.hook(name)
            details = await action()
            ok = True
        except _StepFailed as exc:
            details, ok = exc.details, False
        except FiccError as exc:
            details, ok = {"error": exc.message, "code": exc.code, "raw_error": exc.details}, False
        except Exception as exc:  # an injected fault, or a defect: the move rolls back
            details, ok = {"error": f"{type(exc).__name__}: {exc}"}, False
        self.steps.append(Step(name, ok, (trio.current_time() - began) * 1000, details))
        return ok

    async def go(self) -> MoveResult:
        driver = await self.reconciler.driver_of(self.service_id)
        self.driver = driver
        driver.held |= {self.source.attempt_id, self.target.attempt_id}
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            try:
                return await self._forward()
            finally:
                driver.held -= {self.source.attempt_id, self.target.attempt_id}
                driver.dismissed.pop(self.source.attempt_id, None)
                nursery.cancel_scope.cancel()
                self.reconciler.wake(self.service_id)

    async def _forward(self) -> MoveResult:
        if not await self._step("deploy_target", self._deploy):
            return await self._rolled_back("failed")
        if not await self._step("wait_target_health", self._wait_target):
            return await self._rolled_back("failed")
        if not await self._step("stop_source", self._stop_source):
            self.driver.dismissed.pop(self.source.attempt_id, None)
            return await self._rolled_back("failed_rolled_back")
        if not await self._step("undeploy_source", self._undeploy_source):
            return await self._restarted("failed_rolled_back_source_restarted")
        if not await self._step("update_binding", self._bind):
            return await self._restarted("failed_rolled_back")
        await self.mover.settle(self.service_id)
        return self._result("moved")

    async def _deploy(self) -> dict[str, Any]:
        record, moved, target = self.plan.record, self.plan.moved, self.target
        reservation = self.plan.reservation
        now = self.mover.clock()

        def write(tx: Transaction) -> None:
            repository.insert_reservations(tx, [reservation], now)
            repository.insert_attempt(tx, target)
            repository.bump(tx, record.id, now)
            history.attempt_added(tx, record, target, None, now)

        await self.mover.store.write(write)
        await self.mover.attempts.start(record, moved, target)
        current = await self._found(target.attempt_id)
        if current.released:
            raise _StepFailed(
                {"error": current.message or current.reason, "reason": current.reason}
            )
        self.nursery.start_soon(self.mover.attempts.watch, current)
        return {"attempt_id": target.attempt_id, "reservation": reservation.to_json()}

    async def _wait_target(self) -> dict[str, Any]:
        if not self.start_after_move:
            return {"skipped": True}
        with trio.move_on_after(self.mover.ready_timeout):
            while True:
                current = await self._found(self.target.attempt_id)
                if current.state == AttemptState.READY:
                    return {"state": "ready", "attempt_id": current.attempt_id}
                if current.released:
                    raise _StepFailed(
                        {
                            "error": current.message or f"the target {current.state}",
                            "reason": current.reason,
                        }
                    )
                await trio.sleep(self.mover.attempts.loading_period)
        raise _StepFailed(
            {"error": f"the target was not ready within {self.mover.ready_timeout:g} s"}
        )

    async def _stop_source(self) -> dict[str, Any]:
        source_id = self.source.attempt_id
        self.driver.dismissed[source_id] = "moved"
        self.reconciler.wake(self.service_id)
        live = self.reconciler.live
        with trio.move_on_after(self.mover.ready_timeout):
            while True:
                view = live.get(self.service_id)
                if view is None or all(r.key != source_id for r in view.replicas):
                    break
                await live.changed(self.service_id).wait()
        began = trio.current_time()
        with trio.move_on_after(self.reconciler.drain_timeout):
            await self.reconciler.replica_idle(source_id)
        drained = trio.current_time() - began
        await self.reconciler.unwatch(self.driver, source_id)
        await self.mover.attempts.stop(await self._found(source_id), reason="moved")
        current = await self._found(source_id)
        if current.state not in (AttemptState.STOPPED, AttemptState.FAILED):
            raise _StepFailed({"error": f"the source is {current.state}", "state": current.state})
        return {"drained_s": round(drained, 3), "state": current.state}

    async def _undeploy_source(self) -> dict[str, Any]:
        current = await self._found(self.source.attempt_id)
        if not current.released:
            raise _StepFailed({"error": "the source's node has not confirmed its end"})
        return {"released": True, "reason": current.reason}

    async def _bind(self) -> dict[str, Any]:
        record, moved, index = self.plan.record, self.plan.moved, self.target.replica
        model = await self.mover.contexts.get(record.project_id, moved.model_id)
        now = self.mover.clock()
        source_key = (record.generation, index, self.source.node_id)

        def write(tx: Transaction) -> int:
            current = repository.service(tx, record.id)
            if current is None or current.generation != record.generation:
                raise _StepFailed({"error": "the service changed generation meanwhile"})
            specification = current.specification()
            placements = list(specification.placements)
            placements[index] = moved.placements[index]
            bound = attrs.evolve(specification, placements=tuple(placements))
            digest = plan_in(tx, record.id, bound, model, generation=record.generation).digest
            repository.update_service(
                tx, attrs.evolve(current, spec=_canonical(bound), plan_digest=digest), now
            )
            repository.delete_reservation_key(tx, record.id, source_key)
            after = repository.service(tx, record.id)
            assert after is not None
            record_event(
                tx,
                at=now,
                kind=EventKind.REPLICA_MOVED,
                subject=Subject.REPLICA,
                subject_id=f"{record.id}/{index}",
                service_id=record.id,
                project_id=record.project_id,
                node_id=self.target.node_id,
                attempt_id=self.target.attempt_id,
                replica=index,
                reason="moved",
                message=f"replica {index} moved from node {self.source.node_id} to node "
                f"{self.target.node_id}",
                details={
                    "from_node": self.source.node_id,
                    "to_node": self.target.node_id,
                    "revision": after.revision,
                },
            )
            return after.revision

        revision = await self.mover.store.write(write)
        return {"revision": revision, "node_id": self.target.node_id}

    # -- rollback -----------------------------------------------------------------------------

    async def _rollback_target(self) -> bool:
        """Stop the target; True once its node confirmed the end."""
        began = trio.current_time()
        ok = True
        details: dict[str, Any] = {}
        try:
            await self.mover.hook("rollback_target")
            current = await self._read(self.target.attempt_id)
            if current is not None and not current.released:
                await self.mover.attempts.stop(current, reason="move_rolled_back")
            current = await self._read(self.target.attempt_id)
            ok = current is None or current.released
            details = {"state": None if current is None else current.state}
        except Exception as exc:
            ok, details = False, {"error": f"{type(exc).__name__}: {exc}"}
        if not ok:
            # The driver keeps trying to stop it; both nodes need a look.
            self.driver.dismissed[self.target.attempt_id] = "move_rolled_back"
        self.steps.append(
            Step("rollback_target", ok, (trio.current_time() - began) * 1000, details)
        )
        return ok

    async def _rolled_back(self, final_state: str) -> MoveResult:
        ok = await self._rollback_target()
        await self.mover.settle(self.service_id)
        return self._result(final_state if ok else "failed_rollback_dirty")

    async def _restarted(self, final_state: str) -> MoveResult:
        """The source stopped: roll the target back and let the replica start again on
        its source node; wait until it serves there."""
        if not await self._rollback_target():
            await self.mover.settle(self.service_id)
            return self._result("failed_rollback_dirty")
        self.driver.held -= {self.source.attempt_id, self.target.attempt_id}
        self.reconciler.wake(self.service_id)
        ok = await self._step("restart_source", self._wait_source_again)
        await self.mover.settle(self.service_id)
        return self._result(final_state if ok else "failed_rollback_dirty")

    async def _wait_source_again(self) -> dict[str, Any]:
        record, index = self.plan.record, self.target.replica
        with trio.move_on_after(self.mover.ready_timeout):
            while True:
                attempts = await self.mover.store.read(
                    lambda tx: repository.attempts(tx, record.id)
                )
                count = len(self.plan.specification.placements)
                serving = routed(attempts, record.generation, count).get(index)
                if serving is not None and serving.node_id == self.source.node_id:
                    return {"attempt_id": serving.attempt_id, "node_id": serving.node_id}
                await trio.sleep(self.mover.attempts.loading_period)
        raise _StepFailed({"error": "the replica did not serve again on its source node"})

    async def _read(self, attempt_id: str) -> AttemptRecord | None:
        return await self.mover.store.read(lambda tx: repository.attempt(tx, attempt_id))

    async def _found(self, attempt_id: str) -> AttemptRecord:
        found = await self._read(attempt_id)
        if found is None:
            raise _StepFailed({"error": f"attempt {attempt_id} is no longer on record"})
        return found


def _canonical(specification: Specification) -> str:
    return canonical_json(specification).decode("utf-8")


async def bulk_move(
    mover: Mover,
    principal: Principal,
    items: list[tuple[str, int]],
    *,
    target_node_id: str,
    target_gpu_index: int | None = None,
    start_after_move: bool = True,
) -> dict[str, Any]:
    """Move each ``(service_id, replica)`` to one target, one after the other; a refused
    or failed item never stops the rest."""
    results: list[dict[str, Any]] = []
    for service_id, replica in items:
        item: dict[str, Any] = {"service_id": service_id, "replica": replica}
        try:
            result = await mover.move(
                principal,
                service_id,
                replica,
                target_node_id=target_node_id,
                target_gpu_index=target_gpu_index,
                start_after_move=start_after_move,
            )
        except FiccError as exc:
            item.update(
                ok=False,
                error={
                    "status": exc.status,
                    "code": exc.code,
                    "message": exc.message,
                    "details": exc.details,
                },
            )
        else:
            item.update(ok=result.ok, response=result.to_json())
        results.append(item)
    moved = sum(1 for item in results if item["ok"])
    return {
        "total": len(results),
        "moved_count": moved,
        "failed_count": len(results) - moved,
        "items": results,
    }
