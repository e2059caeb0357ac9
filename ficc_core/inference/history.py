"""What each change of a service or of one of its attempts says as an event.

The writers that make the changes (:mod:`.reconciliation.observed` for what the reconciler
observes, :mod:`.manager` for what operators ask) call these inside their own
transaction with the record before and after, so every change is an event exactly
when it commits (:func:`ficc_core.events.record`). Reading a service's events
includes the state changes of the nodes its attempts ran on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import events
from ..events import Event, EventKind, Subject, record
from ..store import Transaction
from .records import AttemptRecord, ServiceRecord

#: The most events one read returns.
MAX_LIMIT = 500


def service_event(
    tx: Transaction,
    service: ServiceRecord,
    kind: EventKind,
    now: float,
    *,
    reason: str | None,
    message: str,
    details: Mapping[str, Any],
) -> Event:
    """An event about the service itself."""
    return record(
        tx,
        at=now,
        kind=kind,
        subject=Subject.SERVICE,
        subject_id=service.id,
        service_id=service.id,
        project_id=service.project_id,
        reason=reason,
        message=message,
        details={"revision": service.revision, "generation": service.generation, **details},
    )


def _moved(old: Any, new: Any) -> dict[str, Any]:
    return {"from": None if old is None else str(old), "to": None if new is None else str(new)}


def service_changed(
    tx: Transaction,
    old: ServiceRecord,
    new: ServiceRecord,
    now: float,
    *,
    action: str | None = None,
    actor: str | None = None,
) -> Event | None:
    """The service went from ``old`` to ``new``: one event, when its desired state, its
    state or its reason changed (``action``: the operator's control action)."""
    if (old.desired, old.state, old.reason) == (new.desired, new.state, new.reason):
        return None
    details: dict[str, Any] = {"state": _moved(old.state, new.state)}
    if old.desired != new.desired or action is not None:
        details["desired"] = _moved(old.desired, new.desired)
        details["action"] = action
        if actor is not None:
            details["actor"] = actor
        message = f"{action or 'desired'}: {old.desired} → {new.desired}, state {new.state}"
        return service_event(
            tx, new, EventKind.SERVICE_DESIRED, now, reason=action, message=message, details=details
        )
    # A service's reason is a sentence: it goes in the message (and the details), not
    # in the event's reason, which stays a word.
    details["reason"] = new.reason
    if old.reason != new.reason:
        details["previous_reason"] = old.reason
    message = f"state {old.state} → {new.state}" if old.state != new.state else f"{new.state}"
    if new.reason:
        message += f": {new.reason}"
    elif old.reason:
        message += f"; the reason cleared (was: {old.reason})"
    return service_event(
        tx, new, EventKind.SERVICE_STATE, now, reason=None, message=message, details=details
    )


def _attempt_details(attempt: AttemptRecord) -> dict[str, Any]:
    return {"generation": attempt.generation, "number": attempt.number}


def _attempt_event(
    tx: Transaction,
    service: ServiceRecord | None,
    attempt: AttemptRecord,
    kind: EventKind,
    now: float,
    *,
    subject: Subject,
    reason: str | None,
    message: str,
    details: dict[str, Any],
) -> Event:
    return record(
        tx,
        at=now,
        kind=kind,
        subject=subject,
        subject_id=(
            attempt.attempt_id
            if subject == Subject.ATTEMPT
            else f"{attempt.service_id}/{attempt.replica}"
        ),
        service_id=attempt.service_id,
        project_id=None if service is None else service.project_id,
        node_id=attempt.node_id,
        attempt_id=attempt.attempt_id,
        replica=attempt.replica,
        reason=reason,
        message=message,
        details={**_attempt_details(attempt), **details},
    )


def attempt_added(
    tx: Transaction,
    service: ServiceRecord | None,
    attempt: AttemptRecord,
    previous: AttemptRecord | None,
    now: float,
) -> Event:
    """A new attempt: the replica's first of its generation, or a relaunch after
    ``previous`` ended (``replica.restarted``, naming how it ended)."""
    where = f"on node {attempt.node_id}"
    if previous is None:
        return _attempt_event(
            tx,
            service,
            attempt,
            EventKind.ATTEMPT_CREATED,
            now,
            subject=Subject.ATTEMPT,
            reason=None,
            message=f"replica {attempt.replica} attempt {attempt.number} {where}",
            details={"state": str(attempt.state)},
        )
    ended = f"{previous.state}" + (f" ({previous.reason})" if previous.reason else "")
    return _attempt_event(
        tx,
        service,
        attempt,
        EventKind.REPLICA_RESTARTED,
        now,
        subject=Subject.REPLICA,
        reason=previous.reason or str(previous.state),
        message=f"replica {attempt.replica} relaunched as attempt {attempt.number} {where} "
        f"after attempt {previous.number} {ended}",
        details={
            "restarts": attempt.number - 1,
            "previous": {
                "attempt_id": previous.attempt_id,
                "number": previous.number,
                "node_id": previous.node_id,
                "state": str(previous.state),
                "reason": previous.reason,
                "message": previous.message,
            },
        },
    )


def attempt_changed(
    tx: Transaction,
    service: ServiceRecord | None,
    old: AttemptRecord,
    new: AttemptRecord,
    now: float,
) -> Event | None:
    """The attempt went from ``old`` to ``new``: an event when its state, reason or
    release changed (not for its launch details)."""
    if (old.state, old.reason, old.released) == (new.state, new.reason, new.released):
        return None
    message = f"replica {new.replica} attempt {new.number}: "
    message += f"{old.state} → {new.state}" if old.state != new.state else f"{new.state}"
    if new.released and not old.released:
        message += ", released"
    if new.message and (new.message != old.message or new.state != old.state):
        message += f": {new.message}"
    return _attempt_event(
        tx,
        service,
        new,
        EventKind.ATTEMPT_STATE,
        now,
        subject=Subject.ATTEMPT,
        reason=new.reason,
        message=message,
        details={
            "state": _moved(old.state, new.state),
            "released": new.released,
            "message": new.message,
        },
    )


def read(
    tx: Transaction,
    service: ServiceRecord,
    node_ids: set[str],
    *,
    after: int | None,
    limit: int,
    before: int | None = None,
) -> list[Event]:
    """The service's events with its nodes' since it was created, oldest first."""
    return events.for_service(
        tx,
        service.id,
        node_ids=sorted(node_ids),
        nodes_since=service.created_at,
        after=after,
        before=before,
        limit=min(limit, MAX_LIMIT),
    )


__all__ = ["MAX_LIMIT", "attempt_added", "attempt_changed", "read", "service_changed"]
