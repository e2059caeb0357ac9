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

from ..schema import Fence, Specification, structure
from .placement import Reservation


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
    #: (in place; :mod:`~ficc_core.inference.rollout`).
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


@attrs.frozen(kw_only=True)
class UsageEntry:
    """One invoke request's usage (a row of ``inference_usage``), or a summary row of
    ``requests`` of them (their sums of tokens and cost, their mean times)."""

    service_id: str
    generation: int
    replica: str
    node_id: str
    credential_id: str
    path: str
    status: int
    outcome: str
    prompt_tokens: int | None
    completion_tokens: int | None
    queue_wait: float
    ttfb: float | None
    duration: float
    finished_at: float
    project_id: str = ""
    user_id: str | None = None
    model: str = ""
    cost: int = 0
    requests: int = 1


@attrs.frozen(kw_only=True)
class UsageTotals:
    """What a set of requests used."""

    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    mean_ttfb: float | None
    mean_duration: float | None
    cost: int = 0


@attrs.frozen(kw_only=True)
class CredentialUsage:
    """What one credential's requests used, with the credential's name and person."""

    credential_id: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int = 0
    cost: int = 0
    name: str | None = None
    username: str | None = None


@attrs.frozen(kw_only=True)
class UsageSummary:
    """Totals, per-credential totals and the latest requests of one service."""

    service_id: str
    since: float | None
    totals: UsageTotals
    alias: str | None = None
    by_credential: tuple[CredentialUsage, ...]
    recent: tuple[UsageEntry, ...]


__all__ = [
    "ACTIVE",
    "ENDED",
    "ROUTABLE",
    "AttemptRecord",
    "AttemptState",
    "CredentialUsage",
    "Desired",
    "RolloutRecord",
    "ServiceDetail",
    "ServiceRecord",
    "ServiceState",
    "UsageEntry",
    "UsageSummary",
    "UsageTotals",
]
