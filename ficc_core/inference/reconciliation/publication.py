"""From a service's attempts to what others see: its rolled-up state and its routing view.

The gateway routes only to what :func:`publish` put in the
:class:`~ficc_core.routing.live.LiveTable`: per replica of the service's
generation, its newest ready (or draining) unreleased attempt on a node connected to
this controller. Two attempts of one replica coexist while a successor (a move's
target) loads: the predecessor serves until the successor is ready, then it is
*retiring* (:func:`retiring`): no new request goes there, the ones in flight finish,
then the reconciler stops it. A rollout's next generation is never routed before it
becomes the service's generation (but an in-place rollout's replicas handed over to
it: ``handed``); the previous one then retires the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ...routing.live import (
    Activation,
    ActivationFailure,
    Admission,
    LiveReplica,
    LiveService,
    LiveTable,
)
from ..records import ROUTABLE, AttemptRecord, AttemptState, ServiceRecord, ServiceState
from .liveness import UNRESPONSIVE

if TYPE_CHECKING:
    from ...contributors import NodeRegistry
    from ...schema import ModelRecord, Specification


#: The reason a move's target ends with when the move is rolled back: it never stood for
#: its replica.
ROLLED_BACK = "move_rolled_back"
#: The reason a move's target ends with when the move did not finish (its request was
#: cancelled, the controller restarted): the reconciler stopped it as a stray, and it
#: never stood for its replica either.
INTERRUPTED = "move_interrupted"
#: The reasons of moves' targets that never stood for their replica.
NEVER_STOOD = frozenset({ROLLED_BACK, INTERRUPTED})


def latest(attempts: Iterable[AttemptRecord], generation: int) -> dict[int, AttemptRecord]:
    """Each replica's attempt of ``generation`` that stands for it: the one routed
    (:func:`routed`), else its latest (attempts ordered by number) but a move's target
    that never stood for it (rolled back or interrupted, :data:`NEVER_STOOD`)."""
    found: dict[int, AttemptRecord] = {}
    serving: dict[int, AttemptRecord] = {}
    for attempt in attempts:
        if attempt.generation == generation:
            if attempt.reason not in NEVER_STOOD or attempt.replica not in found:
                found[attempt.replica] = attempt
            if attempt.state in ROUTABLE and not attempt.released:
                serving[attempt.replica] = attempt
    return {**found, **serving}


def _indices(replicas: int | Collection[int]) -> Collection[int]:
    """Replica indices: a count's ``range``, or the indices themselves."""
    return range(replicas) if isinstance(replicas, int) else replicas


def routed(
    attempts: Iterable[AttemptRecord],
    generation: int,
    replicas: int | Collection[int],
    dismissed: Collection[str] = (),
) -> dict[int, AttemptRecord]:
    """Per replica of ``generation`` (below ``replicas``, or among those indices), its
    newest unreleased ready (or draining) attempt; one ``dismissed`` (told to go: a
    restart, a move) never is."""
    found: dict[int, AttemptRecord] = {}
    wanted = _indices(replicas)
    for attempt in attempts:
        if (
            attempt.generation == generation
            and attempt.replica in wanted
            and attempt.state in ROUTABLE
            and not attempt.released
            and attempt.attempt_id not in dismissed
        ):
            found[attempt.replica] = attempt
    return found


