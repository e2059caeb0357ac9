"""Admission: replica slots, and a bounded wait queue per priority band.

Only the :class:`~ficc_core.routing.live.LiveService`'s ready replicas of its
current generation take requests, each up to the service's ``concurrency``
(:meth:`Admission.pick` asks the :mod:`.scoring` router which). Every request is in a band
(:mod:`ficc_core.routing.bands`: its credential's, else its project's, else
``band_default``; a band header may only lower it).

A request starts at once when nothing of its band or a higher one waits, fewer
of the service's slots are busy than its band's ceiling allows, and a replica has
a free slot. Otherwise it joins its band's FIFO queue for the service, bounded by
``band_queue_capacity`` and ``queue_factor`` x the service's slots (full: 429
``service_saturated`` naming the band). It waits until a slot is handed to it, its
band's ``band_queue_ttl``, ``max_queue_wait`` or the request deadline (then 503
``no_ready_replica``), re-checking authority and the service's view while it waits.

A freed slot is handed over in :meth:`Admission.release`, so nobody can take it
between the wake-up and the waiter running: to the head of a band *owed its
share* if one is (each waiting band earns ``band_min_share`` of a credit per slot
granted on the service, spends one per slot it gets; a full credit takes the next
slot, whatever waits above and beyond its ceiling), else to the head of the
highest band whose ceiling allows one more busy slot. docs/priority.md says why.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..routing.bands import BandTable
from .errors import NoReadyReplica, ServiceSaturated

if TYPE_CHECKING:
    from ..base.errors import FiccError
    from ..config import Config
    from ..routing.bands import Band
    from ..routing.live import LiveReplica, LiveService
    from .accounting import Accounting
    from .checks import RequestChecks
    from .request import Request
    from .scoring import Router

#: A band's credit is capped here, so a band that could not be served for a while
#: (every replica it may use busy with retries) gets no burst of slots later.
_CREDIT_CAP = 2.0
#: A full credit, allowing for float sums of shares (ten times 0.1 is 0.9999999999999999).
_FULL = 1.0 - 1e-9


@attrs.define(eq=False)
class _Waiter:
    request: Request
    tried: set[str]
    band: Band
    event: trio.Event = attrs.field(factory=trio.Event)
    #: Its slot was taken for it (by :meth:`Admission._grant`): it only has to return.
    granted: bool = False
    #: When it joined the queue, on the trio clock (the queue is FIFO per band).
    joined: float = attrs.field(factory=trio.current_time)


@attrs.define(eq=False)
class _Line:
    """The requests of one service waiting for a slot: a FIFO queue per band, and what
    each waiting band is owed of its minimum share."""

    queues: dict[str, deque[_Waiter]]
    credit: dict[str, float] = attrs.field(factory=dict)
    waiting: int = 0

    def ahead(self, bands: BandTable, band: Band) -> int:
        """Requests waiting that go before a new one of ``band`` (its own and higher)."""
        ahead = 0
        for other in bands.ordered:
            if other.priority < band.priority:
                break
            ahead += len(self.queues[other.name])
        return ahead


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
    :param accounting: the metrics (in-flight and queued gauges, the bands' series).
    :param router: chooses among the replicas (:class:`~ficc_core.gateway.scoring.Router`).
    :param load: the requests in flight per replica (its attempt ID), which admission
        counts and the router reads: the gateway hands the same mapping to both.
    :param rng: breaks ties between equally loaded replicas.
    :param config: the band settings (``bands``, ``band_default``, ``band_header``,
        ``band_queue_capacity``, ``band_queue_ttl``, ``band_min_share``).
    :param queue_factor: a band's queue holds at most this many times the service's slots.
    :param max_queue_wait: the longest any request waits for a slot, in seconds.
    :param recheck_interval: how often a waiting request re-checks its authority and
        the service's view (a replica that became ready), in seconds.
    """

    def __init__(
        self,
        checks: RequestChecks,
        accounting: Accounting,
        *,
        router: Router,
        load: dict[str, int],
        rng: random.Random,
        config: Config,
        queue_factor: int,
        max_queue_wait: float,
        recheck_interval: float,
    ) -> None:
        self.checks = checks
        self.accounting = accounting
        self.router = router
        self.rng = rng
        self.bands = BandTable(config.bands, config.band_default)
        self.band_header = config.band_header
        self.band_queue_capacity = config.band_queue_capacity
        self.band_queue_ttl = config.band_queue_ttl
        self.band_min_share = config.band_min_share
        self.queue_factor = queue_factor
        self.max_queue_wait = max_queue_wait
        self.recheck_interval = recheck_interval
        self._load = load
        self._lines: dict[str, _Line] = {}
        self._idle: dict[str, trio.Event] = {}
        #: Per replica key with nothing in flight: when its last request ended (or when
        #: :meth:`idle_for` first saw it), on the trio clock.
        self._last: dict[str, float] = {}

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

    def queued(self, service_id: str, band: str | None = None) -> int:
        """Requests of ``service_id`` (of ``band`` only, if given) waiting for a slot."""
        line = self._lines.get(service_id)
        if line is None:
            return 0
        return line.waiting if band is None else len(line.queues.get(band, ()))

    def waits(self, service_id: str, now: float) -> list[float]:
        """Seconds each request of ``service_id`` waiting for a slot has waited."""
        line = self._lines.get(service_id)
        if line is None:
            return []
        return [now - waiter.joined for queue in line.queues.values() for waiter in queue]

    def idle_for(self, replicas: Iterable[LiveReplica], now: float) -> dict[str, float]:
        """Per replica of ``replicas``, seconds since its last request here ended (0 while
        one is in flight; one never used counts from this first call that saw it)."""
        load, last, idle = self._load, self._last, {}
        for replica in replicas:
            key = replica.key
            idle[key] = 0.0 if load.get(key) else now - last.setdefault(key, now)
        return idle

    def forget_idle(self, routed: Collection[str]) -> None:
        """Forget when replicas no longer ``routed`` to were last used (they left)."""
        last = self._last
        for key in [key for key in last if key not in routed]:
            del last[key]

    def _busy(self, view: LiveService) -> int:
        """Slots of ``view``'s replicas held now (a retiring replica's are not its own)."""
        load, busy = self._load, 0
        for replica in view.replicas:
            busy += load.get(replica.key, 0)
        return busy

    def band_of(self, request: Request) -> Band:
        """The band ``request`` is served in: the band header's when it names a lower band
        than its credential is entitled to (see :meth:`BandTable.effective`)."""
        actor = request.actor
        entitled = self.bands.entitled(actor.band, actor.project_band)
        return self.bands.effective(entitled, request.headers.get(self.band_header))

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
        """Free ``request``'s slot (if it holds one) and hand it to the next waiter."""
        if not request.holds_slot or request.replica is None:
            return
        request.holds_slot = False
        key, service_id = request.replica.key, request.service_id
        left = self._load.get(key, 1) - 1
        if left > 0:
            self._load[key] = left
        else:
            self._load.pop(key, None)
            self._last[key] = trio.current_time()
            idle = self._idle.pop(key, None)
            if idle is not None:
                idle.set()
        self.accounting.series(service_id, key).inflight.dec()
        if service_id in self._lines:
            self._grant(service_id)

    async def slot(self, request: Request, tried: set[str], last: FiccError | None) -> None:
        """Take a slot on a replica not in ``tried``, waiting in the band's queue if need be."""
        view = self.checks.current(request)
        band = request.band
        if band is None:
            band = request.band = self.band_of(request)
        service_id = request.service_id
        if not [r for r in view.replicas if r.key not in tried]:
            why = "every replica failed before answering" if tried else "none is ready"
            self.accounting.band_refused(service_id, band.name, "no_ready_replica")
            raise no_replica(view, why, last)
        capacity = view.concurrency * len(view.replicas)
        line = self._lines.get(service_id)
        ahead = 0 if line is None else line.ahead(self.bands, band)
        if not ahead and self._busy(view) < band.slots(capacity):
            replica = self.pick(view, tried, request)
            if replica is not None:
                self.take(request, replica)
                if line is not None:
                    self._earn(line, band)
                return
        if line is None:
            line = self._lines[service_id] = _Line({b.name: deque() for b in self.bands.ordered})
        queue = line.queues[band.name]
        bound = min(self.band_queue_capacity, self.queue_factor * capacity)
        if len(queue) >= bound and not request.woken:
            if not line.waiting:
                self._lines.pop(service_id, None)
            self.accounting.band_refused(service_id, band.name, "service_saturated")
            raise ServiceSaturated(
                f"service {view.id!r} is saturated: the queue of band {band.name!r} is full "
                f"({len(queue)} waiting, at most {bound}; {line.waiting} in all for its "
                f"{capacity} slots)",
                details={
                    "capacity": capacity,
                    "queued": line.waiting,
                    "band": band.name,
                    "band_queued": len(queue),
                },
            )
        await self._wait(request, line, _Waiter(request, tried, band), ahead, last)

    async def _wait(
        self, request: Request, line: _Line, waiter: _Waiter, ahead: int, last: FiccError | None
    ) -> None:
        band, service_id = waiter.band, request.service_id
        line.queues[band.name].append(waiter)
        line.waiting += 1
        series = self.accounting.band(service_id, band.name)
        series.position.observe(ahead + 1)
        series.waiting.inc()
        gauge = self.accounting.waiting(service_id)
        gauge.inc()
        joined = trio.current_time()
        ttl = min(self.max_queue_wait, self.band_queue_ttl)
        limit = min(request.deadline, joined + ttl)
        try:
            while True:
                with trio.move_on_at(min(limit, trio.current_time() + self.recheck_interval)):
                    await waiter.event.wait()
                if not waiter.granted:
                    now = trio.current_time()
                    if now >= limit:
                        self.accounting.band_refused(service_id, band.name, "no_ready_replica")
                        refusal = no_replica(
                            request.view,
                            f"no slot freed within {now - request.started:.1f} s (band "
                            f"{band.name!r} waits at most {ttl:g} s)",
                            last,
                        )
                        refusal.details["band"] = band.name
                        raise refusal
                    view = self.checks.current(request)
                    if not [r for r in view.replicas if r.key not in waiter.tried]:
                        raise no_replica(view, "none is ready", last)
                problem = self.checks.authority(request.actor)
                if problem is not None:
                    # A slot handed over is freed by the caller (the request holds it).
                    raise problem
                if not waiter.granted:
                    # A replica may have become ready, or joined a new generation.
                    self._grant(service_id)
                if waiter.granted:
                    return
        finally:
            if not waiter.granted:
                self._leave(service_id, line, waiter)

    def _leave(self, service_id: str, line: _Line, waiter: _Waiter) -> None:
        """Take ``waiter`` out of its band's queue (given a slot, or giving up)."""
        band = waiter.band
        line.queues[band.name].remove(waiter)
        line.waiting -= 1
        if not line.waiting:
            self._lines.pop(service_id, None)
        self.accounting.band(service_id, band.name).waiting.dec()
        self.accounting.waiting(service_id).dec()

    def _earn(self, line: _Line, granted: Band) -> None:
        """A slot was granted to ``granted``: it and every band waiting below the top earn
        the share (the top needs none: it goes first), ``granted`` spends a credit, and a
        band with nothing waiting loses what it had (a share is owed only while waiting)."""
        share = self.band_min_share
        if not share:
            return
        credit = line.credit
        for band in self.bands.ordered[1:]:
            name = band.name
            if name == granted.name:
                credit[name] = max(0.0, min(_CREDIT_CAP, credit.get(name, 0.0) + share) - 1.0)
            elif line.queues[name]:
                credit[name] = min(_CREDIT_CAP, credit.get(name, 0.0) + share)
            else:
                credit.pop(name, None)

    def _grant(self, service_id: str) -> None:
        """Hand free slots of ``service_id`` to its waiters (see the module docs)."""
        line = self._lines.get(service_id)
        view = self.checks.live.get(service_id)
        if line is None or view is None or view.admission == "stopped":
            return  # the waiters find out at their next re-check
        capacity = view.concurrency * len(view.replicas)
        while line.waiting:
            chosen = self._next(line, view, capacity)
            if chosen is None:
                return
            waiter, replica, via = chosen
            self._leave(service_id, line, waiter)
            waiter.request.view = view
            self.take(waiter.request, replica)
            self._earn(line, waiter.band)
            waiter.granted = True
            waiter.event.set()
            series = self.accounting.band(service_id, waiter.band.name)
            (series.share if via == "share" else series.priority).inc()
            if service_id not in self._lines:
                return

    def _next(
        self, line: _Line, view: LiveService, capacity: int
    ) -> tuple[_Waiter, LiveReplica, str] | None:
        """The waiter the next free slot goes to, its replica, and why (share or priority)."""
        owed = [(credit, name) for name, credit in line.credit.items() if credit >= _FULL]
        for _, name in sorted(owed, reverse=True):
            queue = line.queues[name]
            if queue:
                head = queue[0]
                replica = self.pick(view, head.tried, head.request)
                if replica is not None:
                    return head, replica, "share"
        busy = self._busy(view)
        for band in self.bands.ordered:
            queue = line.queues[band.name]
            if not queue or busy >= band.slots(capacity):
                continue
            head = queue[0]
            replica = self.pick(view, head.tried, head.request)
            if replica is not None:
                return head, replica, "priority"
        return None
