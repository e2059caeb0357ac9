"""The autoscaler: wakes idle on-demand services and scales services with ``scaling``.

Two ways in:

- :meth:`Autoscaler.activate` serves the gateway's
  :class:`~ficc_core.routing.activation.ActivationChannel`: a request found an idle
  on-demand service. The first call starts one activation (a durable
  :func:`~.changes.grow` that takes a candidate's reservation) in the autoscaler's own
  task, so a client that leaves does not cancel it; every call made meanwhile joins it.
  It returns once the activation is recorded (the reconciler launches the replica)
  or raises its refusal: ``no_capacity`` when no candidate fits, or a recent failed
  activation's reason (for ``activation_retry`` seconds).
- :meth:`Autoscaler.run` looks at every running scaled service once a ``period``:
  fewer than ``min`` (or one, pinned) running starts one; queued requests or queue
  wait above their targets (``scale_out_queue`` per ready replica, ``scale_out_wait``)
  held for ``scale_out_window`` start another, up to ``max``; a replica that served
  nothing for the service's ``idle_timeout`` stops while more than the floor run and
  no request refused ``activation_timeout`` is expected back (``Demand.returning``). Two
  decisions of one service are ``scale_cooldown`` apart (an activation is never held
  back), and nothing scales while the service rolls out. Each decision is a
  ``service.scaled`` event with its figures, and a metric.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ...base.errors import FiccError
from ...routing.activation import ActivationChannel
from ...routing.demand import Demand, DemandBoard
from ...store import Transaction
from ...store.outage import OutageLog, as_store_unavailable, is_store_failure
from .. import repository
from ..records import Desired
from ..specification.replicas import floor, running_indices
from . import changes
from .activations import Failure
from .changes import NoCapacity

if TYPE_CHECKING:
    from ...config import Config
    from ...routing.live import LiveService, LiveTable
    from ...store import Store
    from ..reconciliation.reconciler import Reconciler
    from ..records import ServiceRecord
    from ..specification.model_context import ModelContexts
    from .metrics import ScalingMetrics

log = logging.getLogger("ficc.inference")

#: Seconds a look scheduled for the end of a window comes after it (clocks differ by that).
_DUE_MARGIN = 0.005


def activation_failed(service_id: str, failure: Failure, retry: float) -> FiccError:
    """The refusal of a request whose service's activation failed."""
    retry_after = max(1, math.ceil(retry))
    return FiccError(
        failure.message,
        code=failure.code,
        status=503,
        headers={"Retry-After": str(retry_after)},
        details={
            **failure.details,
            "service": service_id,
            "activation": "failed",
            "retry_after": retry_after,
        },
    )


@attrs.define(eq=False)
class _Flight:
    done: trio.Event = attrs.Factory(trio.Event)
    error: FiccError | None = None


@attrs.define
class _Watch:
    """What the autoscaler remembers of one service between looks."""

    #: When a scale-out signal began holding (the clock's), or None.
    pressed_since: float | None = None
    #: The last look at which no signal could count (none seen, or a replica loading),
    #: on the clock: a window counts from no earlier. None before the first such look.
    not_before: float | None = None
    #: The last blocked scale-out's reason, logged once until it changes.
    blocked: str | None = None


