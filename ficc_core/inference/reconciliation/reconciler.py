"""The reconciler: drives every inference service's attempts towards what operators asked.

One driver task per service reads the durable record, acts, publishes the
service's routing view to the :class:`~ficc_core.routing.live.LiveTable`
(:mod:`~ficc_core.inference.reconciliation.publication`), and waits for a change (or a short
period). For a service that should run, one replica task per placement launches
attempts and watches them (:mod:`~ficc_core.inference.reconciliation.attempts`). An attempt that
ends by itself or never becomes ready is ``failed`` and the replica retries with a
new attempt after a capped exponential backoff. An attempt whose node is lost
while it runs becomes ``unknown`` and is never retried by itself: a stop, then a
start with ``acknowledge_unknown: true``, gives it up.

Stopping asks each attempt's node to stop it; a reservation is released only when
the executor confirms the attempt ended. Draining publishes ``draining`` (new
requests refused: the manager already closed admission when the drain answered),
waits for in-flight requests up to the drain bound, then stops.

An unexpected exception while driving one service (a defect, not a refusal) is
logged with its traceback and shown as the service's reason; that service's driver
starts again after the same backoff, and every other service goes on.

A store that fails (:func:`~ficc_core.store.outage.is_store_failure`) is no defect:
the driver and its replica tasks keep what they hold (the published routing view,
the attempts they watch), log it once per outage for the whole reconciler, and try
again with a bounded backoff (:class:`~ficc_core.store.outage.Backoff`); nothing is
marked failed because of it.

The record survives a controller restart: a new reconciler finds the attempts
that were running and watches them (adopts them) instead of launching new ones;
the node's reconnection keeps the ones the controller still wants.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from ...base.errors import FiccError
from ...routing.idle import IdleSignal
from ...routing.live import Admission, LiveTable
from ...store import Transaction
from ...store.outage import Backoff, OutageLog, is_store_failure
from .. import repository
from ..records import (
    ACTIVE,
    ENDED,
    AttemptRecord,
    AttemptState,
    Desired,
    ServiceRecord,
    ServiceState,
)
from ..scaling.activations import ActivationNotes
from .attempts import Attempts
from .generations import IN_PLACE, Running, abandon_rollout, predecessor_stopping, read_running
from .liveness import UNRESPONSIVE, Liveness, LivenessSettings
from .observed import Observations
from .on_demand import OnDemand
from .publication import given_up, publish, retiring, rolled_up
from .succession import Succession, in_place_state, strays, unwatch

if TYPE_CHECKING:
    from ...contributors import NodeRegistry
    from ...models.blobs import BlobStore
    from ...plugins import AdapterRegistry
    from ...schema import Specification
    from ...store import Store
    from ..scaling.metrics import ScalingMetrics
    from ..specification.model_context import ModelContexts
    from .metrics import ReconciliationMetrics

log = logging.getLogger("ficc.inference")


@attrs.define
class _ReplicaTask:
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    #: The attempt it watches now, if any.
    watching: str | None = None


@attrs.define
class _Driver:
    scope: trio.CancelScope
    wake: trio.Event = attrs.Factory(trio.Event)
    #: Set (with no checkpoint before the task ends) once the driver decided to finish:
    #: a later wake starts a new driver instead of waking this one.
    finished: bool = False
    #: One task per wanted replica, by (generation, index).
    replicas: dict[tuple[int, int], _ReplicaTask] = attrs.Factory(dict)
    capabilities: dict[int, tuple[str, ...]] = attrs.Factory(dict)
    #: The reason shown for the last unexpected exception, until a step goes through.
    fault: str | None = None
    #: Attempts an operation handles itself (a move's target and source): the driver
    #: never retires them and no replica task picks them up.
    held: set[str] = attrs.Factory(set)
    #: Attempts told to go (a restart), with the reason their end records: never routed.
    dismissed: dict[str, str] = attrs.Factory(dict)
    #: Attempts being drained and stopped now.
    retiring: set[str] = attrs.Factory(set)
    #: Why the last rollout failed, shown while the service has no other reason.
    notice: str | None = None


@attrs.define
class _Backoff:
    """A capped exponential wait: one second, doubling up to ``cap``."""

    cap: float
    delay: float = 1.0

    async def wait(self) -> None:
        await trio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)

    def reset(self) -> None:
        self.delay = 1.0

    def skip(self) -> None:
        """The wait was spent already (probing an unresponsive replica): only double it."""
        self.delay = min(self.delay * 2, self.cap)


class Reconciler:
    """Drive desired state to actual state for every inference service.

    :param store: where the services and their attempts are recorded.
    :param contributors: the nodes the attempts run on.
    :param live: the routing view it publishes (and the gateway reads).
    :param adapters: the engine adapters that turn a replica into a job.
    :param contexts: the verified models' job inputs.
    :param blobs: where the embedded node's model directories are assembled.
    :param retry_max: the cap of the backoff between attempts (and between a driver's
        restarts after an unexpected exception), in seconds.
    :param give_up_after: a replica whose last this many attempts failed the same way
        stops retrying until the next generation (0: never).
    :param clock: seconds since the epoch, for the records' times.
    :param period: seconds between checks when nothing wakes a driver.
    :param ready_period: seconds between status checks of a ready attempt.
    :param loading_period: seconds between status checks of a loading one.
    :param drain_timeout: how long a retiring attempt's in-flight requests may take.
    :param activation_retry: how long a failed activation's reason answers requests.
    :param liveness: the liveness probes' settings (``interval``, ``timeout``, ``misses``;
        :class:`~.liveness.Liveness`'s defaults where absent).
    :param metrics: the controller's collectors (liveness), or None.
    :param scaling_metrics: the scaling series a failed activation counts in, or None.
    :param idle_signal: returns once no request is in flight on an attempt (the
        gateway serves it; by default nothing is in flight): a retiring attempt drains by it.
    :param follow_interval: seconds between reads of every service's revision while it
        runs, to wake the drivers of services created or changed through another
        controller sharing the store (None: this process makes every change itself).
    """

    def __init__(
        self,
        *,
        store: Store,
        contributors: NodeRegistry,
        live: LiveTable,
        adapters: AdapterRegistry,
        contexts: ModelContexts,
        blobs: BlobStore,
        retry_max: float,
        give_up_after: int = 0,
        clock: Callable[[], float] = time.time,
        period: float = 1.0,
        ready_period: float = 1.0,
        loading_period: float = 0.2,
        drain_timeout: float = 30.0,
        activation_retry: float = 10.0,
        follow_interval: float | None = None,
        liveness: LivenessSettings | None = None,
        metrics: ReconciliationMetrics | None = None,
        scaling_metrics: ScalingMetrics | None = None,
        idle_signal: IdleSignal | None = None,
    ) -> None:
        self.store = store
        self.follow_interval = follow_interval
        self.drain_timeout = drain_timeout
        #: Whether an attempt has requests in flight (the gateway serves it).
        self.idle_signal = IdleSignal() if idle_signal is None else idle_signal
        self.contributors = contributors
        self.live = live
        self.clock = clock
        self.period = period
        self.retry_max = max(1.0, retry_max)
        self.give_up_after = give_up_after
        self.observations = Observations(store, clock=clock, changed=self._poke)
        #: Probes ready attempts' engines; ``liveness`` holds its settings by name
        #: (``interval``, ``timeout``, ``misses``; :mod:`.liveness`).
        self.liveness = Liveness(
            live, contributors, self.observations, metrics=metrics, **(liveness or {})
        )
        self.attempts = Attempts(
            observations=self.observations,
            contributors=contributors,
            adapters=adapters,
            contexts=contexts,
            blobs=blobs,
            clock=clock,
            ready_period=ready_period,
            loading_period=loading_period,
            liveness=self.liveness,
        )
        self.succession = Succession(self)
        #: The failed activations of on-demand services, while recent (the autoscaler
        #: reads them too).
        self.activations = ActivationNotes(clock, activation_retry)
        self.on_demand = OnDemand(store, self.activations, clock, metrics=scaling_metrics)
        #: Ends the replica task watching an attempt (an operation stops it next).
        self.unwatch = unwatch
        self._drivers: dict[str, _Driver] = {}
        self._nursery: trio.Nursery | None = None
        #: Store failures met by any driver or replica task (one warning per outage).
        self.outage = OutageLog("the reconciler", logger=log)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start a driver for every service on record; start more as services are created."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            versions = await self.store.read(repository.service_versions)
            for service_id in versions:
                self.wake(service_id)
            if self.follow_interval is not None:
                nursery.start_soon(self._follow_store, versions, self.follow_interval)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def _follow_store(self, versions: dict[str, tuple[int, float]], interval: float) -> None:
        """Wake the driver of every service whose revision moved since the last read (a
        write through another controller, or this one's: a wake too many is harmless).

        A bounded poll; a failed read is logged and tried again at the next interval.
        """
        while True:
            await trio.sleep(interval)
            try:
                now = await self.store.read(repository.service_versions)
            except Exception as exc:  # whatever the store raised: the next read tries again
                message = exc.message if isinstance(exc, FiccError) else repr(exc)
                log.warning("cannot read the services' revisions: %s", message)
                continue
            for service_id, version in now.items():
                if versions.get(service_id) != version:
                    self.wake(service_id)
            versions = now

    @property
    def running(self) -> bool:
        """Whether :meth:`run` runs now (on the leader of several controllers alone)."""
        return self._nursery is not None

    async def replica_idle(self, attempt_id: str) -> None:
        """Return once the gateway has no request in flight on ``attempt_id``."""
        await self.idle_signal.wait(attempt_id)

    def wake(self, service_id: str) -> None:
        """Make the service's driver act now (starting one if there is none).

        The manager's ``notify``; before :meth:`run` (or after it) it does nothing.
        """
        driver = self._drivers.get(service_id)
        if driver is not None and not driver.finished:
            driver.wake.set()
            return
        if self._nursery is None:
            return
        driver = self._drivers[service_id] = _Driver(scope=trio.CancelScope())
        self._nursery.start_soon(self._drive, service_id, driver)

    async def driver_of(self, service_id: str) -> _Driver:
        """The service's driver (an operation holds its attempts through it)."""
        while True:
            self.wake(service_id)
            driver = self._drivers.get(service_id)
            if driver is not None and not driver.finished:
                return driver
            await trio.sleep(self.period / 10)

    def node_changed(self, node_id: str) -> None:
        """A node's connection here ended, or it was heard again after a silence: every
        driver looks again at once (the node registry's ``notify``)."""
        for service_id in list(self._drivers):
            self._poke(service_id)

    def _poke(self, service_id: str) -> None:
        """One of the service's attempts changed: its driver (if any) looks again."""
        driver = self._drivers.get(service_id)
        if driver is not None:
            driver.wake.set()

    # -- one service -----------------------------------------------------------------------------

    async def _drive(self, service_id: str, driver: _Driver) -> None:
        backoff = _Backoff(self.retry_max)
        outage = Backoff()
        try:
            with driver.scope:
                while True:
                    began = trio.current_time()
                    fault: BaseException | None = None
                    try:
                        if await self._session(service_id, driver):
                            return
                    except* Exception as group:
                        fault = group  # cancellation is not caught: it goes on up
                    if fault is not None and is_store_failure(fault):
                        # The store is down (met where no retry wraps it): no defect to
                        # show, and the driver starts again once it answers.
                        self.outage.failed(fault, f"driving service {service_id}")
                        driver.replicas.clear()
                        driver.retiring.clear()
                        if driver.finished:
                            return
                        await outage.wait()
                        continue
                    outage.reset()
                    # A defect met while driving this one service (a bug, never an
                    # expected refusal) must not end the others or the API: it is
                    # shown on the service and the driver starts again after a backoff.
                    if trio.current_time() - began > self.retry_max:
                        backoff.reset()  # it had run well for a while
                    driver.replicas.clear()  # their tasks ended with the session
                    driver.retiring.clear()
                    await self._fault(service_id, driver, fault, backoff.delay)
                    if driver.finished:
                        return  # it had decided to end: the next wake starts a new driver
                    await backoff.wait()
        finally:
            if self._drivers.get(service_id) is driver:
                del self._drivers[service_id]

    async def _session(self, service_id: str, driver: _Driver) -> bool:
        """Step the service (and run its replica tasks) until it is done: ``True``."""
        async with trio.open_nursery() as nursery:
            backoff = Backoff()
            while True:
                driver.wake = trio.Event()
                try:
                    done = await self._step(service_id, driver, nursery)
                    if driver.fault is not None:
                        # A step went through again: the fault's reason goes (unless a
                        # step replaced it).
                        await self.observations.clear_reason(service_id, driver.fault)
                        driver.fault = None
                except Exception as exc:
                    # The routing view stays as published and the replica tasks go on.
                    await self._store_failed(exc, backoff, f"driving service {service_id}")
                    continue
                self._store_answered(backoff)
                # A change recorded while the step ran (a start right after a stop
                # settled) is acted on before the driver may finish.
                if done and not driver.wake.is_set():
                    driver.finished = True
                    nursery.cancel_scope.cancel()
                    return True
                with trio.move_on_after(self.period):
                    await driver.wake.wait()

    async def _fault(
        self, service_id: str, driver: _Driver, fault: BaseException | None, delay: float
    ) -> None:
        """Log the unexpected exception with its traceback and show it on the service."""
        log.error(
            "service %s: internal error while driving it; retrying in %g s",
            service_id,
            delay,
            exc_info=fault,
        )
        driver.fault = (
            f"internal error in the controller while driving this service "
            f"({_describe(fault)}); retrying in {delay:g} s"
        )
        try:
            await self.observations.set_service(service_id, reason=driver.fault)
        except Exception:
            log.exception("service %s: cannot record its internal error", service_id)

    async def _read(self, service_id: str) -> tuple[Running | None, list[AttemptRecord]]:
        def read(tx: Transaction) -> tuple[Running | None, list[AttemptRecord]]:
            return read_running(tx, service_id), repository.attempts(tx, service_id)

        return await self.store.read(read)

    async def _step(self, service_id: str, driver: _Driver, nursery: trio.Nursery) -> bool:
        running, attempts = await self._read(service_id)
        if running is None:
            self.live.remove(service_id)
            return True
        record = running.record
        specification = record.specification()
        try:
            if record.desired == Desired.RUNNING:
                await self._run_replicas(running, attempts, driver, nursery)
                return False
            driver.notice = None
            if running.rollout is not None:
                now = self.clock()
                await self.store.write(lambda tx: abandon_rollout(tx, service_id, None, now))
            if record.desired == Desired.DRAINING:
                await self._drain(record, specification, attempts, driver)
            else:
                return await self._stop_all(record, specification, attempts, driver)
        except FiccError as exc:
            if is_store_failure(exc):
                raise  # an outage, not the service's reason (the driver tries again)
            log.warning("service %s: %s (%s)", service_id, exc.message, exc.code)
            await self.observations.set_service(service_id, reason=exc.message)
        return False

    async def _publish(
        self,
        record: ServiceRecord,
        specification: Specification,
        attempts: Sequence[AttemptRecord],
        driver: _Driver,
        admission: Admission,
        wanted: tuple[int, ...] | None = None,
        handed: tuple[int, tuple[int, ...]] | None = None,
    ) -> None:
        if admission != "stopped" and not driver.capabilities:
            # Know what the engine serves before publishing (an adopted attempt was
            # never launched by this reconciler).
            computed = await self.attempts.capabilities(record, specification)
            if computed is not None:
                driver.capabilities[0] = computed
        capabilities = next(iter(driver.capabilities.values()), ())
        model = None
        if admission != "stopped":
            try:
                model = (await self.attempts.model(record, specification)).record
            except FiccError:
                pass  # the model is gone: the service is still published without its name
        activation, failure = self.on_demand.activation(record, specification, wanted)
        publish(
            self.live,
            self.contributors,
            record,
            specification,
            attempts,
            capabilities,
            admission,
            # One being retired is never routed again, even if its placement is wanted
            # again meanwhile (a scaled service woken while its replica stops).
            dismissed=driver.dismissed.keys() | driver.retiring,
            model=model,
            wanted=wanted,
            handed=handed,
            activation=activation,
            activation_error=None if failure is None else failure.public(),
        )

    async def _run_replicas(
        self,
        running: Running,
        attempts: Sequence[AttemptRecord],
        driver: _Driver,
        nursery: trio.Nursery,
    ) -> None:
        record = running.record
        specification = record.specification()
        wanted = running.wanted()
        for key, task in list(driver.replicas.items()):
            if key[1] not in wanted.get(key[0], ()):
                task.scope.cancel()  # its generation (or the replica) is no longer wanted
                del driver.replicas[key]
        for generation, indices in wanted.items():
            for index in indices:
                if (generation, index) not in driver.replicas:
                    task = driver.replicas[(generation, index)] = _ReplicaTask()
                    nursery.start_soon(self._replica, record.id, index, generation, driver, task)
        if running.rollout is not None and await self.succession.rollout_step(
            running, attempts, driver
        ):
            driver.wake.set()  # it cut over or gave up: the next step reads it again
            return
        released = {a.attempt_id for a in attempts if a.released}
        for attempt_id in [i for i in driver.dismissed if i in released]:
            del driver.dismissed[attempt_id]
        for attempt in strays(attempts, running.specifications(), driver.held):
            # Another node than its placement's, and no operation holds it: a move the
            # controller did not finish (it restarted meanwhile). It goes; the replica
            # serves on its placement.
            driver.dismissed.setdefault(attempt.attempt_id, "move_interrupted")
        runs = wanted[record.generation]
        if await self.on_demand.failed(record, specification, attempts, runs):
            driver.wake.set()  # it is idle again: the next step reads it
            return
        if runs or specification.scaling is None:
            state, reason = rolled_up(
                runs,
                attempts,
                record.generation,
                self.give_up_after,
                self._trouble,
                starting=record.state == ServiceState.STARTING,
            )
        else:
            state, reason = ServiceState.IDLE, self.on_demand.idle_reason(record)
        reason = reason or driver.notice
        state, reason = in_place_state(running, attempts, state, reason)
        await self.observations.set_service(record.id, state=state, reason=reason)
        # Published before anything retires, so no new request goes to a retiring attempt.
        handed = None
        if running.rollout is not None and running.rollout.strategy in IN_PLACE:
            handed = (running.rollout.generation, wanted[running.rollout.generation])
        await self._publish(record, specification, attempts, driver, "serving", runs, handed)
        for attempt in retiring(attempts, wanted, driver.dismissed):
            if attempt.attempt_id not in driver.held | driver.retiring:
                driver.retiring.add(attempt.attempt_id)
                nursery.start_soon(self.succession.retire, record, attempt, driver)
        await self.succession.settle_reservations(running, attempts)

    def _trouble(self, node_id: str, attempt_id: str) -> str | None:
        """Why a ready attempt cannot count as serving: its node's trouble, or its liveness."""
        return self.contributors.attempt_trouble(node_id, attempt_id) or self.liveness.trouble(
            attempt_id
        )

    async def _drain(
        self,
        record: ServiceRecord,
        specification: Specification,
        attempts: Sequence[AttemptRecord],
        driver: _Driver,
    ) -> None:
        await self._publish(record, specification, attempts, driver, "draining")
        deadline = record.drain_deadline or self.clock()
        remaining = max(0.0, deadline - self.clock())
        with trio.move_on_after(min(remaining, self.period)):
            await self.live.wait_idle(record.id)
        if self.live.inflight(record.id) and self.clock() < deadline:
            return  # the next step waits again
        await self.observations.drained(record.id)
        driver.wake.set()

    async def _stop_all(
        self,
        record: ServiceRecord,
        specification: Specification,
        attempts: Sequence[AttemptRecord],
        driver: _Driver,
    ) -> bool:
        service_id = record.id
        await self._publish(record, specification, attempts, driver, "stopped")
        # Replica tasks end at a safe point (a launch in flight completes first), so no
        # engine starts after it was stopped.
        for task in driver.replicas.values():
            task.scope.cancel()
        for task in driver.replicas.values():
            await task.done.wait()
        driver.replicas.clear()
        _, attempts = await self.observations.read(service_id)
        async with trio.open_nursery() as nursery:
            for attempt in attempts:
                if not attempt.released:
                    nursery.start_soon(self.attempts.stop, attempt)
        _, attempts = await self.observations.read(service_id)
        unreleased = [a for a in attempts if not a.released]
        if any(a.state != AttemptState.UNKNOWN for a in unreleased):
            stopped = record.desired == Desired.STOPPED
            stopping = ServiceState.STOPPING if stopped else ServiceState.REMOVING
            await self.observations.set_service(service_id, state=stopping)
            return False
        if await self.observations.settle_stop(service_id, {a.replica for a in unreleased}):
            self.live.remove(service_id)
            return True
        return not unreleased and record.desired == Desired.STOPPED

    # -- one replica -------------------------------------------------------------------------------

    async def _replica(
        self,
        service_id: str,
        index: int,
        generation: int,
        driver: _Driver,
        task: _ReplicaTask,
    ) -> None:
        try:
            with task.scope:
                await self._replica_loop(service_id, index, generation, driver, task)
        finally:
            task.done.set()
            key = (generation, index)
            if driver.replicas.get(key) is task and not task.scope.cancel_called:
                # It ended by itself (an unknown outcome, or it gave up): let the driver see it.
                driver.wake.set()

    async def _replica_loop(
        self,
        service_id: str,
        index: int,
        generation: int,
        driver: _Driver,
        task: _ReplicaTask,
    ) -> None:
        backoff = _Backoff(self.retry_max)
        outage = Backoff()
        while True:
            task.watching = None
            try:
                if await self._replica_turn(service_id, index, generation, driver, task, backoff):
                    return
            except Exception as exc:
                # What it watched stays as it is; the next turn reads the record again.
                await self._store_failed(exc, outage, f"replica {index} of service {service_id}")
                continue
            self._store_answered(outage)

    async def _store_failed(self, exc: Exception, backoff: Backoff, what: str) -> None:
        """A loop's turn met ``exc``: a store outage is logged (once) and waited out with
        ``backoff``; anything else is raised again (a defect: the driver's fault path)."""
        if not is_store_failure(exc):
            raise exc
        self.outage.failed(exc, what)
        await backoff.wait()

    def _store_answered(self, backoff: Backoff) -> None:
        """A loop's turn went through: an outage it waited out is over."""
        if backoff.delay:
            backoff.reset()
            self.outage.answered()

    async def _replica_turn(
        self,
        service_id: str,
        index: int,
        generation: int,
        driver: _Driver,
        task: _ReplicaTask,
        backoff: _Backoff,
    ) -> bool:
        """One turn of a replica task: read, then watch, wait or launch; ``True`` to end."""
        running, attempts = await self._read(service_id)
        if running is None or running.record.desired != Desired.RUNNING:
            return True
        specification = running.specifications().get(generation)
        if specification is None or index not in running.wanted().get(generation, ()):
            return True  # no longer wanted: a rollout cut over or gave up, or scaled in
        record = attrs.evolve(running.record, generation=generation)
        mine = [a for a in attempts if a.replica == index and a.generation == generation]
        last = mine[-1] if mine else None
        unreleased = [a for a in mine if not a.released]
        if any(a.attempt_id in driver.held for a in mine):
            # A move holds the replica (its source may have ended already, on a node
            # that is gone): nothing launches until it is over.
            await trio.sleep(self.attempts.loading_period)
            return False
        # The newest attempt no operation handles: the one this task follows.
        busy = driver.held | set(driver.dismissed)
        free = [a for a in unreleased if a.attempt_id not in busy]
        if free and free[-1].state == AttemptState.UNKNOWN:
            return True  # never retried by itself: stop, then start with acknowledgement
        if free and _stop_unconfirmed(free[-1]) and free[-1].attempt_id not in driver.retiring:
            # Told to stop, its end not confirmed: by a leader killed or deposed in the
            # middle (or a call that failed). The stop is finished here, never watched as
            # if it still served, and the replica starts again only once the node
            # confirmed its engine ended: never a second engine beside it.
            if not await self.attempts.stop(free[-1]):
                await trio.sleep(self.attempts.ready_period)
            return False
        if free and free[-1].state in ACTIVE:
            task.watching = free[-1].attempt_id
            # An unresponsive engine waits the crash back-off for an answer before it goes.
            await self.attempts.watch(free[-1], grace=lambda: backoff.delay)
            return False
        if unreleased:
            # An operation handles the replica's attempts (a move, a restart): the
            # next one starts once they ended or were handed over.
            await trio.sleep(self.attempts.loading_period)
            return False
        if given_up(attempts, generation, index, self.give_up_after) is not None:
            return True  # it failed the same way too often: the service shows why
        if predecessor_stopping(running, attempts, generation, index):
            # An in-place rollout: the replica it replaces frees the node first.
            await trio.sleep(self.attempts.loading_period)
            return False
        if last is not None and last.state == AttemptState.FAILED:
            # The previous attempt failed: wait, doubling up to the cap. (One told to
            # go, a restart's, is replaced at once; an unresponsive one waited its
            # back-off already, probed for an answer.)
            if last.reason == UNRESPONSIVE:
                backoff.skip()
            else:
                await backoff.wait()
        number = (last.number if last else 0) + 1
        capabilities = await self.attempts.launch(record, specification, index, number)
        if capabilities is not None:
            driver.capabilities[index] = capabilities
        return False


def _stop_unconfirmed(attempt: AttemptRecord) -> bool:
    """Whether ``attempt`` was told to stop (``stopping``, or ended on record but not
    released) and its node has not confirmed the end yet."""
    return not attempt.released and (
        attempt.state == AttemptState.STOPPING or attempt.state in ENDED
    )


def _describe(fault: BaseException | None) -> str:
    while isinstance(fault, BaseExceptionGroup) and len(fault.exceptions) == 1:
        fault = fault.exceptions[0]
    return "unknown" if fault is None else f"{type(fault).__name__}: {fault}"


__all__ = ["Reconciler"]
