"""Events: every state change of a service, replica, attempt and node, as a record.

An event is written by :func:`record` inside the transaction that makes its change,
so it exists exactly when the change committed; once that transaction commits, the
event is logged at INFO on the ``ficc.events`` logger (one line). Events are kept
with a bounded retention (:class:`EventRetention`, off the request path) and read
by service (:func:`for_service`, inside the reader's own transaction: a service's
history is inference's to compose) or by node (:mod:`.repository`).
"""

from __future__ import annotations

from .recorder import LOGGER_NAME, describe, record
from .records import Event, EventKind, Subject
from .repository import for_service
from .retention import EventRetention

__all__ = [
    "LOGGER_NAME",
    "Event",
    "EventKind",
    "EventRetention",
    "Subject",
    "describe",
    "for_service",
    "record",
]