def retiring(
    attempts: Sequence[AttemptRecord],
    wanted: Mapping[int, int | Collection[int]],
    dismissed: Collection[str] = (),
) -> list[AttemptRecord]:
    """The unreleased attempts nobody needs any more, to drain and stop.

    ``wanted`` maps each generation still wanted (the service's, a pending rollout's)
    to the replicas it runs (:meth:`~.generations.Running.wanted`; a count means the
    first that many). An attempt is kept
    while it is routed, or while it is the newest unreleased attempt of a wanted
    replica (a successor still loading); any other (a predecessor whose successor is
    ready, a generation no longer wanted, a replica not wanted any more, a
    ``dismissed`` one) retires.
    """
    keep: set[str] = set()
    newest: dict[tuple[int, int], AttemptRecord] = {}
    for generation, replicas in wanted.items():
        keep |= {a.attempt_id for a in routed(attempts, generation, replicas, dismissed).values()}
    for attempt in attempts:
        if not attempt.released and attempt.replica in _indices(wanted.get(attempt.generation, ())):
            newest[(attempt.generation, attempt.replica)] = attempt
    keep |= {a.attempt_id for a in newest.values()}
    return [
        a
        for a in attempts
        if not a.released and (a.attempt_id not in keep or a.attempt_id in dismissed)
    ]


def given_up(
    attempts: Iterable[AttemptRecord], generation: int, replica: int, limit: int
) -> AttemptRecord | None:
    """The replica's last attempt when its last ``limit`` attempts all failed the same way.

    The same way is the same failure ``reason`` (``memory_limit``, ``exited``, ...). Such a
    replica stops retrying until the service starts its next generation; ``limit`` 0 never
    gives up.
    """
    mine = [a for a in attempts if a.generation == generation and a.replica == replica]
    tail = mine[-limit:] if limit > 0 else []
    if len(tail) < limit or not tail:
        return None
    if all(a.state == AttemptState.FAILED and a.released for a in tail):
        if len({a.reason for a in tail}) == 1:
            return tail[-1]
    return None


#: Reasons an attempt ends with when the engine ran and exited by itself (or a signal).
ENGINE_EXITS = frozenset({"exited", "killed"})
#: Codes of an executor that refused to launch the engine (:mod:`ficc_core.executor.errors`).
LAUNCH_REFUSALS = frozenset(
    {
        "launch_failed",
        "isolation_unavailable",
        "isolation_failed",
        "engine_unavailable",
        "image_digest_mismatch",
        "input_not_admitted",
        "path_not_admitted",
        "executor_error",
    }
)


def give_up_reason(replica: int, attempt: AttemptRecord, limit: int) -> str:
    """The service's reason once ``replica`` gave up after ``attempt``: how its last
    attempts failed, and advice that matches the cause (:func:`give_up_advice`)."""
    said = f": {attempt.message}" if attempt.message else ""
    return (
        f"replica {replica} stopped retrying: its last {limit} attempts failed the same way "
        f"({attempt.reason}){said}; {give_up_advice(replica, attempt)}"
    )


def give_up_advice(replica: int, attempt: AttemptRecord) -> str:
    """What to do about a replica whose attempts failed as ``attempt`` did: the memory
    hint only for a memory limit; an engine that exited sends the reader to its log; a
    launch the executor refused, to the node's setting its message names."""
    again = "then stop and start the service"
    reason = attempt.reason or ""
    if reason == "memory_limit":
        return (
            "give the replica a larger memory limit or the engine a smaller context "
            f"(preview the specification to see the estimate), {again}"
        )
    if reason in ENGINE_EXITS:
        how = (
            f"signal {attempt.signal}"
            if attempt.signal is not None
            else f"status {attempt.exit_code}"
            if attempt.exit_code is not None
            else "an error"
        )
        return (
            f"the engine exited with {how}: read its log (ficc inference logs "
            f"{attempt.service_id} --replica {replica}), fix what it reports (the model, "
            f"the engine's flags or its runtime on node {attempt.node_id}), {again}"
        )
    if reason == UNRESPONSIVE:
        return (
            "its engine stopped answering after it was ready, every time (a hang, not an "
            f"exit): read its log (ficc inference logs {attempt.service_id} --replica "
            f"{replica}) and check node {attempt.node_id} (its GPU, driver and memory); if "
            "the engine is only slow to answer under load, raise liveness_timeout or "
            f"liveness_misses; {again}"
        )
    if reason in LAUNCH_REFUSALS:
        return (
            f"the {attempt.provider} executor on node {attempt.node_id} refused to launch the "
            "engine for that reason: change what it names (a setting of the node, such as its "
            "runtime_dir, or the specification's runtime) or place the replica on another "
            f"node, {again}"
        )
    return (
        f"see why (ficc inference show {attempt.service_id}; ficc inference logs "
        f"{attempt.service_id} --replica {replica}), fix the cause, {again}"
    )


