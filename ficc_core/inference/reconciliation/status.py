"""A service's per-replica status: what each replica runs, where, since when, how it is.

For each replica (an index into the specification's placements): its state, whether
it serves (:func:`serves`), its node (its state, how long since it was heard, whether
it is connected here), its current attempt, the engine's process ID and start, when it
became ready, how often it restarted in this generation, how its last attempt in that
generation ended (the last exit), the readiness probe's last answer, and the requests
in flight on it. An attempt that ended shows no process ID and no probe answer: both
were of an engine that no longer runs (its last exit keeps the process ID).

Everything is read from the store (the attempts, as their executors last reported
them) and from what this controller holds in memory (node connections, the
gateway's slots): reading a status never asks a node. :func:`service_status`
derives it from those, purely; :func:`read_status` gathers them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from ...contributors import fetch_node
from ...contributors.records import NodeState
from ..records import (
    ENDED,
    ROUTABLE,
    AttemptRecord,
    AttemptState,
    Desired,
    ServiceDetail,
    ServiceRecord,
)
from ..specification.replicas import running_indices
from .publication import latest

if TYPE_CHECKING:
    from ...contributors import NodeRegistry
    from ...contributors.records import Node
    from ..manager import InferenceManager

__all__ = [
    "LastExit",
    "NodeStatus",
    "ReplicaStatus",
    "ServiceStatus",
    "Successor",
    "current_attempts",
    "last_exit",
    "read_status",
    "restarts",
    "serves",
    "service_status",
    "successors",
]


@attrs.frozen(kw_only=True)
class NodeStatus:
    """A replica's node as this controller sees it now.

    :ivar state: ``connected``, ``unreachable``, ``lost``... as recorded, except that
        a node recorded connected shows ``disconnected`` when its connection here
        dropped and ``stale`` when it missed its heartbeats: at once, before the
        sweep makes it unreachable.
    :ivar recorded_state: the state the store records.
    :ivar connected: whether it has a live connection to this controller.
    :ivar heartbeat_age: seconds since its last heartbeat (None before the first).
    :ivar stale: connected here, but silent for longer than the heartbeat allows.
    :ivar trouble: why what it runs cannot count as serving now, or None.
    """

    id: str
    name: str | None
    state: str
    recorded_state: str | None
    connected: bool
    heartbeat_age: float | None
    stale: bool
    trouble: str | None


@attrs.frozen(kw_only=True)
class LastExit:
    """How the replica's latest ended attempt of its current generation ended.

    :ivar pid: the engine's process ID while it ran, where the provider knew it.
    :ivar exit_code: the engine's exit status, when it exited by itself.
    :ivar signal: the signal that ended it, when one did.
    :ivar memory_limit: whether it was killed at its memory limit.
    :ivar reason: the reason word (``killed``, ``exited``, ``memory_limit``, ``stopped``...).
    :ivar failed: whether it failed (ended by itself, was killed, never became ready),
        not stopped as asked (a stop, a restart, a move): only a failure explains why a
        replica that runs again was relaunched.
    :ivar at: when the controller recorded the end (epoch seconds).
    """

    attempt_id: str
    attempt: int
    generation: int
    pid: int | None
    exit_code: int | None
    signal: int | None
    memory_limit: bool
    reason: str | None
    message: str | None
    at: float
    failed: bool = False


@attrs.frozen(kw_only=True)
class ReplicaStatus:
    """One replica's status (see the module docs).

    :ivar state: its current attempt's state (``stopped`` before any).
    :ivar serving: whether it takes the service's requests now (:func:`serves`).
    :ivar pid: the engine's process ID, while its attempt has not ended.
    :ivar restarts: attempts of this replica in its current generation after the first.
    :ivar last_exit: how its latest ended attempt of its current attempt's generation
        ended (:func:`last_exit`).
    :ivar health: the readiness probe's last answer (``200``, ``503``, ``connection
        refused``); ``health_at``: since when it answers so (the node's clock). None once
        the attempt ended or its outcome is unknown: no probe answers for it now.
    :ivar in_flight: requests the gateway has in flight on the current attempt.
    :ivar successor: the attempt being brought up to take the replica over, if any.
    """

    index: int
    state: str
    serving: bool
    node: NodeStatus
    attempt_id: str | None
    attempt: int | None
    generation: int | None
    reason: str | None
    message: str | None
    pid: int | None
    started_at: float | None
    ready_at: float | None
    restarts: int
    last_exit: LastExit | None
    health: str | None
    health_at: float | None
    in_flight: int
    successor: Successor | None = None


@attrs.frozen(kw_only=True)
class Successor:
    """The attempt being brought up to take a replica over (a move's target, a restart's
    replacement, a rollout's next generation) while the current one serves."""

    attempt_id: str
    attempt: int
    generation: int
    node_id: str
    state: str


def _successor(attempt: AttemptRecord | None) -> Successor | None:
    if attempt is None:
        return None
    return Successor(
        attempt_id=attempt.attempt_id,
        attempt=attempt.number,
        generation=attempt.generation,
        node_id=attempt.node_id,
        state=str(attempt.state),
    )


@attrs.frozen(kw_only=True)
class ServiceStatus:
    """A service's state and each replica's status, as of ``at`` (epoch seconds)."""

    service_id: str
    alias: str
    state: str
    desired: str
    reason: str | None
    revision: int
    generation: int
    at: float
    replicas: tuple[ReplicaStatus, ...]


def _order(attempt: AttemptRecord) -> tuple[int, int]:
    return attempt.generation, attempt.number


def current_attempts(
    attempts: Sequence[AttemptRecord], generation: int
) -> dict[int, AttemptRecord]:
    """Each replica's attempt that stands for it: of the service's ``generation``, the
    one serving (else its latest: :func:`~ficc_core.inference.reconciliation.publication.latest`);
    a replica with none of that generation, its latest of any."""
    found: dict[int, AttemptRecord] = {}
    for attempt in attempts:
        held = found.get(attempt.replica)
        if held is None or _order(attempt) > _order(held):
            found[attempt.replica] = attempt
    found.update(latest(attempts, generation))
    return found


def successors(
    attempts: Sequence[AttemptRecord], current: Mapping[int, AttemptRecord]
) -> dict[int, AttemptRecord]:
    """Per replica, a newer unreleased attempt than the one standing for it: a move's
    target, a restart's replacement or a rollout's next generation, still starting."""
    found: dict[int, AttemptRecord] = {}
    for attempt in attempts:
        held = current.get(attempt.replica)
        if held is not None and not attempt.released and _order(attempt) > _order(held):
            found[attempt.replica] = attempt
    return found


def restarts(attempts: Iterable[AttemptRecord], replica: int, generation: int) -> int:
    """How often the replica was launched again in ``generation``: its attempts after the
    first."""
    launched = sum(1 for a in attempts if a.replica == replica and a.generation == generation)
    return max(0, launched - 1)


def last_exit(attempts: Iterable[AttemptRecord], replica: int, generation: int) -> LastExit | None:
    """How the replica's latest ended (failed or stopped) attempt of ``generation`` (the
    one its current attempt belongs to) ended, or None.

    Only that generation's: like its restarts, the last exit is about the replica as it
    runs now (a kill, a restart, a move). Another generation's attempts are not: a
    rollout's next generation that failed and was abandoned while this one served, or
    the generation a start or a rollout left behind (its events keep how they ended).
    """
    ended = [
        a
        for a in attempts
        if a.replica == replica and a.generation == generation and a.state in ENDED
    ]
    if not ended:
        return None
    last = max(ended, key=_order)
    return LastExit(
        attempt_id=last.attempt_id,
        attempt=last.number,
        generation=last.generation,
        pid=last.pid,
        exit_code=last.exit_code,
        signal=last.signal,
        memory_limit=last.reason == "memory_limit",
        reason=last.reason,
        message=last.message,
        at=last.updated_at,
        failed=last.state == AttemptState.FAILED,
    )


def serves(
    service: ServiceRecord,
    index: int,
    attempt: AttemptRecord | None,
    trouble: Callable[[str, str], str | None],
) -> bool:
    """Whether replica ``index``, which ``attempt`` stands for, takes the service's
    requests now: as the gateway routes them (:func:`~.publication.routed`) and the
    service's state counts them (:func:`~.publication.rolled_up`).

    That is: the service runs (a draining or stopping one takes no new request), the
    replica is one that runs (a scaled service's active placements), and the attempt is
    of the service's generation, ready (or draining) and not released, and nothing keeps
    it from counting: ``trouble``, by node ID and attempt ID, says None (its node is
    connected here and heard from, and did not say it no longer runs it:
    :meth:`~ficc_core.contributors.NodeRegistry.attempt_trouble`).
    """
    if attempt is None or service.desired != Desired.RUNNING:
        return False
    if attempt.generation != service.generation or attempt.released:
        return False
    if attempt.state not in ROUTABLE or index not in _runs(service):
        return False
    return trouble(attempt.node_id, attempt.attempt_id) is None


def _runs(service: ServiceRecord) -> Collection[int]:
    """The placements whose replicas run: every one, or a scaled service's active ones."""
    document = service.document()
    if document.get("scaling") is None:
        return range(len(document["placements"]))
    return running_indices(service.specification(), service.active)


def node_status(
    node_id: str,
    node: Node | None,
    *,
    connected: bool,
    trouble: str | None,
    now: float,
) -> NodeStatus:
    """The node as a replica shows it (``trouble``: the registry's, for a node connected
    here that missed its heartbeats or any node not connected here)."""
    recorded = None if node is None else str(node.state)
    state = recorded or "unknown"
    if node is not None and node.state == NodeState.CONNECTED and trouble is not None:
        state = "stale" if connected else "disconnected"
    heard = None if node is None else node.last_heartbeat
    return NodeStatus(
        id=node_id,
        name=None if node is None else node.name,
        state=state,
        recorded_state=recorded,
        connected=connected,
        heartbeat_age=None if heard is None else round(max(0.0, now - heard), 3),
        stale=connected and trouble is not None,
        trouble=trouble,
    )


def service_status(
    detail: ServiceDetail,
    nodes: Mapping[str, NodeStatus],
    in_flight: Callable[[str], int],
    now: float,
    trouble: Callable[[str, str], str | None] | None = None,
) -> ServiceStatus:
    """Each replica's status from the service's attempts, its nodes (by ID) and the
    gateway's in-flight count (by attempt ID); ``trouble`` (by node and attempt ID) says
    why an attempt cannot count as serving (by default: its node's trouble)."""
    service, attempts = detail.service, detail.attempts
    placements: Sequence[Mapping[str, object]] = service.document()["placements"]
    current = current_attempts(attempts, service.generation)
    coming = successors(attempts, current)
    if trouble is None:

        def trouble(node_id: str, _attempt_id: str) -> str | None:
            return nodes[node_id].trouble

    replicas = []
    for index, placement in enumerate(placements):
        attempt = current.get(index)
        node_id = str(placement["node_id"]) if attempt is None else attempt.node_id
        node = nodes[node_id]
        state = "stopped" if attempt is None else str(attempt.state)
        # What the engine was (its process, its probe's answer) is no longer current once
        # the attempt ended; an unknown one's probe is not heard either.
        ended = attempt is None or attempt.state in ENDED
        unheard = attempt is None or ended or attempt.state == AttemptState.UNKNOWN
        replicas.append(
            ReplicaStatus(
                index=index,
                state=state,
                serving=serves(service, index, attempt, trouble),
                node=node,
                attempt_id=None if attempt is None else attempt.attempt_id,
                attempt=None if attempt is None else attempt.number,
                generation=None if attempt is None else attempt.generation,
                reason=None if attempt is None else attempt.reason,
                message=None if attempt is None else attempt.message,
                pid=None if attempt is None or ended else attempt.pid,
                started_at=None if attempt is None else attempt.started_at,
                ready_at=None if attempt is None else attempt.ready_at,
                restarts=0 if attempt is None else restarts(attempts, index, attempt.generation),
                last_exit=None
                if attempt is None
                else last_exit(attempts, index, attempt.generation),
                health=None if attempt is None or unheard else attempt.health,
                health_at=None if attempt is None or unheard else attempt.health_at,
                in_flight=0 if attempt is None else in_flight(attempt.attempt_id),
                successor=_successor(coming.get(index)),
            )
        )
    return ServiceStatus(
        service_id=service.id,
        alias=service.alias,
        state=str(service.state),
        desired=str(service.desired),
        reason=service.reason,
        revision=service.revision,
        generation=service.generation,
        at=now,
        replicas=tuple(replicas),
    )


async def read_status(
    manager: InferenceManager,
    contributors: NodeRegistry,
    project_id: str | None,
    service_id: str,
) -> ServiceStatus:
    """The status of ``service_id`` (of ``project_id``; ``service_not_found`` otherwise)."""
    detail = await manager.get(project_id, service_id)
    wanted = {a.node_id for a in detail.attempts}
    wanted |= {str(p["node_id"]) for p in detail.service.document()["placements"]}
    recorded = await contributors.store.read(
        lambda tx: {node_id: fetch_node(tx, node_id) for node_id in wanted}
    )
    now = contributors.clock()
    nodes = {
        node_id: node_status(
            node_id,
            recorded.get(node_id),
            connected=contributors.connected_here(node_id),
            trouble=contributors.trouble(node_id),
            now=now,
        )
        for node_id in sorted(wanted)
    }
    return service_status(detail, nodes, manager.gateway.load, now, contributors.attempt_trouble)
