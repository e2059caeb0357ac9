"""The rules of a service's transitions, checked inside the transaction that records them.

Every operator write names the revision it read (:func:`check_revision`); a stopped
service can be replaced or started only once its executors confirmed every attempt
ended (:func:`require_released`), and attempts whose outcome is unknown only with
an acknowledgement (:func:`start_in`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ...base.errors import Conflict
from ...contributors.records import AssignmentReason
from ...store import Transaction
from .. import repository
from ..errors import StaleRevision, UnknownOutcome, service_not_found
from ..records import AttemptState, Desired, ServiceRecord, ServiceState
from .admission import reserve
from .replicas import initial

if TYPE_CHECKING:
    from ...schema import Specification
    from .model_context import ModelContext


def writable(tx: Transaction, project_id: str, service_id: str) -> ServiceRecord:
    """The project's service ``service_id``, refused when missing or being removed."""
    record = repository.service(tx, service_id)
    if record is None or record.project_id != project_id:
        raise service_not_found(service_id)
    if record.desired == Desired.REMOVED:
        raise Conflict(
            f"service {service_id!r} is being removed",
            code="service_removing",
            details={"state": record.state},
        )
    return record


def check_revision(record: ServiceRecord, revision: int) -> None:
    """Refuse a write that read another revision than the current one."""
    if record.revision != revision:
        raise StaleRevision(
            f"service {record.id!r} is at revision {record.revision}, not {revision}; read it "
            "again and retry with the current revision",
            details={"revision": record.revision, "requested": revision},
        )


def require_stopped(record: ServiceRecord, what: str) -> None:
    """Refuse ``what`` (replace, start) unless the service is stopped and wants to be."""
    if record.desired != Desired.STOPPED or record.state != ServiceState.STOPPED:
        raise Conflict(
            f"service {record.id!r} is {record.state}; stop it before you {what} it",
            code="invalid_transition",
            details={"desired": record.desired, "state": record.state},
        )


def require_released(tx: Transaction, service_id: str, *, acknowledge: bool) -> None:
    """Refuse while an attempt may still run: ended unconfirmed, or unknown unacknowledged."""
    attempts = repository.unreleased_attempts(tx, service_id)
    unknown = [a for a in attempts if a.state == AttemptState.UNKNOWN]
    busy = [a for a in attempts if a.state != AttemptState.UNKNOWN]
    if busy:
        raise Conflict(
            f"service {service_id!r} still has {len(busy)} attempt(s) its executors have "
            "not confirmed ended; wait for them to stop",
            code="attempts_not_released",
            details={"attempts": [a.attempt_id for a in busy]},
        )
    if unknown and not acknowledge:
        raise UnknownOutcome(
            f"service {service_id!r} had {len(unknown)} replica(s) whose outcome is unknown "
            "(their node was lost while they ran); they may still be running or may have "
            "served requests. Start with acknowledge_unknown: true to give them up and "
            "start new attempts (no earlier request is replayed)",
            details={
                "attempts": [
                    {
                        "attempt_id": a.attempt_id,
                        "replica": a.replica,
                        "node_id": a.node_id,
                        "generation": a.generation,
                    }
                    for a in unknown
                ]
            },
        )


def next_generation(tx: Transaction, record: ServiceRecord) -> int:
    """The generation a start or a rollout begins: past every generation an attempt or a
    reservation of the service ever had (an abandoned rollout's included), so a new one
    never inherits another's attempts."""
    seen = [record.generation]
    seen += [a.generation for a in repository.attempts(tx, record.id)]
    seen += [r.generation for r in repository.reservations(tx, record.id)]
    return max(seen) + 1


def start_in(
    tx: Transaction,
    record: ServiceRecord,
    specification: Specification,
    model: ModelContext,
    *,
    acknowledge: bool,
    now: float,
) -> None:
    """Start the stopped service's next generation, placing it again."""
    require_stopped(record, "start")
    require_released(tx, record.id, acknowledge=acknowledge)
    if acknowledge:
        # Give up every attempt whose end was never confirmed: its node stops it if it
        # ever reconnects, and nothing it served is replayed.
        repository.give_up_attempts(tx, record.id, AssignmentReason.ACKNOWLEDGED_UNKNOWN, now)
    generation = next_generation(tx, record)
    repository.delete_rollout(tx, record.id)
    active = initial(specification, record.pinned)
    result = reserve(
        tx, record.id, specification, model, now, generation=generation, action="start", held=active
    )
    repository.set_scale(tx, record.id, active, now, decided=False, bump=False)
    repository.update_service(
        tx,
        attrs.evolve(
            record,
            generation=generation,
            plan_digest=result.digest,
            desired=Desired.RUNNING,
            state=ServiceState.STARTING,
            reason=None,
        ),
        now,
    )
