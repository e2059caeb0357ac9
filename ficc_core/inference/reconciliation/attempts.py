"""One attempt's life on its node: launched, watched until it ends, stopped.

``pending`` → ``staging`` (a remote node stages the model's files it lacks) or
``launching`` → ``loading`` (the engine is up, its readiness probe not yet
answering) → ``ready``. An attempt that ends by itself or never becomes ready is
``failed``; one whose node is lost while it runs becomes ``unknown``. An attempt
is ``released`` once its executor confirmed it ended (or it was given up): only
then may its reservation go.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ...base.errors import FiccError
from ...contributors.records import NodeState
from ...executor.errors import StaleFence, UnknownAttempt
from ...schema import Specification, Workload, canonical_json
from ...store.outage import is_store_failure
from ..records import ENDED, AttemptRecord, AttemptState, ServiceRecord
from .liveness import UNRESPONSIVE

if TYPE_CHECKING:
    from ...contributors import NodeRegistry
    from ...executor.types import AttemptStatus
    from ...models.blobs import BlobStore
    from ...plugins import AdapterRegistry
    from ..specification.model_context import ModelContext, ModelContexts
    from .liveness import Liveness
    from .observed import Observations

#: The longest a node's new connection is waited for to be reconciled, in seconds,
#: before an attempt it does not run is judged (stopped by the node, or failed).
RECONCILE_WAIT = 5.0

log = logging.getLogger("ficc.inference")

#: How long a stopped engine has to end before its executor kills it, in seconds.
STOP_GRACE = 10.0
#: The same for an unresponsive engine: one that answers nothing will not shut down well.
UNRESPONSIVE_STOP_GRACE = 2.0


#: The attempt record's fields an executor's status fills (``AttemptStatus`` names them alike).
ENGINE_FIELDS = ("pid", "exit_code", "signal", "started_at", "health", "health_at")


def engine_fields(status: AttemptStatus) -> dict[str, Any]:
    """What an executor's status says of its engine, as attempt record fields."""
    return {name: getattr(status, name) for name in ENGINE_FIELDS}


#: The most of an engine's last log line an attempt's message repeats, in characters.
GIST_CHARS = 240


def log_gist(lines: Sequence[str]) -> str | None:
    """The gist of an ended engine's last log lines: the last that speaks of an error
    (where an engine says why it gave up), else the last one that says anything."""
    said = [line.strip() for line in lines if line.strip()]
    if not said:
        return None
    errors = [line for line in said if any(w in line.lower() for w in ("error", "fail"))]
    gist = (errors or said)[-1]
    return gist if len(gist) <= GIST_CHARS else gist[: GIST_CHARS - 3] + "..."


def ended_message(status: AttemptStatus) -> str:
    """What an attempt that ended by itself records: the executor's sentence, and for an
    engine that exited (its status or signal is in the sentence) the gist of its log."""
    message = status.message or f"the engine {status.state}"
    gist = log_gist(status.log_tail) if status.reason in ("exited", "killed") else None
    if gist is None:
        return message
    return f"{message.removesuffix('; see the log tail')}; its log ends: {gist}"


def new_attempt_id(service_id: str, index: int, generation: int, number: int) -> str:
    """A fresh attempt id that says which service, replica, generation and try it is."""
    return f"{service_id}.r{index}.g{generation}.a{number}.{secrets.token_hex(3)}"


