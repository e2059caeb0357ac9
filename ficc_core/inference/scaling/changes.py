"""Scaled services: the transactions that change which placements run.

A service whose specification has ``scaling`` runs replicas on some of its placements
(its *candidates*): the service record's ``active`` indices, at most ``max`` of them
(:func:`~ficc_core.inference.specification.replicas.running_indices` says which).
The changes are transactions over the record and its reservations, each with its
``service.scaled`` event (reason and figures):

- :func:`grow` takes the reservation of the first candidate that fits beside
  everything held now and adds it to ``active`` (an activation, a scale-out, ``min``);
- :func:`shrink` takes one index out of ``active`` (scale-in, idle, a failed
  activation); its attempt retires through the reconciler and its reservation goes
  once the executor confirmed the end
  (:mod:`~ficc_core.inference.reconciliation.generations`);
- :func:`set_pin` pins (never scaled to zero) or unpins.

The autoscaler (:mod:`~ficc_core.inference.scaling.autoscaler`) decides when.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...base.errors import FiccError
from ...events import EventKind
from ...store import Transaction
from .. import history, repository
from ..records import Desired, ServiceRecord
from ..specification.placement import plan, staged_on
from ..specification.replicas import running_indices

if TYPE_CHECKING:
    from ..specification.model_context import ModelContext


class NoCapacity(FiccError):
    """No candidate placement of a scaled service fits beside what is held now."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, code="no_capacity", status=503, **kwargs)


def _event(
    tx: Transaction,
    record: ServiceRecord,
    reason: str,
    message: str,
    now: float,
    details: Mapping[str, Any],
) -> None:
    after = repository.service(tx, record.id)
    assert after is not None
    history.service_event(
        tx, after, EventKind.SERVICE_SCALED, now, reason=reason, message=message, details=details
    )


def grow(
    tx: Transaction,
    record: ServiceRecord,
    model: ModelContext,
    *,
    reason: str,
    now: float,
    figures: Mapping[str, Any] | None = None,
    only_when_idle: bool = False,
) -> int | None:
    """Start one more replica of the running scaled service ``record`` (read in ``tx``):
    the first candidate placement not running whose reservation fits beside everything
    held now. Returns its index; None when ``max`` already run (or, ``only_when_idle``,
    when one already runs: an activation already under way). Raises :class:`NoCapacity`
    (every candidate's reasons in its details) when none fits."""
    specification = record.specification()
    active = running_indices(specification, record.active)
    if record.desired != Desired.RUNNING or len(active) >= specification.max_replicas:
        return None
    if only_when_idle and active:
        return None
    placements = specification.placements
    candidates = [i for i in range(len(placements)) if i not in active]
    own = repository.reservations(tx, record.id)
    held = {r.key for r in own}
    # A candidate still holding its reservation (its replica was just scaled in and has
    # not ended yet) is the first choice: it fits by definition, and holds it on.
    kept = [i for i in candidates if (record.generation, i, placements[i].node_id) in held]
    if kept:
        index, node_id = kept[0], placements[kept[0]].node_id
    else:
        result = plan(
            record.id,
            specification,
            repository.placement_nodes(tx, [placements[i].node_id for i in candidates]),
            repository.reservations_but(tx, record.id) + own,
            model_bytes=model.size,
            model_revision=model.record.revision,
            generation=record.generation,
            held=candidates,
            cumulative=False,
            staged=staged_on(own, record.id, record.generation),
        )
        chosen = next((r for r in result.replicas if r.held and r.fits), None)
        if chosen is None:
            reasons = result.reasons()
            first = reasons[0]["message"] if reasons else "no candidate placement is free"
            raise NoCapacity(
                f"service {record.alias!r} cannot start another replica: no candidate "
                f"placement fits ({first})",
                details={"service": record.id, "reason": reason, "reasons": reasons},
            )
        index, node_id = chosen.index, chosen.node_id
        repository.insert_reservations(tx, [chosen.reservation], now)
    after = (*active, index)
    # An activation (only_when_idle) wakes the service: no cooldown starts.
    repository.set_scale(tx, record.id, after, now, woken=only_when_idle)
    _event(
        tx,
        record,
        reason,
        f"replica {index} starts on node {node_id} ({reason}); "
        f"{len(after)} of at most {specification.max_replicas} run",
        now,
        {
            "direction": "out",
            "placement": index,
            "node_id": node_id,
            "replicas_before": len(active),
            "replicas_after": len(after),
            **(figures or {}),
        },
    )
    return index


def shrink(
    tx: Transaction,
    record: ServiceRecord,
    index: int,
    *,
    reason: str,
    now: float,
    message: str | None = None,
    figures: Mapping[str, Any] | None = None,
) -> bool:
    """Stop the replica on placement ``index`` of the scaled service ``record`` (read in
    ``tx``). False when it does not run."""
    specification = record.specification()
    active = running_indices(specification, record.active)
    if index not in active:
        return False
    after = tuple(i for i in active if i != index)
    repository.set_scale(tx, record.id, after, now)
    _event(
        tx,
        record,
        reason,
        message
        or f"replica {index} drains and stops ({reason}); {len(after)} of at most "
        f"{specification.max_replicas} run",
        now,
        {
            "direction": "in",
            "placement": index,
            "replicas_before": len(active),
            "replicas_after": len(after),
            **(figures or {}),
        },
    )
    return True


def set_pin(tx: Transaction, record: ServiceRecord, pinned: bool, actor: str, now: float) -> bool:
    """Pin or unpin ``record``; False when it already was."""
    if record.pinned == pinned:
        return False
    repository.set_pinned(tx, record.id, pinned, now)
    word = "pinned" if pinned else "unpinned"
    _event(
        tx,
        record,
        word,
        f"service {record.alias} {word}"
        + (": it is never scaled to zero" if pinned else ": it may be scaled to zero again"),
        now,
        {"actor": actor, "pinned": pinned},
    )
    return True


__all__ = ["NoCapacity", "grow", "set_pin", "shrink"]
