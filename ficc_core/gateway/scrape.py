"""Engine load, scraped: every replica's ``GET /metrics`` read through its node's endpoint action.

A background task (:meth:`Scraper.run`, started by :meth:`Gateway.run`) reads, every
``scrape_interval``, the Prometheus text of each ready replica the live table routes
to, with ``scrape_timeout`` per read and at most :data:`PARALLEL` reads at once; no
request waits for it. What an engine reports is kept per replica as an
:class:`EngineLoad`, beside the gateway's own in-flight count at that moment, so the
router can add what it sent since (:meth:`Scraper.estimate`).

The figures read (each summed over its label sets; KV use is the largest):

=========  =============================================  ======================================
           llama.cpp (``llama-server --metrics``)         vLLM
=========  =============================================  ======================================
running    ``llamacpp:requests_processing``               ``vllm:num_requests_running``
waiting    ``llamacpp:requests_deferred``                 ``vllm:num_requests_waiting``
KV use     ``llamacpp:kv_cache_usage_ratio`` (older       ``vllm:kv_cache_usage_perc`` (0.10 on),
           releases only)                                 ``vllm:gpu_cache_usage_perc`` (before)
=========  =============================================  ======================================

An engine whose job does not admit ``/metrics`` (Ollama) is never scraped again
and is routed by the gateway's in-flight count alone; so is one whose text holds
none of these names. A replica whose last good read is older than
``scrape_stale_after`` is *stale* (see :mod:`.scoring`).
"""

from __future__ import annotations

import itertools
import logging
import math
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..base.errors import FiccError
from ..executor.types import BodyChunk, EndOfStream, ResponseHead, StreamFailed

if TYPE_CHECKING:
    from ..contributors import NodeRegistry
    from ..routing.live import LiveReplica, LiveTable
    from .metrics import GatewayMetrics

log = logging.getLogger("ficc.gateway.scrape")

#: Reads in flight at once: a round over many replicas never opens a stream per replica.
PARALLEL = 16
#: The most of a ``/metrics`` body read; llama.cpp's is ~3 KiB, vLLM's ~50 KiB.
MAX_BODY = 1 << 20
HEADERS = [("accept", "text/plain")]

