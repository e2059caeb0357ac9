"""What an event says: when, what kind of change, of which subject, why, with details."""

from __future__ import annotations

import enum
from typing import Any

import attrs


class EventKind(enum.StrEnum):
    """The kinds of change, as stable dotted words (clients may match on them)."""

    #: A service was submitted (it starts stopped, holding its reservations).
    SERVICE_CREATED = "service.created"
    #: A stopped service's specification was replaced; its next generation starts.
    SERVICE_REPLACED = "service.replaced"
    #: An operator's control action changed what is desired of the service.
    SERVICE_DESIRED = "service.desired"
    #: The service's observed state or reason changed.
    SERVICE_STATE = "service.state"
    #: A removed service released everything and is gone.
    SERVICE_REMOVED = "service.removed"
    #: A replica's first attempt of a generation was recorded.
    ATTEMPT_CREATED = "attempt.created"
    #: An attempt's state, reason or release changed.
    ATTEMPT_STATE = "attempt.state"
    #: A replica was launched again after its previous attempt ended.
    REPLICA_RESTARTED = "replica.restarted"
    #: A running service's rollout started, cut over, failed or was abandoned.
    SERVICE_ROLLOUT = "service.rollout"
    #: A replica moved to another node (its placement now names the target).
    REPLICA_MOVED = "replica.moved"
    #: A scaled service's running replicas changed (activation, scale out or in, idle),
    #: or it was pinned or unpinned: the reason and the figures it was decided on.
    SERVICE_SCALED = "service.scaled"
    #: A node's state changed (connected, unreachable, lost, revoked).
    NODE_STATE = "node.state"


class Subject(enum.StrEnum):
    """What an event is about."""

    SERVICE = "service"
    REPLICA = "replica"
    ATTEMPT = "attempt"
    NODE = "node"


@attrs.frozen(kw_only=True)
class Event:
    """One row of ``events``.

    :ivar id: increases with every event written (a reader's cursor).
    :ivar at: seconds since the epoch.
    :ivar subject_id: the service ID, ``SERVICE/REPLICA`` for a replica, the attempt
        ID or the node ID.
    :ivar details: a JSON object (what changed, from and to).
    """

    id: int
    at: float
    kind: EventKind = attrs.field(converter=EventKind)
    subject: Subject = attrs.field(converter=Subject)
    subject_id: str
    service_id: str | None = None
    project_id: str | None = None
    node_id: str | None = None
    attempt_id: str | None = None
    replica: int | None = None
    reason: str | None = None
    message: str | None = None
    details: dict[str, Any] = attrs.field(factory=dict)


__all__ = ["Event", "EventKind", "Subject"]
