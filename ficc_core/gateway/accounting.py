"""Accounting: what each request used (a :class:`~ficc_core.usage.records.UsageRecord`)
and the gateway's metrics."""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..quotas import Unlimited
from ..usage.records import UsageRecord

if TYPE_CHECKING:
    from ..auth import Principal
    from ..quotas import QuotaGate
    from .metrics import GatewayMetrics
    from .request import Request

log = logging.getLogger("ficc.gateway")
usage_log = logging.getLogger("ficc.gateway.usage")

_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
#: Outcomes that are not errors.
_FINE = ("ok", "cancelled")


@attrs.define
class Series:
    """The labelled metric children of one (service, replica), looked up once (those
    of tokens and output rate at their first use: a series appears once it counts)."""

    inflight: Any
    requests: Any
    ttft: Any
    duration: Any
    prompt: Any = None
    completion: Any = None
    output_rate: Any = None


@attrs.frozen
class BandSeries:
    """The labelled metric children of one (service, band), looked up once."""

    waiting: Any
    queue_wait: Any
    position: Any
    priority: Any
    share: Any


def usage_of(tail: bytes) -> tuple[int | None, int | None]:
    """Prompt and completion tokens from the last ``"usage"`` object in ``tail``."""
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None, None
    segment = tail[at : at + 1024]
    prompt, completion = _PROMPT.search(segment), _COMPLETION.search(segment)
    return (
        int(prompt.group(1)) if prompt else None,
        int(completion.group(1)) if completion else None,
    )


#: Seconds a departed replica's series stay exported (a few scrape intervals and more).
SERIES_KEPT = 600.0


