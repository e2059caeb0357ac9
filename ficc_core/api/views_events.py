"""The JSON view of events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..events import Event


def event_view(event: Event) -> dict[str, Any]:
    """One event as the API shows it."""
    return {
        "id": event.id,
        "at": event.at,
        "kind": str(event.kind),
        "subject": str(event.subject),
        "subject_id": event.subject_id,
        "service_id": event.service_id,
        "node_id": event.node_id,
        "attempt_id": event.attempt_id,
        "replica": event.replica,
        "reason": event.reason,
        "message": event.message,
        "details": event.details,
    }


def events_view(events: Sequence[Event], after: int | None, limit: int) -> dict[str, Any]:
    """A page of events, oldest first, and the cursor to read on from (``next_after``)."""
    return {
        "events": [event_view(event) for event in events],
        "next_after": events[-1].id if events else after,
        "limit": limit,
    }


__all__ = ["event_view", "events_view"]
