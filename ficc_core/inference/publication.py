"""From a service's attempts to what others see: its rolled-up state and its routing view.

The gateway routes only to what :func:`publish` put in the
:class:`~ficc_core.inference.live.LiveTable`: the latest generation's ready (or
draining) attempts on nodes connected to this controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .live import Admission, LiveReplica, LiveService, LiveTable
from .records import ROUTABLE, AttemptRecord, AttemptState, ServiceRecord, ServiceState

if TYPE_CHECKING:
    from ..contributors import NodeRegistry
    from ..schema import Specification


def latest(attempts: Iterable[AttemptRecord], generation: int) -> dict[int, AttemptRecord]:
    """Each replica's latest attempt of ``generation`` (attempts ordered by number)."""
    found: dict[int, AttemptRecord] = {}
    for attempt in attempts:
        if attempt.generation == generation:
            found[attempt.replica] = attempt
    return found


def rolled_up(
    replicas: int, attempts: Sequence[AttemptRecord], generation: int
) -> tuple[ServiceState, str | None]:
    """A running service's state from its replicas' latest attempts, and why it is not ready."""
    current = latest(attempts, generation)
    states = [current[i].state if i in current else AttemptState.PENDING for i in range(replicas)]
    if all(state == AttemptState.READY for state in states):
        state = ServiceState.READY
    elif any(state == AttemptState.READY for state in states):
        state = ServiceState.DEGRADED
    elif all(state in (AttemptState.FAILED, AttemptState.UNKNOWN) for state in states):
        state = ServiceState.UNKNOWN if AttemptState.UNKNOWN in states else ServiceState.FAILED
    else:
        state = ServiceState.STARTING
    failures = [a.message for a in current.values() if a.state == AttemptState.FAILED and a.message]
    return state, failures[0] if failures and state != ServiceState.READY else None


def publish(
    live: LiveTable,
    contributors: NodeRegistry,
    record: ServiceRecord,
    specification: Specification,
    attempts: Sequence[AttemptRecord],
    capabilities: tuple[str, ...],
    admission: Admission,
) -> None:
    """Publish the service's routing view at its current revision."""
    replicas = []
    if admission != "stopped":
        for index, attempt in sorted(latest(attempts, record.generation).items()):
            # A node not (yet) connected here cannot be reached; the next step adds it.
            if attempt.state in ROUTABLE and contributors.connected_here(attempt.node_id):
                replicas.append(
                    LiveReplica(index=index, node_id=attempt.node_id, fence=attempt.fence)
                )
    live.publish(
        LiveService(
            id=record.id,
            project_id=record.project_id,
            alias=specification.alias,
            generation=record.generation,
            admission=admission,
            concurrency=specification.concurrency,
            request_deadline=specification.request_deadline,
            capabilities=capabilities,
            replicas=tuple(replicas),
        ),
        revision=record.revision,
    )