class Autoscaler:
    """Activation and scale decisions (see the module docs).

    :param activations: the autoscaler serves it with :meth:`activate` (the gateway
        calls it for a request to an idle on-demand service).
    :param board: the gateway's figures of one service (the gateway serves it with
        ``Gateway.demand``; by default no demand).
    """

    def __init__(
        self,
        *,
        store: Store,
        reconciler: Reconciler,
        contexts: ModelContexts,
        live: LiveTable,
        config: Config,
        metrics: ScalingMetrics,
        clock: Callable[[], float] = time.time,
        period: float = 0.5,
        activations: ActivationChannel | None = None,
        board: DemandBoard | None = None,
    ) -> None:
        self.store = store
        self.reconciler = reconciler
        self.contexts = contexts
        self.live = live
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.period = period
        #: What the gateway saw of each service's requests.
        self.board = DemandBoard() if board is None else board
        self._flights: dict[str, _Flight] = {}
        self._watch: dict[str, _Watch] = {}
        self._nursery: trio.Nursery | None = None
        #: Store failures met while scaling (one warning per outage).
        self.outage = OutageLog("the autoscaler", logger=log)
        if activations is not None:
            activations.serve(self.activate)

    # -- activation ----------------------------------------------------------------------

    async def activate(self, service_id: str) -> None:
        """Wake the idle on-demand service ``service_id`` (see the module docs)."""
        failure = self.reconciler.activations.recent(service_id)
        if failure is not None:
            raise activation_failed(service_id, failure, self.config.activation_retry)
        flight = self._flights.get(service_id)
        if flight is None:
            if self._nursery is None:
                raise FiccError(
                    f"service {service_id!r} is idle and the controller is not running its "
                    "autoscaler",
                    code="activation_failed",
                    status=503,
                    details={"service": service_id},
                )
            flight = self._flights[service_id] = _Flight()
            self._nursery.start_soon(self._activate, service_id, flight)
        await flight.done.wait()
        if flight.error is not None:
            raise flight.error

    async def _activate(self, service_id: str, flight: _Flight) -> None:
        try:
            grown = await self._grow(service_id, "activation", {}, only_when_idle=True)
            if grown is not None:
                self.metrics.activations.labels(service_id, "started").inc()
        except NoCapacity as exc:
            self.metrics.activations.labels(service_id, "no_capacity").inc()
            failure = self.reconciler.activations.failed(
                service_id, exc.code, exc.message, {"reasons": exc.details.get("reasons", [])}
            )
            self.reconciler.wake(service_id)  # the view says failed: every waiter hears it
            flight.error = activation_failed(service_id, failure, self.config.activation_retry)
        except FiccError as exc:
            flight.error = as_store_unavailable(exc) if is_store_failure(exc) else exc
        except Exception as exc:  # a defect: the waiters hear it, the autoscaler goes on
            if is_store_failure(exc):
                # The store is down: the waiters hear 503 store_unavailable (retry soon).
                flight.error = as_store_unavailable(exc)
                return
            log.exception("service %s: activation failed unexpectedly", service_id)
            flight.error = FiccError(
                f"the activation failed: {type(exc).__name__}: {exc}",
                code="activation_failed",
                status=503,
                details={"service": service_id},
            )
        finally:
            flight.done.set()
            if self._flights.get(service_id) is flight:
                del self._flights[service_id]

    async def _grow(
        self,
        service_id: str,
        reason: str,
        figures: dict[str, Any],
        *,
        only_when_idle: bool = False,
    ) -> int | None:
        """One more replica of ``service_id`` (a durable decision); wake its driver."""
        record = await self.store.read(lambda tx: repository.service(tx, service_id))
        if record is None:
            return None
        model = await self.contexts.get(record.project_id, record.model_id)
        now = self.clock()

        def write(tx: Transaction) -> int | None:
            current = repository.service(tx, service_id)
            if current is None:
                return None
            return changes.grow(
                tx,
                current,
                model,
                reason=reason,
                now=now,
                figures=figures,
                only_when_idle=only_when_idle,
            )

        grown = await self.store.write(write)
        if grown is not None:
            self.reconciler.activations.clear(service_id)
            view = self.live.get(service_id)
            if view is not None and view.activation in ("idle", "failed"):
                # Said at once, before the driver's next step publishes it: a request
                # that asked must not read the failure this activation replaces.
                self.live.publish(
                    attrs.evolve(view, activation="activating", activation_error=None)
                )
            self.metrics.scaling_decisions.labels(service_id, "out", reason).inc()
            log.info("service %s: replica %d starts (%s) %s", service_id, grown, reason, figures)
            self.reconciler.wake(service_id)
        return grown

    async def _shrink(
        self, record: ServiceRecord, index: int, reason: str, figures: dict[str, Any]
    ) -> None:
        now = self.clock()
        message = (
            f"replica {index} served nothing for {figures['idle_for']:g} s (idle timeout "
            f"{figures['idle_timeout']:g} s): it drains and stops"
            + ("; the service is idle until the next request" if reason == "idle" else "")
        )

        def write(tx: Transaction) -> bool:
            current = repository.service(tx, record.id)
            if current is None or current.desired != Desired.RUNNING:
                return False
            return changes.shrink(
                tx, current, index, reason=reason, now=now, message=message, figures=figures
            )

        if await self.store.write(write):
            self.metrics.scaling_decisions.labels(record.id, "in", reason).inc()
            log.info("service %s: replica %d stops (%s) %s", record.id, index, reason, figures)
            self.reconciler.wake(record.id)

    # -- the periodic look ----------------------------------------------------------------

    async def run(
        self, *, decide: bool = True, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Look at every scaled service once a period, until cancelled.

        Without ``decide`` (a standby of several controllers) it only runs activations:
        a request through the standby wakes an idle service with the same durable
        decision, which the leader then carries out; scaling out and in stay the leader's.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while decide:
                    await trio.sleep(self._pause())
                    for view in self.live.services():
                        if view.scaled:
                            await self._look_safely(view.id)
                    for service_id in [s for s in self._watch if self.live.get(s) is None]:
                        del self._watch[service_id]
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def _look_safely(self, service_id: str) -> None:
        try:
            await self.look(service_id)
        except Exception as exc:
            if is_store_failure(exc):
                # Scaling waits for the store (one warning per outage); the next period
                # looks again.
                self.outage.failed(exc, f"scaling service {service_id}")
            elif isinstance(exc, FiccError):
                log.warning("service %s: scaling: %s (%s)", service_id, exc.message, exc.code)
            else:
                log.exception("service %s: scaling failed unexpectedly", service_id)
        else:
            self.outage.answered()

    async def look(self, service_id: str) -> None:
        """One look at ``service_id``: the floor, then scale out, then scale in."""

        def read(tx: Transaction) -> tuple[ServiceRecord | None, bool]:
            return repository.service(tx, service_id), repository.rollout(tx, service_id) is None

        record, settled = await self.store.read(read)
        if record is None or record.desired != Desired.RUNNING or not settled:
            self._watch.pop(service_id, None)
            return
        specification = record.specification()
        if specification.scaling is None:
            return
        active = running_indices(specification, record.active)
        self.metrics.scaling_replicas.labels(service_id).set(len(active))
        watch = self._watch.setdefault(service_id, _Watch())
        least = floor(specification, record.pinned)
        if len(active) < least:
            reason = "pinned" if record.pinned and len(active) == 0 else "min"
            await self._blocked(watch, service_id, reason, {"min": least})
            return
        view = self.live.get(service_id)
        if view is None:
            return
        demand = self.board.read(service_id)
        now = self.clock()
        cooled = record.scaled_at is None or now - record.scaled_at >= self.config.scale_cooldown
        if await self._scale_out(record, view, demand, active, watch, now, cooled):
            return
        idle_timeout = specification.scaling.idle_timeout or self.config.idle_timeout
        if len(active) <= least or not cooled:
            return
        idle = [
            (replica.index, demand.idle_for.get(replica.key, 0.0))
            for replica in view.replicas
            if replica.index in active
        ]
        idle = [(index, seconds) for index, seconds in idle if seconds >= idle_timeout]
        # Requests refused activation_timeout are demand until their Retry-After (and a
        # margin) passed: stopping the replica their wait woke would make each retry
        # start another load, and time out again.
        if idle and demand.queued == 0 and demand.returning == 0:
            index, seconds = max(idle)
            reason = "idle" if len(active) == 1 else "scale_in"
            await self._shrink(
                record,
                index,
                reason,
                {"idle_for": round(seconds, 1), "idle_timeout": idle_timeout},
            )

    async def _scale_out(
        self,
        record: ServiceRecord,
        view: LiveService,
        demand: Demand,
        active: tuple[int, ...],
        watch: _Watch,
        now: float,
        cooled: bool,
    ) -> bool:
        """Start another replica when the scale-out signal held for the window."""
        ready = len(view.replicas)
        per_replica = demand.queued / ready if ready else 0.0
        signal = None
        if ready and per_replica > self.config.scale_out_queue:
            signal = "queue"
        elif ready and demand.oldest_wait > self.config.scale_out_wait:
            signal = "wait"
        if signal is None or ready < len(active):
            # No pressure, or a replica is still loading: what it brings is not seen yet.
            watch.pressed_since, watch.not_before = None, now
            return False
        if watch.pressed_since is None:
            watch.pressed_since = self._onset(signal, demand, ready, now, watch.not_before)
        held = now - watch.pressed_since
        specification = record.specification()
        if held < self.config.scale_out_window or not cooled:
            return False
        if len(active) >= specification.max_replicas:
            return False
        figures = {
            "queued": demand.queued,
            "queued_per_replica": round(per_replica, 2),
            "oldest_wait": round(demand.oldest_wait, 3),
            "held_for": round(held, 1),
        }
        # The next window counts from this decision (or this refusal, for want of room).
        watch.pressed_since, watch.not_before = None, now
        return await self._blocked(watch, record.id, f"scale_out_{signal}", figures)

    def _onset(
        self, signal: str, demand: Demand, ready: int, now: float, not_before: float | None
    ) -> float:
        """Since when ``signal`` has held, as the waiting requests tell: the window
        counts from then, not from the look that first saw it.

        The queue has been above ``scale_out_queue`` per ready replica at least since the
        request that took it past came (:meth:`Demand.waited`), the wait above its target
        since the oldest request's wait passed it; never before the last look at which
        no signal counted, and from this look when there was none.
        """
        if not_before is None:
            return now
        if signal == "queue":
            held = demand.waited(math.floor(self.config.scale_out_queue * ready) + 1)
        else:
            held = demand.oldest_wait - self.config.scale_out_wait
        return max(now - max(0.0, held), not_before)

    def _pause(self) -> float:
        """Seconds until the next look: a period, or less when a signal's window ends
        sooner (a scale-out is decided when the window has held, not up to a period later)."""
        now, pause = self.clock(), self.period
        for watch in self._watch.values():
            if watch.pressed_since is not None:
                due = watch.pressed_since + self.config.scale_out_window + _DUE_MARGIN - now
                if due > 0:
                    pause = min(pause, due)
        return pause

    async def _blocked(
        self, watch: _Watch, service_id: str, reason: str, figures: dict[str, Any]
    ) -> bool:
        """Grow, logging a refusal for want of capacity once until it changes."""
        try:
            grown = await self._grow(service_id, reason, figures)
        except NoCapacity as exc:
            if watch.blocked != exc.message:
                watch.blocked = exc.message
                log.warning("service %s: cannot scale out (%s): %s", service_id, reason, exc)
            return False
        watch.blocked = None
        return grown is not None


__all__ = ["Autoscaler", "activation_failed"]
