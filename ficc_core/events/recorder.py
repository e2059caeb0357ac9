"""Recording an event in the transaction that makes its change, and logging it after.

:func:`record` writes the event with the change (the same transaction: the event
exists exactly when the change committed) and asks the transaction to log it once
it has committed: one INFO line on the ``ficc.events`` logger per event, never one
for a change that rolled back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..store import Transaction
from . import repository
from .records import Event, EventKind, Subject

LOGGER_NAME = "ficc.events"
log = logging.getLogger(LOGGER_NAME)


def describe(event: Event) -> str:
    """The event as one readable line: kind, subject, reason, message."""
    reason = f" ({event.reason})" if event.reason else ""
    message = f": {event.message}" if event.message else ""
    return f"{event.kind} {event.subject} {event.subject_id}{reason}{message}"


def record(
    tx: Transaction,
    *,
    at: float,
    kind: EventKind,
    subject: Subject,
    subject_id: str,
    service_id: str | None = None,
    project_id: str | None = None,
    node_id: str | None = None,
    attempt_id: str | None = None,
    replica: int | None = None,
    reason: str | None = None,
    message: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> Event:
    """Write an event inside ``tx`` (the change's own transaction); log it after commit."""
    event = repository.insert(
        tx,
        Event(
            id=0,
            at=at,
            kind=kind,
            subject=subject,
            subject_id=subject_id,
            service_id=service_id,
            project_id=project_id,
            node_id=node_id,
            attempt_id=attempt_id,
            replica=replica,
            reason=reason,
            message=message,
            details=dict(details or {}),
        ),
    )
    tx.after_commit(lambda: log.info("%s", describe(event)))
    return event


__all__ = ["LOGGER_NAME", "describe", "record"]
