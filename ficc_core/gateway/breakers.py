"""Breakers: a replica that keeps failing leaves the candidate pool for a cooldown.

Each replica (its attempt ID) counts its consecutive failures before a response
head: the open refused, its node unavailable, the stream failing before its head,
an engine 5xx, a timeout before anything reached the client. A client's own 4xx
is an answer, not a failure. ``threshold`` failures in a row open the breaker for
``cooldown`` seconds (a threshold of 1 makes it a pure cooldown); once the
cooldown ends one request may try the replica (half-open) and its outcome closes
the breaker or opens it again. Any answer closes it.

Breakers stay out of admission: :meth:`Breakers.excluded` is the set of replicas
a request must not be given, its own tried ones and the open ones. When that would
leave none of the view's replicas, the open ones whose cooldown ends soonest stay
eligible: every replica failing at once is more often the controller's own view
lagging (a network blip, a restart) than the whole pool being dead, and a request
that tries one is cheaper than a refusal nobody could have avoided.

Only replicas with a failure on record are tracked (an answer resets the count),
and a record is dropped once its replica leaves its service's view (checked
whenever a failure or a recovery is recorded), so memory stays bounded by the
replicas that failed and still serve. Nothing here reads the store or does I/O:
:meth:`excluded` is one dict lookup per replica, and none while no replica ever
failed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from ..routing.live import LiveService, LiveTable
    from .metrics import GatewayMetrics

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "Breakers"]

#: The ``ficc_gateway_breaker_state`` values.
CLOSED, OPEN, HALF_OPEN = 0, 1, 2


@attrs.define(eq=False)
class _Breaker:
    service_id: str
    failures: int = 0
    #: The breaker is open until then (trio clock); ``-inf`` when it never opened.
    open_until: float = -math.inf
    #: Half-open and one request is trying the replica: the others wait for its outcome.
    probing: bool = False


class Breakers:
    """Per-replica failure counts and open breakers (see the module docs).

    :param live: the live table (a replica that left its view is forgotten).
    :param metrics: the controller's collectors (breaker state and opens).
    :param threshold: consecutive failures that open a breaker; 0 turns breakers off.
    :param cooldown: seconds an open breaker keeps its replica out of the pool.
    """

    def __init__(
        self, live: LiveTable, metrics: GatewayMetrics, *, threshold: int, cooldown: float
    ) -> None:
        self.live = live
        self.metrics = metrics
        self.threshold = threshold
        self.cooldown = cooldown
        self._breakers: dict[str, _Breaker] = {}

    def state(self, key: str) -> int:
        """:data:`CLOSED`, :data:`OPEN` or :data:`HALF_OPEN` for the replica ``key``."""
        breaker = self._breakers.get(key)
        if breaker is None or breaker.failures < max(self.threshold, 1):
            return CLOSED
        return OPEN if trio.current_time() < breaker.open_until else HALF_OPEN

    def excluded(self, view: LiveService, tried: set[str]) -> set[str]:
        """The replicas of ``view`` a request must not be given: ``tried`` and the open ones.

        Never all of them because of breakers alone: when every replica not tried is
        open (or half-open with its probe under way), the ones whose cooldown ends
        soonest are left out of the set.
        """
        if not self._breakers:
            return tried
        now = trio.current_time()
        blocked: dict[str, float] = {}
        candidates = 0
        for replica in view.replicas:
            key = replica.key
            if key in tried:
                continue
            candidates += 1
            breaker = self._breakers.get(key)
            if breaker is not None and (breaker.probing or now < breaker.open_until):
                blocked[key] = breaker.open_until
        if not blocked:
            return tried
        if len(blocked) == candidates:
            soonest = min(blocked.values())
            blocked = {key: until for key, until in blocked.items() if until != soonest}
        return tried | blocked.keys()

    def attempt(self, key: str) -> None:
        """A request was given the replica ``key``: a half-open breaker's probe starts."""
        breaker = self._breakers.get(key)
        if breaker is not None and breaker.failures >= self.threshold > 0:
            breaker.probing = True

    def abandoned(self, key: str) -> None:
        """The request on ``key`` ended before an outcome (cancelled): no verdict."""
        breaker = self._breakers.get(key)
        if breaker is not None:
            breaker.probing = False

    def succeeded(self, key: str) -> None:
        """The replica ``key`` answered: its failures are forgiven, its breaker closes."""
        breaker = self._breakers.get(key)
        if breaker is not None and (breaker.failures or breaker.probing):
            breaker.failures, breaker.probing, breaker.open_until = 0, False, -math.inf
            self._forget_departed()

    def failed(self, service_id: str, key: str) -> None:
        """The replica ``key`` of ``service_id`` failed before answering."""
        if self.threshold <= 0:
            return
        self._forget_departed()
        breaker = self._breakers.get(key)
        if breaker is None:
            breaker = self._breakers[key] = _Breaker(service_id)
            # Read when the metrics are rendered: half-open needs no timer.
            gauge = self.metrics.gateway_breaker_state.labels(service_id, key)
            gauge.set_function(lambda: self.state(key))
        breaker.failures += 1
        breaker.probing = False
        if breaker.failures >= self.threshold:
            breaker.open_until = trio.current_time() + self.cooldown
            self.metrics.gateway_breaker_opens.labels(service_id, key).inc()

    def _forget_departed(self) -> None:
        for key, breaker in list(self._breakers.items()):
            view = self.live.get(breaker.service_id)
            if view is None or not view.serves(key):
                del self._breakers[key]
                self.metrics.gateway_breaker_state.remove(breaker.service_id, key)
