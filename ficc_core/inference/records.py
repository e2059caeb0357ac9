"""What the inference package keeps in the store, as typed records and states.

The :mod:`~ficc_core.inference.repository` reads and writes these; the domain code
(the manager, the reconciler) handles only records, and the API renders them
(:mod:`ficc_core.api.views_inference`). States are :class:`enum.StrEnum` members,
stored (and shown) as their plain strings.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import attrs

from ..contributors.records import Node, NodeState
from ..schema import ExecutorSnapshot, Fence, SchemaError, Specification, structure


@attrs.frozen(kw_only=True)
class Reservation:
    """What one replica holds on its node while its service is submitted or running."""

    service_id: str
    replica: int
    node_id: str
    cpus: float
    memory_bytes: int
    disk_bytes: int = 0
    gpus: tuple[tuple[int, int], ...] = ()  # (device index, memory bytes)
    #: The generation whose attempts it is for: a rollout's next generation, or a move's
    #: target (another node), holds its own beside the one still serving.
    generation: int = 0

    @property
    def key(self) -> tuple[int, int, str]:
        """What names it among the service's reservations: generation, replica, node."""
        return (self.generation, self.replica, self.node_id)

    def to_json(self) -> dict[str, Any]:
        """The reservation as shown in previews and service views."""
        return {
            "node_id": self.node_id,
            "cpus": self.cpus,
            "memory_bytes": self.memory_bytes,
            "disk_bytes": self.disk_bytes,
            "gpus": [{"index": index, "memory_bytes": size} for index, size in self.gpus],
        }


@attrs.frozen(kw_only=True)
class PlacementNode:
    """A node as placement sees it: its record's state and last snapshot."""

    node_id: str
    state: NodeState
    snapshot: ExecutorSnapshot | None
    embedded: bool = False

    @classmethod
    def of(cls, node: Node) -> PlacementNode:
        """The contributor node ``node``; a snapshot that no longer parses counts as none."""
        try:
            snapshot = node.executor_snapshot()
        except (SchemaError, ValueError):
            snapshot = None
        return cls(node_id=node.id, state=node.state, snapshot=snapshot, embedded=node.embedded)


class Desired(enum.StrEnum):
    """What operators asked of a service."""

    STOPPED = "stopped"
    RUNNING = "running"
    DRAINING = "draining"
    REMOVED = "removed"


class ServiceState(enum.StrEnum):
    """What a service is observed to be (its replicas rolled up)."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    #: Some replicas are ready, not all.
    DEGRADED = "degraded"
    FAILED = "failed"
    #: Every replica failed or has an unknown outcome, at least one unknown.
    UNKNOWN = "unknown"
    DRAINING = "draining"
    STOPPING = "stopping"
    REMOVING = "removing"
    #: A scaled service with ``min = 0`` runs no replica because nobody asked for a while;
    #: the next request wakes it (docs/inference.md, "Scaling").
    IDLE = "idle"


class AttemptState(enum.StrEnum):
    """One replica attempt's state. ``unknown``: its node was lost while it ran."""

    PENDING = "pending"
    STAGING = "staging"
    LAUNCHING = "launching"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    UNKNOWN = "unknown"


#: Attempt states in which the engine may be running (the executor has not confirmed an end).
ACTIVE = frozenset(
    {
        AttemptState.PENDING,
        AttemptState.STAGING,
        AttemptState.LAUNCHING,
        AttemptState.LOADING,
        AttemptState.READY,
        AttemptState.DRAINING,
        AttemptState.STOPPING,
    }
)
#: Attempt states that count as ended by the executor (its reservation may go).
ENDED = frozenset({AttemptState.STOPPED, AttemptState.FAILED})
#: Attempt states in which the gateway may route to the attempt.
ROUTABLE = frozenset({AttemptState.READY, AttemptState.DRAINING})


def _indices(value: Any) -> tuple[int, ...] | None:
    """Placement indices from the store's JSON text (or a sequence), sorted."""
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return tuple(sorted({int(index) for index in value}))