#: An attempt's states before it is ready, while nothing went wrong with it.
COMING_UP = frozenset(
    {AttemptState.PENDING, AttemptState.STAGING, AttemptState.LAUNCHING, AttemptState.LOADING}
)


def rolled_up(
    replicas: int | Collection[int],
    attempts: Sequence[AttemptRecord],
    generation: int,
    give_up_after: int = 0,
    trouble: Callable[[str, str], str | None] = lambda _node_id, _attempt_id: None,
    starting: bool = False,
) -> tuple[ServiceState, str | None]:
    """A running service's state from its replicas' latest attempts, and why it is not ready.

    ``starting``: the service is starting now (its recorded state). It stays starting
    while some replicas are ready and every other one is still coming up (pending,
    staging, launching or loading) with nothing wrong: a normal start goes starting →
    ready, never through degraded. A replica that failed or cannot be reached makes it
    degraded, and a degraded service stays so until every replica is ready.

    ``trouble`` (by node ID and attempt ID) says why an attempt cannot count as serving
    now (its node's connection dropped, it missed a heartbeat, its reconnection said it
    no longer runs the attempt), or None: such a ready attempt counts as not ready, so
    the service is degraded (or starting) at once, not only once the node is declared
    unreachable or lost or the attempt is ended.
    """
    current = latest(attempts, generation)
    indices = list(_indices(replicas))
    states = [current[i].state if i in current else AttemptState.PENDING for i in indices]
    troubles = {}
    for position, (index, replica_state) in enumerate(zip(indices, states, strict=True)):
        if replica_state != AttemptState.READY:
            continue
        why = trouble(current[index].node_id, current[index].attempt_id)
        if why is not None:
            states[position] = AttemptState.LOADING
            troubles[index] = why
    if all(state == AttemptState.READY for state in states):
        state = ServiceState.READY
    elif any(state == AttemptState.READY for state in states):
        coming = not troubles and all(s in COMING_UP or s == AttemptState.READY for s in states)
        state = ServiceState.STARTING if starting and coming else ServiceState.DEGRADED
    elif all(state in (AttemptState.FAILED, AttemptState.UNKNOWN) for state in states):
        state = ServiceState.UNKNOWN if AttemptState.UNKNOWN in states else ServiceState.FAILED
    else:
        state = ServiceState.STARTING
    for index in indices:
        last = given_up(attempts, generation, index, give_up_after)
        if last is not None:
            return state, give_up_reason(index, last, give_up_after)
    failures = [
        current[i].message
        for i in indices
        if i in current and current[i].state == AttemptState.FAILED and current[i].message
    ]
    if failures and state != ServiceState.READY:
        return state, failures[0]
    if troubles:
        index, why = next(iter(troubles.items()))
        return state, f"replica {index} is ready but cannot be reached: {why}"
    return state, None