class Accounting:
    """Usage records and the ``ficc_gateway_*`` metrics.

    :param metrics: the controller's Prometheus collectors.
    :param usage_records: how many :class:`UsageRecord` are kept in :attr:`usage`.
    :param usage_sinks: called with each record (e.g. to persist it); must not block.
    :param quotas: settles each request's reservation and prices it (default: free).
    """

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        usage_records: int = 10_000,
        usage_sinks: Iterable[Callable[[UsageRecord], None]] = (),
        quotas: QuotaGate | None = None,
    ) -> None:
        self.metrics = metrics
        self.quotas: QuotaGate = Unlimited() if quotas is None else quotas
        #: The latest requests' usage, oldest first.
        self.usage: deque[UsageRecord] = deque(maxlen=usage_records)
        #: Called with each :class:`UsageRecord`; must not block.
        self.usage_sinks: list[Callable[[UsageRecord], None]] = list(usage_sinks)
        # Labelled metric series per (service, replica), and per (service, band), made once.
        self._series: dict[tuple[str, str], Series] = {}
        self._bands: dict[tuple[str, str], BandSeries] = {}
        self._queue_waits: dict[str, Any] = {}
        #: Replicas no longer routed to, since when (trio clock): their series go after
        #: :data:`SERIES_KEPT` (so scrapes see their last counts), keeping the series
        #: count bounded by the replicas that exist however often attempts are replaced.
        self._departed: dict[tuple[str, str], float] = {}

    def forget_departed(self, routed: Collection[str]) -> None:
        """Drop the per-replica series of replicas gone for :data:`SERIES_KEPT` seconds
        (the router's sweep calls this with the replicas routed to now)."""
        now = trio.current_time()
        for pair in list(self._series):
            if pair[1] in routed:
                self._departed.pop(pair, None)
            elif now - self._departed.setdefault(pair, now) >= SERIES_KEPT:
                del self._series[pair]
                del self._departed[pair]
                self.metrics.remove_replica(*pair)

    def series(self, service_id: str, key: str) -> Series:
        """The metric series of replica ``key`` of ``service_id``."""
        series = self._series.get((service_id, key))
        if series is None:
            metrics = self.metrics
            series = self._series[(service_id, key)] = Series(
                inflight=metrics.gateway_inflight.labels(service_id, key),
                requests=metrics.gateway_requests.labels(service_id, key),
                ttft=metrics.gateway_ttft.labels(service_id, key),
                duration=metrics.gateway_duration.labels(service_id, key),
            )
        return series

    def band(self, service_id: str, band: str) -> BandSeries:
        """The metric series of ``band`` in ``service_id`` (queue and admission)."""
        series = self._bands.get((service_id, band))
        if series is None:
            metrics = self.metrics
            granted = metrics.gateway_band_granted
            series = self._bands[(service_id, band)] = BandSeries(
                waiting=metrics.gateway_band_waiting.labels(service_id, band),
                queue_wait=metrics.gateway_band_queue_wait.labels(service_id, band),
                position=metrics.gateway_band_queue_position.labels(service_id, band),
                priority=granted.labels(service_id, band, "priority"),
                share=granted.labels(service_id, band, "share"),
            )
        return series

    def band_refused(self, service_id: str, band: str, code: str) -> None:
        """Count a request of ``band`` refused while it asked for a slot."""
        self.metrics.gateway_band_refusals.labels(service_id, band, code).inc()

    def refused(
        self,
        service_id: str,
        code: str,
        actor: Principal | None = None,
        path: str = "",
        status: int = 0,
        model: str = "",
        generation: int = 0,
    ) -> None:
        """Count a refusal made before a replica was chosen (``service_id`` may be empty);
        with the ``actor`` known, it is a :class:`UsageRecord` too (replica ``""``, the
        refusal's ``status``, outcome ``code``, and the ``generation`` that would have
        served it: the service's current one, 0 when no service was found)."""
        self.metrics.gateway_errors.labels(service_id, "", code).inc()
        if actor is not None:
            self._record(actor, service_id, generation, path, status, code, model=model)

    def retried(self, service_id: str, key: str, code: str) -> None:
        """Count a request moved off replica ``key``, which failed before answering."""
        self.metrics.gateway_retries.labels(service_id, key).inc()
        self.metrics.gateway_errors.labels(service_id, key, code).inc()

    def timed_out(self, request: Request, bound: str) -> None:
        """Count an engine wait of ``request`` that ran past ``bound`` (a ``timeout_*``)."""
        key = "" if request.replica is None else request.replica.key
        self.metrics.gateway_timeouts.labels(request.service_id, key, bound).inc()

    def waiting(self, service_id: str) -> Any:
        """The gauge of requests of ``service_id`` waiting for a slot."""
        return self.metrics.gateway_queued.labels(service_id)

    def waited(self, request: Request) -> None:
        """Observe the time ``request`` waited for its first slot (per band too)."""
        service_id, wait = request.service_id, request.queue_wait
        child = self._queue_waits.get(service_id)
        if child is None:
            child = self._queue_waits[service_id] = self.metrics.gateway_queue_wait.labels(
                service_id
            )
        child.observe(wait)
        if request.band is not None:
            self.band(service_id, request.band.name).queue_wait.observe(wait)

    def settle(self, request: Request, outcome: str) -> None:
        """Account an ended request: its metrics and its :class:`UsageRecord`."""
        replica = request.replica
        if replica is None:
            cost = self.quotas.settle(request, outcome, None, None)
            view = request.view
            if outcome not in _FINE:
                self.metrics.gateway_errors.labels(request.service_id, "", outcome).inc()
            self._record(
                request.actor,
                request.service_id,
                view.generation,
                request.path,
                request.status,
                outcome,
                queue_wait=request.queue_wait,
                duration=trio.current_time() - request.started,
                model=view.model_id,
                cost=cost,
            )
            return
        key, service = replica.key, request.service_id
        if outcome not in _FINE:
            self.metrics.gateway_errors.labels(service, key, outcome).inc()
        # What the relay relayed of the engine's stream: its first byte's time, its usage.
        stream = request.stream
        first_byte = None if stream is None else stream.first_byte
        ttfb = None if first_byte is None else first_byte - request.started
        series = self.series(service, key)
        if ttfb is not None:
            series.ttft.observe(ttfb)
        duration = trio.current_time() - request.started
        series.duration.observe(duration)
        prompt, completion = (
            (None, None) if stream is None else usage_of(stream.prev_chunk + stream.last_chunk)
        )
        request.tokens = (prompt, completion)
        metrics = self.metrics
        if prompt:
            if series.prompt is None:
                series.prompt = metrics.gateway_tokens.labels(service, key, "prompt")
            series.prompt.inc(prompt)
        if completion:
            if series.completion is None:
                series.completion = metrics.gateway_tokens.labels(service, key, "completion")
            series.completion.inc(completion)
            if ttfb is not None and duration - ttfb > 0:
                if series.output_rate is None:
                    series.output_rate = metrics.gateway_output_rate.labels(service, key)
                series.output_rate.observe(completion / (duration - ttfb))
        cost = self.quotas.settle(request, outcome, prompt, completion)
        self._record(
            request.actor,
            service,
            request.view.generation,
            request.path,
            request.status,
            outcome,
            replica=key,
            node_id=replica.node_id,
            prompt=prompt,
            completion=completion,
            queue_wait=request.queue_wait,
            ttfb=ttfb,
            duration=duration,
            model=request.view.model_id,
            cost=cost,
        )

    def _record(
        self,
        actor: Principal,
        service_id: str,
        generation: int,
        path: str,
        status: int,
        outcome: str,
        *,
        replica: str = "",
        node_id: str = "",
        prompt: int | None = None,
        completion: int | None = None,
        queue_wait: float = 0.0,
        ttfb: float | None = None,
        duration: float = 0.0,
        model: str = "",
        cost: int = 0,
    ) -> None:
        """Keep one request's :class:`UsageRecord` and hand it to the sinks."""
        record = UsageRecord(
            service_id=service_id,
            generation=generation,
            replica=replica,
            node_id=node_id,
            credential_id=actor.id,
            credential_kind=actor.kind,
            path=path,
            status=status,
            outcome=outcome,
            prompt_tokens=prompt,
            completion_tokens=completion,
            queue_wait=queue_wait,
            ttfb=ttfb,
            duration=duration,
            finished_at=time.time(),
            project_id=actor.project_id if not actor.personal else "",
            user_id=actor.user_id,
            model=model,
            cost=cost,
        )
        self.usage.append(record)
        usage_log.debug("%s", record)
        for sink in self.usage_sinks:
            try:
                sink(record)
            except Exception:
                log.exception("a usage sink failed")
