"""What the controller records about contributor nodes, as typed records and states.

The repository (:mod:`.repository`) reads and writes these; the registry and the
API's views (``api/views_contributors.py``) handle nothing else. States are
``StrEnum`` members, so they compare equal to (and serialise as) the strings
stored in the database and shown by the API.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from ..base.errors import InvalidRequest
from ..schema import ExecutorSnapshot, Fence
from ..schema.snapshot import stored_snapshot


class NodeState(enum.StrEnum):
    """Where a node stands, as its heartbeats (or its revocation) say."""

    #: Registered, never heard from.
    REGISTERED = "registered"
    #: Heartbeats arrive.
    CONNECTED = "connected"
    #: No heartbeat for ``unreachable_after`` seconds: no new work goes there.
    UNREACHABLE = "unreachable"
    #: No heartbeat for ``lost_after`` seconds: what it last reported running is unknown.
    LOST = "lost"
    #: Its credential is revoked; it cannot connect again.
    REVOKED = "revoked"


class NodeAttemptState(enum.StrEnum):
    """An attempt's state as its node reported it (the executor's), or ``unknown``."""

    STARTING = "starting"
    READY = "ready"
    EXITED = "exited"
    STOPPED = "stopped"
    FAILED = "failed"
    #: Set by the controller when the node was lost or revoked while it ran.
    UNKNOWN = "unknown"


#: Attempt states that mean the engine is over; a lost node's other attempts become unknown.
ENDED_STATES = frozenset(
    {
        NodeAttemptState.EXITED,
        NodeAttemptState.STOPPED,
        NodeAttemptState.FAILED,
        NodeAttemptState.UNKNOWN,
    }
)


class AssignmentReason(enum.StrEnum):
    """Why an assignment is (or stopped being) wanted."""

    LAUNCHED = "launched"
    LAUNCH_FAILED = "launch_failed"
    STOPPED = "stopped"
    GIVEN_UP = "given_up"
    #: A reconnecting node no longer runs it.
    NOT_REPORTED = "not_reported"
    #: Its node was lost or revoked.
    UNKNOWN = "unknown"
    #: An operator acknowledged its unknown outcome (written by the inference manager).
    ACKNOWLEDGED_UNKNOWN = "acknowledged_unknown"


@attrs.frozen(kw_only=True)
class NodeAttempt:
    """One attempt a node reported in its last heartbeat."""

    attempt_id: str
    generation: int
    plan_digest: str
    provider: str
    state: NodeAttemptState
    updated_at: float

    @property
    def fence(self) -> Fence:
        """The attempt's fence (ID, generation, plan digest)."""
        return Fence(
            attempt_id=self.attempt_id, generation=self.generation, plan_digest=self.plan_digest
        )

    @classmethod
    def from_report(cls, report: Mapping[str, Any], *, updated_at: float) -> NodeAttempt:
        """One entry of a heartbeat's ``attempts`` (what an agent's ``report()`` gives)."""
        try:
            state = NodeAttemptState(report["state"])
        except ValueError:
            raise InvalidRequest(
                f"attempt state {report['state']!r} is not one of "
                + ", ".join(state.value for state in NodeAttemptState),
                code="bad_heartbeat",
            ) from None
        return cls(
            attempt_id=report["attempt_id"],
            generation=report["generation"],
            plan_digest=report["plan_digest"],
            provider=report["provider"],
            state=state,
            updated_at=updated_at,
        )


@attrs.frozen
class GpuShare:
    """The memory reserved on one GPU of a node."""

    index: int
    memory_bytes: int


@attrs.frozen(kw_only=True)
class NodeReservation:
    """What one inference replica reserves on a node."""

    service_id: str
    replica: int
    cpus: float
    memory_bytes: int
    disk_bytes: int
    gpus: tuple[GpuShare, ...] = ()


@attrs.frozen(kw_only=True)
class Node:
    """A contributor node as the controller knows it.

    :ivar labels: what the administrator recorded with it (``ficc/embedded`` marks
        the embedded agent's node).
    :ivar connection_id: the newest connection's ID; heartbeats from others are fenced.
    :ivar snapshot: the executor snapshot of its last heartbeat, as the JSON document
        stored (so one written by an older version still shows; see
        :meth:`executor_snapshot`), or None before its first heartbeat.
    :ivar attempts: what it reported running in its last heartbeat, by attempt ID.
    :ivar reservations: what inference replicas reserve on it, by service and replica.
    """

    id: str
    name: str
    state: NodeState
    labels: Mapping[str, str]
    credential_id: str
    connection_id: str | None
    last_heartbeat: float | None
    snapshot: Mapping[str, Any] | None
    created_at: float
    revoked_at: float | None
    attempts: tuple[NodeAttempt, ...] = ()
    reservations: tuple[NodeReservation, ...] = ()

    @property
    def embedded(self) -> bool:
        """Whether this is the embedded agent's node."""
        return self.labels.get("ficc/embedded") == "true"

    def executor_snapshot(self) -> ExecutorSnapshot | None:
        """The last snapshot as the schema type (None before the first heartbeat)."""
        # A newer controller sharing the database may have stored fields this one does
        # not know (docs/operations.md, "Upgrading a fleet"): they are left out.
        return None if self.snapshot is None else stored_snapshot(self.snapshot)


@attrs.frozen(kw_only=True)
class NodeCredential:
    """What checks a node credential: its secret's hash and whether it is revoked."""

    credential_id: str
    node_id: str
    secret_hash: str
    revoked_at: float | None


@attrs.frozen(kw_only=True)
class Assignment:
    """An attempt the controller asked a node to run, and whether it still wants it.

    :ivar inputs: hex digests of the blobs the node may download for it while wanted.
    """

    node_id: str
    attempt_id: str
    generation: int
    plan_digest: str
    provider: str
    wanted: bool
    reason: AssignmentReason | None
    updated_at: float
    inputs: tuple[str, ...] = ()

    @property
    def fence(self) -> Fence:
        """The assigned attempt's fence."""
        return Fence(
            attempt_id=self.attempt_id, generation=self.generation, plan_digest=self.plan_digest
        )