def publish(
    live: LiveTable,
    contributors: NodeRegistry,
    record: ServiceRecord,
    specification: Specification,
    attempts: Sequence[AttemptRecord],
    capabilities: tuple[str, ...],
    admission: Admission,
    dismissed: Collection[str] = (),
    model: ModelRecord | None = None,
    wanted: Collection[int] | None = None,
    activation: Activation = "",
    activation_error: ActivationFailure | None = None,
    handed: tuple[int, Collection[int]] | None = None,
) -> None:
    """Publish the service's routing view at its current revision.

    :param wanted: the placements whose replicas run (default: every one).
    :param handed: an in-place rollout's next generation and the replicas handed over to
        it: those are routed too once ready (the serving generation no longer runs them).
    :param activation: where an on-demand service stands (:attr:`LiveService.activation`),
        with ``activation_error`` when its last activation failed.

    :param capabilities: what the engine serves (the adapter's job); the
        specification's ``capabilities`` (tools, vision) are added to them.
    :param model: the service's model record, when known: its manifest name is the
        last name the service answers to, its trained context bounds the default
        context length.
    """
    replicas: list[LiveReplica] = []
    retired: list[LiveReplica] = []
    if admission != "stopped":
        runs = len(specification.placements) if wanted is None else wanted
        # What its node said on reconnecting it no longer runs is never routed, though its
        # record may say ready until it is ended.
        dropped = {a.attempt_id for a in attempts if contributors.dropped(a.node_id, a.attempt_id)}
        # Nor is one that stopped answering its liveness probes (:mod:`.liveness`), for a
        # controller that follows the record (the leader took it out of its table already).
        dropped |= {a.attempt_id for a in attempts if a.reason == UNRESPONSIVE}
        chosen = routed(attempts, record.generation, runs, {*dismissed, *dropped})
        if handed is not None:
            chosen.update(routed(attempts, handed[0], handed[1], {*dismissed, *dropped}))
        for attempt in attempts:
            # A node not (yet) connected here cannot be reached; the next step adds it.
            if (
                attempt.state not in ROUTABLE
                or attempt.released
                or attempt.attempt_id in dropped
                or not contributors.connected_here(attempt.node_id)
            ):
                continue
            replica = LiveReplica(
                index=attempt.replica, node_id=attempt.node_id, fence=attempt.fence
            )
            if chosen.get(attempt.replica) is attempt:
                replicas.append(replica)
            elif attempt.generation <= record.generation:
                retired.append(replica)  # a rollout's next generation never served yet
        replicas.sort(key=lambda r: r.index)
    live.publish(
        LiveService(
            id=record.id,
            project_id=record.project_id,
            alias=specification.alias,
            generation=record.generation,
            admission=admission,
            concurrency=specification.concurrency,
            request_deadline=specification.request_deadline,
            capabilities=served_capabilities(specification, capabilities),
            replicas=tuple(replicas),
            retiring=tuple(retired),
            names=served_names(specification, model),
            description=specification.description,
            context_length=context_length(specification, model),
            max_output=specification.max_output,
            fallbacks=specification.fallbacks or (),
            created=int(record.created_at),
            model_id=specification.model_id,
            model_name=model.manifest.name if model is not None else "",
            scaled=specification.scaling is not None,
            activation="" if replicas else activation,
            activation_error=activation_error if activation == "failed" else None,
        ),
        revision=record.revision,
    )


def served_capabilities(
    specification: Specification, capabilities: tuple[str, ...]
) -> tuple[str, ...]:
    """The engine's capabilities with those the specification claims for its model."""
    claimed = specification.capabilities.claimed() if specification.capabilities else ()
    return capabilities + tuple(name for name in claimed if name not in capabilities)


def served_names(specification: Specification, model: ModelRecord | None) -> tuple[str, ...]:
    """The names beyond its alias a service answers to: its aliases, then the model's name."""
    names = list(specification.aliases or ())
    if model is not None and model.manifest.name not in (specification.alias, *names):
        names.append(model.manifest.name)
    return tuple(names)


def context_length(specification: Specification, model: ModelRecord | None) -> int:
    """Tokens one request may use: the specification's context length, else its context
    (what the engine holds per request: llama.cpp divides ``--ctx-size`` across its
    ``--parallel`` slots, and the adapter sizes it as context x concurrency) bounded by
    the model's trained context where its metadata declares one."""
    if specification.context_length is not None:
        return specification.context_length
    trained = model.metadata.context_length if model is not None else None
    return min(specification.context, trained) if trained else specification.context
