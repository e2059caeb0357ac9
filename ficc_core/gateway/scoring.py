"""Scoring: which replica of a service a request goes to.

Every ready replica of the service's current generation that the request has not
tried and that has a free slot (fewer than ``concurrency`` of the gateway's requests
in flight) is a candidate. Each gets a *score*, lowest wins, ties broken at random::

    in flight  = scraped running + scraped waiting
                 + (gateway's in flight now - gateway's in flight at the scrape)
    score      = (in flight + scoring_session_load_factor * sessions bound to it)
                     / scoring_target_inflight
                 + scraped waiting / scoring_target_waiting

and a *tier*: 0, or 1 for a replica to avoid while a tier-0 one exists: its KV cache
use is at or over ``scoring_kv_ceiling``, or it is *stale* (no good scrape within
``scrape_stale_after``: its figures are not trusted, only the gateway's own count
is, and it is treated as at its KV ceiling). A replica whose engine gives no load
figures (no ``/metrics``: Ollama), or one not scraped yet, is scored by the
gateway's in-flight count alone, in tier 0.

Affinity (:mod:`.affinity`) comes first: the replica of the request's session,
else the one holding the longest prefix of its prompt, wins unless it is in a
worse tier than the best candidate or the imbalance guard trips against the least
loaded candidate (both ``affinity_balance_abs`` and ``affinity_balance_rel``).
Everything here is in memory and O(replicas) per request.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import trio

from .affinity import Affinity, imbalanced
from .scrape import Scraper

if TYPE_CHECKING:
    from ..config import Config
    from ..contributors import NodeRegistry
    from ..routing.live import LiveReplica, LiveService, LiveTable
    from .metrics import GatewayMetrics
    from .request import Request


def router_from_config(
    config: Config,
    *,
    live: LiveTable,
    contributors: NodeRegistry,
    local: Callable[[str], int],
    metrics: GatewayMetrics,
    rng: random.Random,
) -> Router:
    """The gateway's router, its scraper and affinity, with the controller's settings."""
    scraper = Scraper(
        live,
        contributors,
        local,
        metrics,
        interval=config.scrape_interval,
        timeout=config.scrape_timeout,
    )
    affinity = Affinity(
        session_header=config.session_header,
        session_ttl=config.session_ttl,
        session_max_entries=config.session_max_entries,
        prefix_enabled=config.prefix_enabled,
        prefix_max_entries=config.prefix_max_entries,
        prefix_min_match=config.prefix_min_match,
        prefix_ttl=config.prefix_ttl,
        prefix_match_ratio=config.prefix_match_ratio,
    )
    return Router(
        local=local,
        scraper=scraper,
        affinity=affinity,
        metrics=metrics,
        rng=rng,
        target_inflight=config.scoring_target_inflight,
        target_waiting=config.scoring_target_waiting,
        kv_ceiling=config.scoring_kv_ceiling,
        stale_after=config.scrape_stale_after,
        session_load_factor=config.scoring_session_load_factor,
        balance_abs=config.affinity_balance_abs,
        balance_rel=config.affinity_balance_rel,
    )


class Router:
    """Chooses a request's replica (see the module docs).

    :param local: the gateway's in-flight count of a replica key (admission's load).
    :param scraper: the engines' scraped load (None: routed by in-flight alone).
    :param affinity: the session table and prefix index.
    :param rng: breaks ties between equal scores.
    :param clock: the clock staleness is judged by (the scraper's).
    """

    def __init__(
        self,
        *,
        local: Callable[[str], int],
        scraper: Scraper | None,
        affinity: Affinity,
        metrics: GatewayMetrics,
        rng: random.Random,
        target_inflight: float,
        target_waiting: float,
        kv_ceiling: float,
        stale_after: float,
        session_load_factor: float,
        balance_abs: float,
        balance_rel: float,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.local = local
        self.scraper = scraper
        self.affinity = affinity
        self.metrics = metrics
        self.rng = rng
        self.target_inflight = target_inflight
        self.target_waiting = target_waiting
        self.kv_ceiling = kv_ceiling
        self.stale_after = stale_after
        self.session_load_factor = session_load_factor
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.clock = clock
        self._decisions: dict[tuple[str, str], Any] = {}
        self._routed: set[str] = set()
        #: Called with the routed replica keys at every sweep, to forget the others.
        self.swept: list[Callable[[Collection[str]], None]] = []

    def rate(self, key: str, local: int, now: float) -> tuple[int, float, float]:
        """(tier, score, estimated requests in flight at its engine) of replica ``key``."""
        inflight, waiting, tier = float(local), 0.0, 0
        known = None if self.scraper is None else self.scraper.replicas.get(key)
        if known is not None and not known.unscraped:
            if now - known.fresh_since() > self.stale_after:
                tier = 1
            elif known.load is not None:
                load = known.load
                waiting = load.waiting
                inflight = max(0.0, load.running + waiting + local - known.local_at)
                if load.kv is not None and load.kv >= self.kv_ceiling:
                    tier = 1
        sessions = self.affinity.session_counts.get(key, 0)
        score = (inflight + self.session_load_factor * sessions) / self.target_inflight
        return tier, score + waiting / self.target_waiting, inflight

    def pick(self, view: LiveService, tried: set[str], request: Request) -> LiveReplica | None:
        """The replica ``request`` goes to, or None when every candidate's slots are taken."""
        now = self.clock()
        rated: dict[str, tuple[int, float, float, LiveReplica]] = {}
        best: LiveReplica | None = None
        best_rank = (2, 0.0)
        ties = 0
        for replica in view.replicas:
            key = replica.key
            if key in tried:
                continue
            local = self.local(key)
            if local >= view.concurrency:
                continue
            tier, score, inflight = self.rate(key, local, now)
            rated[key] = (tier, score, inflight, replica)
            rank = (tier, score)
            if best is None or rank < best_rank:
                best, best_rank, ties = replica, rank, 1
            elif rank == best_rank:
                ties += 1
                if self.rng.random() * ties < 1:
                    best = replica
        if best is None:
            return None
        reason = "score"
        affinity = self.affinity
        session = affinity.session_of(request)
        preference = affinity.preferred(request, rated, session, now)
        if preference is not None:
            # The guard compares with the least loaded replica affinity would yield to: one
            # of the best tier (a stale replica's own count is no reason to leave).
            least = min(item[2] for item in rated.values() if item[0] == best_rank[0])
            tier, _, inflight, chosen = min(
                (rated[key] for key in preference.replicas), key=lambda item: item[:2]
            )
            if tier > best_rank[0] or imbalanced(
                inflight, least, absolute=self.balance_abs, relative=self.balance_rel
            ):
                reason = "balanced"
            else:
                best, reason = chosen, preference.reason
        taken = preference if reason != "balanced" else None
        affinity.remember(request, best.key, taken, session, now)
        self._decided(request.service_id, reason)
        return best

    def _decided(self, service_id: str, reason: str) -> None:
        counter = self._decisions.get((service_id, reason))
        if counter is None:
            counter = self._decisions[(service_id, reason)] = self.metrics.routing_decisions.labels(
                service_id, reason
            )
        counter.inc()

    def sweep(self, routed: set[str]) -> None:
        """Forget what names a replica no longer ``routed`` to (since the last sweep) and
        what outlived its TTL."""
        gone = self._routed - routed
        self._routed = routed
        self.affinity.prune(gone)
        for forget in self.swept:
            forget(routed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Scrape the engines and sweep every scrape interval until cancelled (off the
        request path)."""
        assert self.scraper is not None
        async with trio.open_nursery() as nursery:
            await nursery.start(self.scraper.run)
            task_status.started()
            await self._sweeping()

    async def _sweeping(self) -> None:
        assert self.scraper is not None
        while True:
            await trio.sleep(self.scraper.interval)
            self.sweep(set(self.scraper.routed()))
