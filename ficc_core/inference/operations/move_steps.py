"""The steps of one move in progress, their outcomes and their rollback.

:mod:`~ficc_core.inference.operations.moves` checks a move and plans it (:class:`MovePlan`);
:class:`MoveRun` runs its five steps and answers with a :class:`MoveResult` (see
that module for what each step and each final state means).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ...base.errors import FiccError
from ...contributors import set_unwanted
from ...contributors.records import AssignmentReason, NodeState
from ...events import EventKind, Subject
from ...events import record as record_event
from ...schema import canonical_json
from ...store import Transaction
from .. import history, repository
from ..reconciliation.publication import ROLLED_BACK, routed
from ..records import ENDED, AttemptRecord, AttemptState, Reservation, ServiceRecord
from ..specification.admission import plan_in

if TYPE_CHECKING:
    from ...schema import Specification
    from ..reconciliation.reconciler import _Driver as Driver
    from .moves import Mover


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
class MovePlan:
    record: ServiceRecord
    specification: Specification
    moved: Specification
    source: AttemptRecord
    target: AttemptRecord
    reservation: Reservation
    #: ``unreachable``, ``lost`` or ``revoked`` when the source's node will not answer:
    #: the source is given up instead of drained and stopped (see
    #: :mod:`~ficc_core.inference.operations.moves`).
    source_gone: NodeState | None = None


class StepFailed(Exception):
    def __init__(self, details: dict[str, Any]) -> None:
        super().__init__(details.get("error", "failed"))
        self.details = details


class MoveRun:
    """One move in progress: its steps, their outcomes, and the rollback."""

    def __init__(self, mover: Mover, prepared: MovePlan, start_after_move: bool) -> None:
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
        except StepFailed as exc:
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
                if self.plan.source_gone is not None:
                    # Its replica task ended (an unknown outcome) or keeps failing to
                    # launch on the dead node: the one the driver starts next waits
                    # while the move holds the replica, then follows what it left.
                    await end_replica_task(driver, self.target.generation, self.target.replica)
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

        def write(tx: Transaction) -> AttemptRecord:
            # Numbered past every attempt of the replica, one launched meanwhile too.
            numbers = [
                a.number for a in repository.attempts(tx, record.id) if a.replica == target.replica
            ]
            chosen = target
            if numbers and max(numbers) >= target.number:
                chosen = self.mover.attempts.new(record, moved, target.replica, max(numbers) + 1)
            repository.insert_reservations(tx, [reservation], now)
            repository.insert_attempt(tx, chosen)
            repository.bump(tx, record.id, now)
            history.attempt_added(tx, record, chosen, None, now)
            return chosen

        chosen = await self.mover.store.write(write)
        if chosen is not target:
            self.driver.held.discard(target.attempt_id)
            self.driver.held.add(chosen.attempt_id)
            self.target = target = chosen
        await self.mover.attempts.start(record, moved, target)
        current = await self._found(target.attempt_id)
        if current.released:
            raise StepFailed({"error": current.message or current.reason, "reason": current.reason})
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
                if current.state == AttemptState.UNKNOWN:
                    # Its node was lost: it will not be ready, and an unknown attempt is
                    # never released by itself (the rollback leaves it to the driver).
                    raise StepFailed(
                        {
                            "error": f"the target's node {current.node_id} was lost; its "
                            "outcome is unknown",
                            "reason": "unknown",
                        }
                    )
                if current.released:
                    raise StepFailed(
                        {
                            "error": current.message or f"the target {current.state}",
                            "reason": current.reason,
                        }
                    )
                await trio.sleep(self.mover.attempts.loading_period)
        raise StepFailed(
            {"error": f"the target was not ready within {self.mover.ready_timeout:g} s"}
        )

    async def _stop_source(self) -> dict[str, Any]:
        if self.plan.source_gone is not None:
            return await self._end_gone_source(self.plan.source_gone)
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
            raise StepFailed({"error": f"the source is {current.state}", "state": current.state})
        return {"drained_s": round(drained, 3), "state": current.state}

    async def _end_gone_source(self, gone: NodeState) -> dict[str, Any]:
        """The source's node is unreachable, lost or revoked: nothing is routed there,
        nothing drains, nothing waits on its node. An attempt that ended stays as it is;
        one still unreleased is stopped if its node is connected again, else given up
        (its outcome unknown): its node stops it if it ever connects again."""
        source_id = self.source.attempt_id
        current = await self._found(source_id)
        if not current.released and self.mover.attempts.contributors.connected_here(
            current.node_id
        ):
            await self.mover.attempts.stop(current, reason="moved")
            current = await self._found(source_id)
        given_up = False
        if not current.released:
            now = self.mover.clock()
            message = (
                f"node {current.node_id} is {gone}; the move to node {self.target.node_id} "
                "gave this attempt up (its node stops it if it ever connects again)"
            )
            # A lost node's attempt is unknown already (acknowledged by the move); a
            # silent node's becomes so: whether it still runs there nobody knows.
            why = (
                AssignmentReason.GIVEN_UP
                if gone == NodeState.UNREACHABLE
                else AssignmentReason.ACKNOWLEDGED_UNKNOWN
            )

            def write(tx: Transaction) -> None:
                before = repository.attempt(tx, source_id)
                if before is None or before.released:
                    return
                set_unwanted(tx, before.node_id, source_id, why, now)
                state = before.state if before.state in ENDED else AttemptState.UNKNOWN
                after = attrs.evolve(
                    before, state=state, released=True, reason="moved", message=message
                )
                repository.update_attempt(tx, after, now)
                repository.bump(tx, before.service_id, now)
                service = repository.service(tx, before.service_id)
                history.attempt_changed(tx, service, before, after, now)

            await self.mover.store.write(write)
            current = await self._found(source_id)
            given_up = True
        return {
            "node_state": str(gone),
            "state": str(current.state),
            "reason": current.reason,
            "given_up": given_up,
        }

    async def _undeploy_source(self) -> dict[str, Any]:
        current = await self._found(self.source.attempt_id)
        if not current.released:
            raise StepFailed({"error": "the source's node has not confirmed its end"})
        return {"released": True, "reason": current.reason}

    async def _bind(self) -> dict[str, Any]:
        record, moved, index = self.plan.record, self.plan.moved, self.target.replica
        model = await self.mover.contexts.get(record.project_id, moved.model_id)
        now = self.mover.clock()
        source_key = (record.generation, index, self.source.node_id)

        def write(tx: Transaction) -> int:
            current = repository.service(tx, record.id)
            if current is None or current.generation != record.generation:
                raise StepFailed({"error": "the service changed generation meanwhile"})
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
                await self.mover.attempts.stop(current, reason=ROLLED_BACK)
            current = await self._read(self.target.attempt_id)
            if current is not None and current.released and current.reason != ROLLED_BACK:
                # It ended by itself (failed, its node revoked): it still never stood for
                # the replica, which its reason says (publication.latest skips it).
                await self.mover.attempts.observations.set_attempt(
                    self.service_id, current.attempt_id, reason=ROLLED_BACK
                )
                current = await self._read(self.target.attempt_id)
            ok = current is None or current.released
            details = {"state": None if current is None else current.state}
        except Exception as exc:
            ok, details = False, {"error": f"{type(exc).__name__}: {exc}"}
        if not ok:
            # The driver keeps trying to stop it; both nodes need a look.
            self.driver.dismissed[self.target.attempt_id] = ROLLED_BACK
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
        if self.plan.source_gone is not None:
            # Its node is gone: the replica cannot start there again.
            await self.mover.settle(self.service_id)
            return self._result("failed_rolled_back")
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
        raise StepFailed({"error": "the replica did not serve again on its source node"})

    async def _read(self, attempt_id: str) -> AttemptRecord | None:
        return await self.mover.store.read(lambda tx: repository.attempt(tx, attempt_id))

    async def _found(self, attempt_id: str) -> AttemptRecord:
        found = await self._read(attempt_id)
        if found is None:
            raise StepFailed({"error": f"attempt {attempt_id} is no longer on record"})
        return found


async def end_replica_task(driver: Driver, generation: int, index: int) -> None:
    """End replica ``index``'s task (the driver starts another at its next step)."""
    task = driver.replicas.get((generation, index))
    if task is not None:
        task.scope.cancel()
        await task.done.wait()
        if driver.replicas.get((generation, index)) is task:
            del driver.replicas[(generation, index)]


def _canonical(specification: Specification) -> str:
    return canonical_json(specification).decode("utf-8")