@attrs.frozen(kw_only=True)
class ServiceRecord:
    """One row of ``inference_services``."""

    id: str
    project_id: str
    alias: str
    model_id: str
    #: The specification as canonical JSON text.
    spec: str
    revision: int
    generation: int
    desired: Desired = attrs.field(converter=Desired)
    state: ServiceState = attrs.field(converter=ServiceState)
    reason: str | None
    plan_digest: str | None
    drain_deadline: float | None = None
    created_at: float
    updated_at: float
    #: The placements that run replicas now, for a scaled service (None: not scaled, every
    #: placement runs one while the service runs).
    active: tuple[int, ...] | None = attrs.field(default=None, converter=_indices)
    #: An operator pinned it: never scaled to zero (docs/inference.md, "Scaling").
    pinned: bool = attrs.field(default=False, converter=bool)
    #: When the last scaling decision was recorded (its cooldown), or None; an activation
    #: is not one (``woken_at``).
    scaled_at: float | None = None
    #: When the idle service was last woken by a request, or None.
    woken_at: float | None = None

    def document(self) -> Any:
        """The specification as a JSON document."""
        return json.loads(self.spec)

    def specification(self) -> Specification:
        """The specification, structured."""
        return structure(self.document(), Specification, what="stored specification")


@attrs.frozen(kw_only=True)
class AttemptRecord:
    """One row of ``inference_attempts``: one try at running one replica."""

    attempt_id: str
    service_id: str
    replica: int
    generation: int
    number: int
    node_id: str
    provider: str
    #: None until the attempt's launch was recorded: it was never sent to its node.
    plan_digest: str | None = None
    workload: str | None = None
    state: AttemptState = attrs.field(converter=AttemptState)
    reason: str | None = None
    message: str | None = None
    #: The executor confirmed it ended (or it was given up): its reservation may go.
    released: bool = attrs.field(default=False, converter=bool)
    created_at: float
    updated_at: float
    #: What its executor last said of the engine (None where it did not say): the
    #: process ID, the exit status or the signal that ended it, when it started (the
    #: node's clock), and the readiness probe's last answer and when it came.
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    health: str | None = None
    health_at: float | None = None
    #: When the controller first saw it ready.
    ready_at: float | None = None

    @property
    def fence(self) -> Fence:
        """The fence the node knows this attempt by."""
        return Fence(
            attempt_id=self.attempt_id,
            generation=self.generation,
            plan_digest=self.plan_digest or "sha256:" + "0" * 64,
        )


@attrs.frozen(kw_only=True)
class RolloutRecord:
    """One row of ``inference_rollouts``: a running service's next generation, started
    beside the serving one; it becomes the service's own once every replica is ready."""

    service_id: str
    generation: int
    #: The next generation's specification as canonical JSON text.
    spec: str
    plan_digest: str
    started_at: float
    #: When an unfinished rollout gives up (seconds since the epoch).
    deadline: float
    #: How it runs: ``surge`` (beside the serving generation), ``rolling`` or ``recreate``
    #: (in place; :mod:`~ficc_core.inference.operations.rollout`).
    strategy: str = "surge"
    #: A rolling rollout's replicas handed over so far (the next generation runs that many).
    step: int = 0

    def specification(self) -> Specification:
        """The next generation's specification, structured."""
        return structure(json.loads(self.spec), Specification, what="stored specification")


@attrs.frozen(kw_only=True)
class ServiceDetail:
    """A service with its attempts (by replica, generation, number) and reservations."""

    service: ServiceRecord
    attempts: tuple[AttemptRecord, ...]
    reservations: tuple[Reservation, ...]


__all__ = [
    "ACTIVE",
    "ENDED",
    "ROUTABLE",
    "AttemptRecord",
    "AttemptState",
    "Desired",
    "PlacementNode",
    "Reservation",
    "RolloutRecord",
    "ServiceDetail",
    "ServiceRecord",
    "ServiceState",
]
