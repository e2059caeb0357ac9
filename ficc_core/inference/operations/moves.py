"""Moving one replica of a running service to another node, without an outage.

Five steps, as operators of other clusters know them: ``deploy_target`` (reserve
the target beside everything else and launch the replica's next attempt there),
``wait_target_health`` (until it is ready; the source serves meanwhile),
``stop_source`` (the source leaves the routing view, its in-flight requests finish
within the drain bound, then its node stops it), ``undeploy_source`` (its node
confirmed the end: the attempt is released) and ``update_binding`` (the placement
and the reservations in one transaction; the revision moves on). The answer says
how it ended (:data:`FINAL_STATES`) and what each step did.

A replica whose node is unreachable (or not connected to this controller), lost or
revoked moves too (it is the way off a silent or dead node): its last attempt there
is the source, nothing drains, and
``stop_source`` ends it without waiting on its node: an attempt already released
stays as it is, any other is given up (released, reason ``moved``, its outcome
``unknown``; its node stops it if it ever connects again). A failure after that
cannot start the replica again on its source node: the target is rolled back and
the move ends ``failed_rolled_back``.

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

from ...base.errors import FiccError, InvalidRequest
from ...contributors import fetch_node
from ...contributors.records import NodeState
from ...store import Transaction
from .. import repository
from ..reconciliation.generations import settle_reservations
from ..reconciliation.publication import routed
from ..records import AttemptRecord, Desired, PlacementNode, Reservation, ServiceRecord
from ..specification.placement import plan, staged_on
from ..specification.tiers import TierMismatch, check_node
from ..specification.transitions import check_revision, writable
from .move_steps import MovePlan, MoveResult, MoveRun
from .refusals import nothing_to_do, operation_details

if TYPE_CHECKING:
    from ...auth import Principal
    from ...schema import Placement, Specification
    from ..reconciliation.reconciler import Reconciler
    from ..specification.model_context import ModelContext, ModelContexts

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
    reservation held (the service's own too: its source stays held until the move ends).

    A target node where another replica of the service already holds the model's staged
    copy needs no disk for it again."""
    placement = moved.placements[index]
    node_id = placement.node_id
    one = attrs.evolve(moved, placements=(placement,))
    node = fetch_node(tx, node_id)
    nodes = {} if node is None else {node_id: PlacementNode.of(node)}
    existing = repository.reservations_but(tx, "")
    result = plan(
        record.id,
        one,
        nodes,
        existing,
        model_bytes=model.size,
        model_revision=model.record.revision,
        generation=record.generation,
        staged=staged_on(existing, record.id, record.generation),
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


def source_gone(tx: Transaction, node_id: str) -> NodeState | None:
    """``unreachable``, ``lost`` or ``revoked`` when the replica's node will not answer
    (or is no longer registered: revoked, as far as the move goes); None while it may
    still serve."""
    node = fetch_node(tx, node_id)
    if node is None:
        return NodeState.REVOKED
    if node.state in (NodeState.UNREACHABLE, NodeState.LOST, NodeState.REVOKED):
        return node.state
    return None


def last_attempt(
    attempts: list[AttemptRecord], generation: int, index: int, node_id: str
) -> AttemptRecord | None:
    """Replica ``index``'s newest attempt of ``generation`` on ``node_id``, if any."""
    mine = [
        a
        for a in attempts
        if a.generation == generation and a.replica == index and a.node_id == node_id
    ]
    return mine[-1] if mine else None


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
    ) -> MovePlan:
        current = await self.store.read(lambda tx: repository.service(tx, service_id))
        model = None
        if current is not None and current.project_id == principal.project_id:
            model = await self.contexts.get(principal.project_id, current.model_id)

        def read(tx: Transaction) -> MovePlan:
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
            gone = source_gone(tx, source_node)
            if gone is None and not self.attempts.contributors.connected_here(source_node):
                # Its connection dropped (it is not unreachable yet): nothing reaches it
                # to drain or stop the source, so it is given up as an unreachable one's.
                gone = NodeState.UNREACHABLE
            if gone is None:
                count = len(specification.placements)
                source = routed(attempts, record.generation, count).get(index)
            else:
                # Its node is silent or gone: nothing is routed there and nothing is
                # waited on. The replica's last attempt there is the source; the move
                # gives it up (stop_source).
                source = last_attempt(attempts, record.generation, index, source_node)
            if source is None or source.node_id != source_node:
                raise nothing_to_do("move", record, index, source_node, "replica_not_ready")
            if node_id == source_node:
                raise InvalidRequest(
                    f"replica {index} of {record.alias} already runs on node {node_id}; "
                    "name another target node",
                    code="move_target_is_source",
                    details={**details, "reason": "target_is_source"},
                )
            target_node = fetch_node(tx, node_id)
            if target_node is None:
                raise InvalidRequest(
                    f"no node {node_id!r} is registered; list them with 'ficc admin list-nodes'",
                    code="node_not_found",
                    details={**details, "reason": "target_not_found", "target": node_id},
                )
            placement = target_placement(
                specification.placements[index], node_id, gpu_index, details=details
            )
            placements = list(specification.placements)
            placements[index] = placement
            moved = attrs.evolve(specification, placements=tuple(placements))
            try:
                check_node(target_node, moved, action="move")
            except TierMismatch as exc:
                exc.details = {**details, **exc.details, "node": target_node.name}
                raise
            assert model is not None
            reservation = check_target(tx, record, moved, index, model)
            mine = [a.number for a in attempts if a.replica == index]
            target = self.attempts.new(record, moved, index, max(mine) + 1)
            return MovePlan(
                record=record,
                specification=specification,
                moved=moved,
                source=source,
                target=target,
                reservation=reservation,
                source_gone=gone,
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
        run = MoveRun(self, prepared, start_after_move)
        return await run.go()

    async def settle(self, service_id: str) -> None:
        """Drop the reservations nothing needs any more (before an answer)."""
        await self.store.write(lambda tx: settle_reservations(tx, service_id))


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
