"""Admission: replica slots and the bounded wait queue.

Only the :class:`~ficc_core.inference.live.LiveService`'s ready replicas of its
current generation; the least loaded one with a free slot (ties broken at random,
by the injected :class:`random.Random`), each capped at the service's
``concurrency``. Without a free slot a request waits in a bounded FIFO queue
(``queue_factor`` x total capacity) until a slot frees, the request deadline or
``max_queue_wait``; it re-checks authority and the service's view while it waits.
"""

from __future__ import annotations

import random
from collections import deque
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .errors import NoReadyReplica, ServiceSaturated

if TYPE_CHECKING:
    from ..errors import FiccError
    from ..inference.live import LiveReplica, LiveService
    from .accounting import Accounting
    from .checks import RequestChecks
    from .request import Request
    from .scoring import Router


@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class _Queue:
    waiters: deque[_Waiter] = attrs.field(factory=deque)

    def kick(self) -> None:
        """Wake the first waiter not yet woken."""
        for waiter in self.waiters:
            if not waiter.event.is_set():
                waiter.event.set()
                return


def no_replica(view: LiveService, why: str, last: FiccError | None) -> NoReadyReplica:
    """The refusal of a request no replica of ``view`` could take (``last``: the last failure)."""
    details: dict[str, Any] = {"service": view.id, "ready_replicas": len(view.replicas)}
    if last is not None:
        details["last_error"] = {"code": last.code, "message": last.message}
    return NoReadyReplica(
        f"service {view.id!r} has no ready replica to serve: {why}", details=details
    )


class Admission:
    """Who holds which replica slot, and who waits for one (see the module docs).

    :param checks: the request checks (a waiting request's view and authority).
    :param accounting: the metrics (in-flight and queued gauges).
    :param rng: breaks ties between equally loaded replicas.
    """

    def __init__(
        self,
        checks: RequestChecks,
        accounting: Accounting,
        *,
        rng: random.Random,
        queue_factor: int,
        max_queue_wait: float,
        recheck_interval: float,
    ) -> None:
        self.checks = checks
        self.accounting = accounting
        self.rng = rng
        self.queue_factor = queue_factor
        self.max_queue_wait = max_queue_wait
        self.recheck_interval = recheck_interval
        self._load: dict[str, int] = {}
        self._queues: dict[str, _Queue] = {}
        self._idle: dict[str, trio.Event] = {}

    def load(self, replica_key: str) -> int:
        """Requests in flight on the replica with ``replica_key`` (its attempt ID)."""
        return self._load.get(replica_key, 0)

    async def wait_idle(self, replica_key: str) -> None:
        """Return once no request is in flight on the replica ``replica_key`` (draining one
        attempt: the caller bounds the wait)."""
        while self._load.get(replica_key, 0):
            event = self._idle.get(replica_key)
            if event is None:
                event = self._idle[replica_key] = trio.Event()
            await event.wait()

    def queued(self, service_id: str) -> int:
        """Requests of ``service_id`` waiting for a slot."""
        queue = self._queues.get(service_id)
        return 0 if queue is None else len(queue.waiters)

    #: Chooses among the replicas (:class:`~ficc_core.gateway.scoring.Router`); the gateway sets it.
    router: Router

    def pick(self, view: LiveService, tried: set[str], request: Request) -> LiveReplica | None:
        """The replica of ``view`` ``request`` goes to, or None: never one in ``tried``, never
        one with ``view.concurrency`` requests in flight here (:mod:`.scoring` chooses)."""
        return self.router.pick(view, tried, request)

    def take(self, request: Request, replica: LiveReplica) -> None:
        """Give ``request`` a slot on ``replica``."""
        self._load[replica.key] = self._load.get(replica.key, 0) + 1
        request.replica, request.holds_slot = replica, True
        self.accounting.series(request.service_id, replica.key).inflight.inc()

    def release(self, request: Request) -> None:
        """Free ``request``'s slot (if it holds one) and wake the next waiter."""
        if not request.holds_slot or request.replica is None:
            return
        request.holds_slot = False
        key = request.replica.key
        left = self._load.get(key, 1) - 1
        if left > 0:
            self._load[key] = left
        else:
            self._load.pop(key, None)
            idle = self._idle.pop(key, None)
            if idle is not None:
                idle.set()
        self.accounting.series(request.service_id, key).inflight.dec()
        queue = self._queues.get(request.service_id)
        if queue is not None:
            queue.kick()

    async def slot(self, request: Request, tried: set[str], last: FiccError | None) -> None:
        """Take a slot on a replica not in ``tried``, waiting in the queue if need be."""
        view = self.checks.current(request)
        if not [r for r in view.replicas if r.key not in tried]:
            why = "every replica failed before answering" if tried else "none is ready"
            raise no_replica(view, why, last)
        queue = self._queues.setdefault(request.service_id, _Queue())
        if not queue.waiters:
            replica = self.pick(view, tried, request)
            if replica is not None:
                self.take(request, replica)
                return
        capacity = view.concurrency * len(view.replicas)
        if len(queue.waiters) >= self.queue_factor * capacity:
            raise ServiceSaturated(
                f"service {view.id!r} is saturated: {capacity} requests in flight and "
                f"{len(queue.waiters)} waiting",
                details={"capacity": capacity, "queued": len(queue.waiters)},
            )
        waiter = _Waiter()
        queue.waiters.append(waiter)
        gauge = self.accounting.waiting(request.service_id)
        gauge.inc()
        limit = min(request.deadline, trio.current_time() + self.max_queue_wait)
        try:
            while True:
                now = trio.current_time()
                if now >= limit:
                    raise no_replica(
                        view, f"no slot freed within {now - request.started:.1f} s", last
                    )
                with trio.move_on_at(min(limit, now + self.recheck_interval)):
                    await waiter.event.wait()
                view = self.checks.current(request)
                problem = self.checks.authority(request.actor)
                if problem is not None:
                    raise problem
                if not [r for r in view.replicas if r.key not in tried]:
                    raise no_replica(view, "none is ready", last)
                replica = self.pick(view, tried, request)
                if replica is not None:
                    self.take(request, replica)
                    return
                waiter.event = trio.Event()
        finally:
            woken = waiter.event.is_set()
            queue.waiters.remove(waiter)
            gauge.dec()
            if not queue.waiters:
                self._queues.pop(request.service_id, None)
            elif woken or request.holds_slot:
                # Pass the turn on: another slot may be free for the next one.
                queue.kick()