class Attempts:
    """Launches, watches and stops attempts through the nodes' links.

    :param observations: where each attempt's state is recorded.
    :param contributors: the nodes (launch, status, stop; whether one is connected here).
    :param adapters: the engine adapters that turn a replica into a job.
    :param contexts: the verified models' job inputs (each read once, then kept).
    :param blobs: where the embedded node's model directories are assembled.
    :param clock: seconds since the epoch, for the records' times.
    :param ready_period: seconds between status checks of a ready attempt.
    :param loading_period: seconds between status checks of a loading one.
    :param liveness: probes a ready attempt's engine (None: none is probed).
    """

    def __init__(
        self,
        *,
        observations: Observations,
        contributors: NodeRegistry,
        adapters: AdapterRegistry,
        contexts: ModelContexts,
        blobs: BlobStore,
        clock: Callable[[], float],
        ready_period: float = 1.0,
        loading_period: float = 0.2,
        liveness: Liveness | None = None,
    ) -> None:
        self.observations = observations
        self.contributors = contributors
        self.adapters = adapters
        self.contexts = contexts
        self.blobs = blobs
        self.clock = clock
        self.ready_period = ready_period
        self.loading_period = loading_period
        self._models: dict[tuple[str, str], ModelContext] = {}
        #: Probes ready attempts' engines (:mod:`.liveness`; None: not probed).
        self.liveness = liveness

    async def model(self, record: ServiceRecord, specification: Specification) -> ModelContext:
        """The service's model context (read once per project and model)."""
        key = (record.project_id, specification.model_id)
        model = self._models.get(key)
        if model is None:
            model = await self.contexts.get(record.project_id, specification.model_id)
            self._models[key] = model
        return model

    async def capabilities(
        self, record: ServiceRecord, specification: Specification
    ) -> tuple[str, ...] | None:
        """What the engine serves (for an attempt this reconciler did not launch): the
        adapter's translation is pure, so ask it. None when it cannot be computed."""
        try:
            model = await self.model(record, specification)
            job = self.adapters[specification.engine].job(
                specification, model.record, specification.placements[0], model.inputs
            )
        except Exception as exc:
            log.warning("service %s: cannot compute its capabilities: %s", record.id, exc)
            return None
        return tuple(job.capabilities)

    # -- launching ---------------------------------------------------------------------------

    async def launch(
        self, record: ServiceRecord, specification: Specification, index: int, number: int
    ) -> tuple[str, ...] | None:
        """Record and launch attempt ``number`` of replica ``index``.

        Returns the launched job's capabilities; None when the job was refused.
        """
        attempt = self.new(record, specification, index, number)
        await self.observations.add_attempt(attempt)
        return await self.start(record, specification, attempt)

    def new(
        self, record: ServiceRecord, specification: Specification, index: int, number: int
    ) -> AttemptRecord:
        """A pending attempt ``number`` of replica ``index`` on its placement (not recorded)."""
        now = self.clock()
        return AttemptRecord(
            attempt_id=new_attempt_id(record.id, index, record.generation, number),
            service_id=record.id,
            replica=index,
            generation=record.generation,
            number=number,
            node_id=specification.placements[index].node_id,
            provider=specification.runtime.executor_provider,
            state=AttemptState.PENDING,
            created_at=now,
            updated_at=now,
        )

    async def start(
        self, record: ServiceRecord, specification: Specification, attempt: AttemptRecord
    ) -> tuple[str, ...] | None:
        """Launch the recorded pending ``attempt`` on its placement (see :meth:`launch`)."""
        service_id, attempt_id, index = record.id, attempt.attempt_id, attempt.replica
        placement = specification.placements[index]
        generation = attempt.generation
        provider = attempt.provider
        try:
            model = await self.model(record, specification)
            adapter = self.adapters[specification.engine]
            job = adapter.job(specification, model.record, placement, model.inputs)
        except Exception as exc:  # the model vanished, or the adapter refused
            if is_store_failure(exc):
                raise  # the store is down: the replica task tries again, nothing failed
            message = exc.message if isinstance(exc, FiccError) else f"{type(exc).__name__}: {exc}"
            await self._end(
                service_id, attempt_id, AttemptState.FAILED, "job_refused", message=message
            )
            return None
        workload = Workload(
            workload_id=f"{service_id}/{index}",
            project_id=record.project_id,
            node_id=placement.node_id,
            runtime=specification.runtime,
            argv=job.argv,
            limits=placement.limits,
            generation=generation,
            model_revision=model.record.revision,
            endpoint=job.endpoint,
        )
        fence = workload.fence(attempt_id)
        # A remote node first stages the model's files it lacks (the embedded node reads
        # the controller's blob store in place); the launch call covers both.
        node = await self.observations.node(placement.node_id)
        embedded = node is not None and node.embedded
        if embedded and model.directories:
            try:
                for files in model.directories.values():
                    await self.blobs.assemble_tree(files)
            except FiccError as exc:
                await self._refused(service_id, attempt_id, exc)
                return tuple(job.capabilities)
        await self.observations.set_attempt(
            service_id,
            attempt_id,
            state=AttemptState.LAUNCHING if embedded else AttemptState.STAGING,
            plan_digest=fence.plan_digest,
            workload=canonical_json(workload).decode("utf-8"),
        )
        try:
            # Shielded: a launch cut short could leave an engine nobody recorded.
            with trio.CancelScope(shield=True):
                status = await self.contributors.launch(
                    placement.node_id,
                    provider,
                    job,
                    fence,
                    limits=placement.limits,
                    runtime=specification.runtime,
                    blobs=model.blobs,
                    directories=model.directories,
                )
        except FiccError as exc:
            if is_store_failure(exc):
                # Recording the assignment failed before anything was sent: the attempt
                # stays as recorded and the replica task looks at it again.
                raise
            await self._refused(service_id, attempt_id, exc)
            return tuple(job.capabilities)
        await self.observations.set_attempt(
            service_id,
            attempt_id,
            state=AttemptState.READY if status.state == "ready" else AttemptState.LOADING,
        )
        return tuple(job.capabilities)

    async def _end(
        self,
        service_id: str,
        attempt_id: str,
        state: AttemptState,
        reason: str,
        message: str | None = None,
        **engine: Any,
    ) -> None:
        """The attempt ended (or never started): released, with why (its message kept
        unless a new one is given) and what its executor last said of the engine that
        is not on record yet (``engine``: fields of :data:`ENGINE_FIELDS`)."""
        extra = {} if message is None else {"message": message}
        await self.observations.set_attempt(
            service_id, attempt_id, state=state, reason=reason, released=True, **extra, **engine
        )

    async def _not_reported(self, attempt: AttemptRecord) -> None:
        """The node does not run ``attempt``. When its last (re)connection said so (an
        agent that restarted, as the embedded one does with every ``ficc serve``, or
        that stopped it when its lease ran out while disconnected), the node stopped it:
        no failure of the engine, so it neither backs off nor counts towards giving up.
        Otherwise the attempt failed."""
        node_id, attempt_id = attempt.node_id, attempt.attempt_id
        # The status command can reach a new connection before its first heartbeat was
        # reconciled: wait (bounded) for that connection's own reconciliation.
        reconciled = self.contributors.reconciliation(node_id)
        with trio.move_on_after(RECONCILE_WAIT):
            while reconciled is None and self.contributors.connected_here(node_id):
                await trio.sleep(0.05)
                reconciled = self.contributors.reconciliation(node_id)
        if reconciled is not None and attempt_id in reconciled.missing:
            state, how = (
                AttemptState.STOPPED,
                (
                    "; its agent restarted, or stopped it when its lease ran out while "
                    "disconnected: the replica starts again"
                ),
            )
        else:
            state, how = AttemptState.FAILED, ""
        message = f"node {node_id} no longer runs attempt {attempt_id}{how}"
        await self._end(attempt.service_id, attempt_id, state, "not_reported", message)

    async def _refused(self, service_id: str, attempt_id: str, exc: FiccError) -> None:
        """The attempt never started (its inputs or its launch were refused): it failed."""
        await self._end(service_id, attempt_id, AttemptState.FAILED, exc.code, exc.message)

    async def never_launched(self, attempt: AttemptRecord, state: AttemptState) -> None:
        """An attempt recorded but never sent to its node (the controller stopped between):
        nothing can be running, so it ends at once."""
        await self.observations.set_attempt(
            attempt.service_id,
            attempt.attempt_id,
            state=state,
            reason="never_launched",
            released=True,
        )

    # -- watching ------------------------------------------------------------------------------

    async def watch(self, attempt: AttemptRecord, grace: Callable[[], float] = lambda: 1.0) -> None:
        """Follow an attempt until it ends (failed or unknown) or the caller is cancelled.

        Once it is ready its engine's liveness is probed too (:mod:`.liveness`): one that
        stays unresponsive for ``grace()`` seconds (the replica's back-off) fails with
        the reason ``unresponsive`` and is stopped, so the replica starts again.
        """
        ready = trio.Event()
        restart: list[float] = []
        async with trio.open_nursery() as nursery:
            if self.liveness is not None and attempt.plan_digest is not None:
                nursery.start_soon(self._live, attempt, ready, grace, restart, nursery.cancel_scope)
            await self._watch(attempt, ready)
            nursery.cancel_scope.cancel()
        if restart:
            await self._restart_unresponsive(attempt, restart[0])

    async def _live(
        self,
        attempt: AttemptRecord,
        ready: trio.Event,
        grace: Callable[[], float],
        restart: list[float],
        watching: trio.CancelScope,
    ) -> None:
        assert self.liveness is not None
        await ready.wait()
        seconds = await self.liveness.follow(attempt, grace)
        if seconds is not None:
            restart.append(seconds)
            watching.cancel()

    async def _restart_unresponsive(self, attempt: AttemptRecord, seconds: float) -> None:
        """The attempt stayed unresponsive for ``seconds``: it failed, and is stopped."""
        assert self.liveness is not None
        message = (
            f"its engine answered no liveness probe for {seconds:.1f} s (out of routing all "
            "that time): stopped, the replica starts again"
        )
        log.warning("service %s attempt %s: %s", attempt.service_id, attempt.attempt_id, message)
        try:
            await self.observations.set_attempt(
                attempt.service_id,
                attempt.attempt_id,
                state=AttemptState.FAILED,
                reason=UNRESPONSIVE,
                message=message,
            )
            failed = attrs.evolve(attempt, state=AttemptState.FAILED, reason=UNRESPONSIVE)
            await self.stop(failed, grace=UNRESPONSIVE_STOP_GRACE)
        finally:
            self.liveness.live.forget_suspicion(attempt.attempt_id)

    async def _watch(self, attempt: AttemptRecord, ready: trio.Event) -> None:
        if attempt.plan_digest is None:
            await self.never_launched(attempt, AttemptState.FAILED)
            return
        service_id, attempt_id, node_id = attempt.service_id, attempt.attempt_id, attempt.node_id
        state = attempt.state
        # What is on record of the engine: written again only when the executor says
        # something new, never on a poll that changes nothing.
        recorded = {name: getattr(attempt, name) for name in ENGINE_FIELDS}
        ready_at = attempt.ready_at
        while True:
            try:
                status = await self.contributors.status(node_id, attempt.fence)
            except (UnknownAttempt, StaleFence):
                await self._not_reported(attempt)
                return
            except FiccError as exc:
                node = await self.observations.node(node_id)
                if node is None or node.state in (NodeState.LOST, NodeState.REVOKED):
                    await self._node_trouble(attempt, exc)
                    return
                await trio.sleep(self.loading_period)
                continue
            engine = engine_fields(status)
            # The probe's time alone is no change: health_at says since when it answers so.
            changes: dict[str, Any] = {
                k: v for k, v in engine.items() if k != "health_at" and recorded[k] != v
            }
            if "health" in changes:
                changes["health_at"] = engine["health_at"]
            if status.state == "ready":
                new = AttemptState.READY
            elif status.state == "starting":
                new = AttemptState.LOADING
            else:
                await self._end(
                    service_id,
                    attempt_id,
                    AttemptState.FAILED,
                    status.reason or status.state,
                    ended_message(status),
                    **changes,
                )
                return
            if new == AttemptState.READY and ready_at is None:
                ready_at = changes["ready_at"] = self.clock()
            if new != state or changes:
                await self.observations.set_attempt(service_id, attempt_id, state=new, **changes)
                state = new
                recorded.update(changes)
            if state == AttemptState.READY:
                ready.set()
            await trio.sleep(
                self.ready_period if state == AttemptState.READY else self.loading_period
            )

    async def _node_trouble(self, attempt: AttemptRecord, exc: FiccError) -> None:
        """The node could not be asked: lost means unknown, revoked means it cannot run it."""
        node = await self.observations.node(attempt.node_id)
        if node is not None and node.state == NodeState.LOST:
            await self.observations.set_attempt(
                attempt.service_id,
                attempt.attempt_id,
                state=AttemptState.UNKNOWN,
                reason="node_lost",
                message=f"node {attempt.node_id} was lost while the attempt ran; whether it "
                "still runs is unknown",
            )
        elif node is None or node.state == NodeState.REVOKED:
            await self._end(
                attempt.service_id,
                attempt.attempt_id,
                AttemptState.STOPPED,
                "node_revoked",
                f"node {attempt.node_id} was revoked; it can no longer run anything",
            )
        else:
            log.info(
                "attempt %s on node %s: %s; trying again",
                attempt.attempt_id,
                attempt.node_id,
                exc.message,
            )

    # -- stopping ------------------------------------------------------------------------------

    async def stop(
        self, attempt: AttemptRecord, reason: str | None = None, *, grace: float = STOP_GRACE
    ) -> bool:
        """Ask the attempt's node to stop it; released once the node confirms it ended.

        ``reason`` is what its end records (``superseded``, ``moved``...) instead of the
        executor's own word; ``grace``: how long its engine has to end before it is killed.
        Returns whether it was released (False: the node could not be asked; try again).
        """
        service_id, attempt_id = attempt.service_id, attempt.attempt_id
        if attempt.state == AttemptState.UNKNOWN:
            await self._resolve_unknown(attempt)
            return False
        if attempt.plan_digest is None:
            await self.never_launched(attempt, AttemptState.STOPPED)
            return True
        if attempt.state not in ENDED:
            await self.observations.set_attempt(service_id, attempt_id, state=AttemptState.STOPPING)
        try:
            status = await self.contributors.stop(attempt.node_id, attempt.fence, grace=grace)
        except (UnknownAttempt, StaleFence):
            # The node does not run it (any more): confirmed ended.
            await self.observations.set_attempt(
                service_id,
                attempt_id,
                state=attempt.state if attempt.state in ENDED else AttemptState.STOPPED,
                released=True,
                **({} if reason is None else {"reason": reason}),
            )
            return True
        except FiccError as exc:
            await self._node_trouble(attempt, exc)
            return False
        failed = attempt.state == AttemptState.FAILED
        await self.observations.set_attempt(
            service_id,
            attempt_id,
            state=AttemptState.FAILED if failed else AttemptState.STOPPED,
            reason=attempt.reason if failed else reason or status.reason or "stopped",
            released=True,
        )
        return True

    async def _resolve_unknown(self, attempt: AttemptRecord) -> None:
        """An unknown attempt ends when its node is back and no longer runs it (or is revoked)."""
        service_id, attempt_id, node_id = attempt.service_id, attempt.attempt_id, attempt.node_id
        node = await self.observations.node(node_id)
        if node is None or node.state == NodeState.REVOKED:
            await self.observations.set_attempt(
                service_id, attempt_id, reason="node_revoked", released=True
            )
            return
        if node.state != NodeState.CONNECTED or not self.contributors.connected_here(node_id):
            return
        try:
            status = await self.contributors.stop(node_id, attempt.fence, grace=STOP_GRACE)
        except (UnknownAttempt, StaleFence):
            await self._end(
                service_id,
                attempt_id,
                AttemptState.STOPPED,
                "not_running_after_reconnect",
                f"node {node_id} is back and no longer runs attempt {attempt_id}",
            )
            return
        except FiccError:
            return
        await self._end(
            service_id,
            attempt_id,
            AttemptState.STOPPED,
            status.reason or "stopped_after_reconnect",
            f"node {node_id} is back; attempt {attempt_id} was stopped there",
        )