_RUNNING = ("llamacpp:requests_processing", "vllm:num_requests_running")
_WAITING = ("llamacpp:requests_deferred", "vllm:num_requests_waiting")
_KV = ("llamacpp:kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_SUMMED = frozenset(_RUNNING + _WAITING)
_WANTED = _SUMMED | frozenset(_KV)


@attrs.frozen
class EngineLoad:
    """What one read of an engine's ``/metrics`` said.

    :ivar running: requests the engine is generating for.
    :ivar waiting: requests it holds in its own queue.
    :ivar kv: KV cache use, 0 to 1, or None when the engine does not say.
    """

    running: float
    waiting: float
    kv: float | None = None


def parse_load(text: str) -> EngineLoad | None:
    """The load figures of a Prometheus text exposition, or None when it has none of them.

    Tolerant: comments, blank lines, labels (quoted values may hold spaces and braces),
    timestamps, ``+Inf`` and ``NaN`` (a NaN sample is skipped); a malformed line is
    skipped, never fatal. Only the names in the module's table are looked at.
    """
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if space < 0:
            continue
        if 0 <= brace < space:
            name = line[:brace]
            if name not in _WANTED:
                continue
            rest = _after_labels(line, brace)
            if rest is None:
                continue
        else:
            name = line[:space]
            if name not in _WANTED:
                continue
            rest = line[space:]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        if name in _SUMMED:
            found[name] = found.get(name, 0.0) + value
        else:
            found[name] = max(found.get(name, value), value)
    if not any(name in found for name in _RUNNING + _WAITING):
        return None
    kv = next((found[name] for name in _KV if name in found), None)
    return EngineLoad(
        running=next((found[name] for name in _RUNNING if name in found), 0.0),
        waiting=next((found[name] for name in _WAITING if name in found), 0.0),
        kv=None if kv is None else min(max(kv, 0.0), 1.0),
    )


def _after_labels(line: str, brace: int) -> str | None:
    """What follows the label set that opens at ``brace`` (quotes and escapes honoured)."""
    quoted = escaped = False
    for at in range(brace + 1, len(line)):
        char = line[at]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return line[at + 1 :]
    return None


@attrs.define(eq=False)
class ReplicaLoad:
    """What the scraper knows of one replica (an attempt).

    :ivar first_seen: when the scraper first saw it routed to (trio clock).
    :ivar load: the last good read, or None.
    :ivar at: when that read completed.
    :ivar local_at: the gateway's in-flight count on it at that moment.
    :ivar unscraped: its engine serves no load figures (no ``/metrics`` admitted, or none
        of the names read): routed by the gateway's in-flight count alone.
    """

    service_id: str
    first_seen: float
    load: EngineLoad | None = None
    at: float = -math.inf
    local_at: int = 0
    unscraped: bool = False

    def fresh_since(self) -> float:
        """Since when its figures can be trusted: its last good read, or when it joined."""
        return max(self.at, self.first_seen)


class Scraper:
    """Reads every routed replica's engine load in the background (see the module docs).

    :param live: the live routing table (which replicas to read).
    :param contributors: the node registry (``endpoint(node_id)``).
    :param local: the gateway's in-flight count of a replica key.
    :param metrics: the controller's collectors (scrape gauges and failures).
    :param interval: seconds between rounds.
    :param timeout: the longest one read may take, seconds.
    :param clock: the clock of :attr:`ReplicaLoad.at` (the trio clock).
    """

    def __init__(
        self,
        live: LiveTable,
        contributors: NodeRegistry,
        local: Callable[[str], int],
        metrics: GatewayMetrics,
        *,
        interval: float,
        timeout: float,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.live = live
        self.contributors = contributors
        self.local = local
        self.metrics = metrics
        self.interval = interval
        self.timeout = timeout
        self.clock = clock
        #: Per replica key (attempt ID): what is known of its engine's load.
        self.replicas: dict[str, ReplicaLoad] = {}
        self._limiter = trio.CapacityLimiter(PARALLEL)
        self._prefix = f"m{uuid.uuid4().hex[:8]}-"
        self._numbers = itertools.count(1)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Scrape every ``interval`` until cancelled."""
        task_status.started()
        while True:
            started = self.clock()
            await self.scrape_all()
            await trio.sleep_until(started + self.interval)

    def routed(self) -> dict[str, tuple[str, LiveReplica]]:
        """The replicas new requests may go to now: key -> (service ID, replica)."""
        return {
            replica.key: (view.id, replica)
            for view in self.live.services()
            for replica in view.replicas
        }

    async def scrape_all(self) -> None:
        """One round: read every routed replica (bounded in parallel), forget those gone."""
        routed = self.routed()
        now = self.clock()
        for key in [key for key in self.replicas if key not in routed]:
            self.forget(key)
        async with trio.open_nursery() as nursery:
            for key, (service_id, replica) in routed.items():
                known = self.replicas.get(key)
                if known is None:
                    known = self.replicas[key] = ReplicaLoad(service_id, first_seen=now)
                if not known.unscraped:
                    nursery.start_soon(self._scrape, known, replica)
        now = self.clock()
        for key, known in self.replicas.items():
            if not known.unscraped:
                age = now - known.fresh_since()
                self.metrics.routing_scrape_age.labels(known.service_id, key).set(age)

    def forget(self, key: str) -> None:
        """Drop a replica that is no longer routed to, and its metric series."""
        known = self.replicas.pop(key, None)
        if known is None:
            return
        for gauge in (
            self.metrics.routing_scraped_running,
            self.metrics.routing_scraped_waiting,
            self.metrics.routing_scraped_kv,
            self.metrics.routing_scrape_age,
            self.metrics.routing_scrape_failures,
        ):
            try:
                gauge.remove(known.service_id, key)
            except KeyError:
                pass

    async def _scrape(self, known: ReplicaLoad, replica: LiveReplica) -> None:
        async with self._limiter:
            try:
                text = await self.read(replica)
            except FiccError as exc:
                if exc.code == "path_not_admitted":
                    known.unscraped = True
                    log.info("replica %s admits no /metrics: routed by in-flight", replica.key)
                    return
                self._failed(known, replica, exc.code)
                return
            except Exception:
                # A background read must never end the gateway's (and controller's) tasks.
                log.exception("scraping replica %s failed unexpectedly", replica.key)
                self._failed(known, replica, "internal")
                return
        load = parse_load(text)
        if load is None:
            known.unscraped = True
            log.info("replica %s reports no load figures: routed by in-flight", replica.key)
            return
        known.load, known.at, known.local_at = load, self.clock(), self.local(replica.key)
        labels = (known.service_id, replica.key)
        self.metrics.routing_scraped_running.labels(*labels).set(load.running)
        self.metrics.routing_scraped_waiting.labels(*labels).set(load.waiting)
        if load.kv is not None:
            self.metrics.routing_scraped_kv.labels(*labels).set(load.kv)

    def _failed(self, known: ReplicaLoad, replica: LiveReplica, code: str) -> None:
        log.debug("scraping replica %s failed: %s", replica.key, code)
        self.metrics.routing_scrape_failures.labels(known.service_id, replica.key).inc()
        # Its liveness is probed now rather than at the next scheduled probe: a read
        # that failed is the gateway's first sign of a hung engine.
        self.live.suspect(replica.key)

    async def read(self, replica: LiveReplica) -> str:
        """The engine's ``/metrics`` text; raises a :class:`FiccError` when it cannot be had."""
        endpoint = self.contributors.endpoint(replica.node_id)
        stream_id = f"{self._prefix}{next(self._numbers)}"
        opened = ended = False
        status = 0
        body = bytearray()
        try:
            with trio.move_on_after(self.timeout):
                await endpoint.open(replica.fence, stream_id, "GET", "/metrics", HEADERS, b"")
                opened = True
                while True:
                    event: Any = await endpoint.read(replica.fence, stream_id)
                    if isinstance(event, ResponseHead):
                        status = event.status
                    elif isinstance(event, BodyChunk):
                        body += event.data
                        if len(body) > MAX_BODY:
                            raise FiccError(
                                f"the engine's /metrics is over {MAX_BODY} bytes",
                                code="metrics_too_large",
                            )
                    elif isinstance(event, EndOfStream):
                        ended = True
                        break
                    elif isinstance(event, StreamFailed):
                        ended = True
                        raise FiccError(event.message, code=event.code or "stream_failed")
            if not ended:
                raise FiccError(
                    f"the engine's /metrics did not answer within {self.timeout:g} s",
                    code="scrape_timeout",
                )
        finally:
            if opened and not ended:
                with trio.CancelScope(shield=True), trio.move_on_after(self.timeout):
                    try:
                        await endpoint.cancel(replica.fence, stream_id)
                    except FiccError:
                        pass
        if status != 200:
            raise FiccError(f"the engine's /metrics answered {status}", code="scrape_status")
        return body.decode("utf-8", "replace")
