"""Liveness: a ready replica's engine keeps being asked whether it answers.

An engine's readiness probe (run by its executor) stops once the engine is ready; an
engine that hangs afterwards (a stuck driver, a deadlock, a paused process) still
looks ready to its executor. So, while the reconciler watches a ready attempt, it
also probes the engine itself: every ``liveness_interval`` a ``GET`` of its health
route (the first of :data:`PROBE_PATHS` its endpoint admits) through the node's
endpoint action, the same path every request takes, bounded by ``liveness_timeout``.
A failed ``/metrics`` read or a request timeout on the replica in the gateway
(:meth:`LiveTable.suspect <ficc_core.routing.live.LiveTable.suspect>`) brings the
next probe forward, so a hung engine under traffic is noticed in about
``liveness_misses`` x ``liveness_timeout``.

A probe is *missed* when no response head came within the timeout, the stream failed,
or the engine answered 5xx. After ``liveness_misses`` misses in a row the replica is
**unresponsive**:

- it leaves routing at once (:meth:`LiveTable.suspend`): no new request goes there, and
  the gateway ends the requests in flight on it (``replica_unresponsive``: one that had
  sent nothing to its client yet is tried on another replica, a stream that had ends
  with it as its last event);
- its attempt records the reason ``unresponsive`` (an event; the service is degraded);
- it is probed on, and restarted after the same back-off as a crash (the replica's
  next wait, one second at first, doubling up to ``replica_retry_max``), unless it
  answers first (it has at least one more probe's time): then it is put back in
  routing (an event saying for how long it was out).

Probes that the endpoint refuses (the node not connected, the attempt unknown there),
and probes missed while the node itself is in trouble (disconnected, or silent past
its heartbeats), are no verdict: the node's own state is followed by the attempt's
watch, and a frozen agent is not a hung engine.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import trio

from ...base.errors import FiccError
from ...executor.types import EndOfStream, ResponseHead, StreamFailed
from ...store.outage import is_store_failure

if TYPE_CHECKING:
    from ...contributors import NodeRegistry
    from ...routing.live import LiveTable
    from ..records import AttemptRecord
    from .metrics import ReconciliationMetrics
    from .observed import Observations

log = logging.getLogger("ficc.inference.liveness")

#: The reason an unresponsive attempt records (and the gateway's error names).
UNRESPONSIVE = "unresponsive"
#: Cheap routes that answer without generating, in order of preference: llama.cpp's and
#: vLLM's ``/health``, Ollama's version, an OpenAI-compatible model list.
PROBE_PATHS = ("/health", "/api/version", "/v1/models")
_HEADERS = [("accept", "*/*")]


def probe_path(attempt: AttemptRecord) -> str | None:
    """The route a liveness probe of ``attempt`` asks (one its endpoint admits), or None."""
    try:
        workload = json.loads(attempt.workload or "{}")
        paths = set(workload.get("endpoint", {}).get("paths", ()))
    except (ValueError, AttributeError, TypeError):
        return None
    return next((path for path in PROBE_PATHS if path in paths), None)


class LivenessSettings(TypedDict, total=False):
    """:class:`Liveness`'s settings by name, as the controller's configuration gives them."""

    interval: float
    timeout: float
    misses: int


class Liveness:
    """Probes ready attempts' engines (see the module docs).

    :param live: the routing table (suspensions, and the gateway's suspicions).
    :param contributors: the node registry (``endpoint(node_id)``).
    :param observations: where attempts' reasons are recorded.
    :param interval: seconds between probes of one replica.
    :param timeout: the longest one probe may take, seconds.
    :param misses: probes missed in a row that make a replica unresponsive; 0: no probes.
    :param metrics: the controller's collectors, or None.
    """

    def __init__(
        self,
        live: LiveTable,
        contributors: NodeRegistry,
        observations: Observations,
        *,
        interval: float = 10.0,
        timeout: float = 5.0,
        misses: int = 3,
        metrics: ReconciliationMetrics | None = None,
    ) -> None:
        self.live = live
        self.contributors = contributors
        self.observations = observations
        self.interval = interval
        self.timeout = timeout
        self.misses = misses
        self.metrics = metrics
        self._numbers = 0

    def trouble(self, attempt_id: str) -> str | None:
        """Why a ready attempt cannot count as serving now by its liveness, or None."""
        if self.live.suspended(attempt_id) is None:
            return None
        return f"attempt {attempt_id} stopped answering its liveness probes"

    async def probe(self, attempt: AttemptRecord, path: str) -> str | None:
        """One probe: None when the engine answered, else what went wrong; raises the
        endpoint's refusal (:class:`FiccError`) when it could not be asked at all."""
        endpoint = self.contributors.endpoint(attempt.node_id)
        fence = attempt.fence
        self._numbers += 1
        stream_id = f"live-{attempt.attempt_id[-12:]}-{self._numbers}"
        opened = ended = False
        status = 0
        try:
            with trio.move_on_after(self.timeout):
                await endpoint.open(fence, stream_id, "GET", path, _HEADERS, b"")
                opened = True
                while True:
                    event: Any = await endpoint.read(fence, stream_id)
                    if isinstance(event, ResponseHead):
                        status = event.status
                    elif isinstance(event, EndOfStream):
                        ended = True
                        break
                    elif isinstance(event, StreamFailed):
                        ended = True
                        return f"its stream failed: {event.message}"
            if not ended:
                return f"no answer to GET {path} within {self.timeout:g} s"
        finally:
            if opened and not ended:
                with trio.CancelScope(shield=True), trio.move_on_after(self.timeout):
                    try:
                        await endpoint.cancel(fence, stream_id)
                    except FiccError:
                        pass
        if status >= 500:
            return f"GET {path} answered {status}"
        return None

    async def follow(self, attempt: AttemptRecord, grace: Callable[[], float]) -> float | None:
        """Probe the ready ``attempt`` until it must be restarted (or the caller cancels).

        Returns the seconds it was unresponsive once it stayed so for ``grace()`` seconds
        (read when it became unresponsive: the replica's back-off), or None when it
        cannot be probed (no probe route, or probes turned off) and so never will be.
        """
        path = probe_path(attempt)
        if self.misses <= 0 or path is None:
            return None
        key, service_id = attempt.attempt_id, attempt.service_id
        labels = (service_id, key)
        missed = 0
        since = -math.inf  # when it became unresponsive (trio clock), -inf while it answers
        restart_at = math.inf
        why = ""
        outcome = "ended"
        if attempt.reason == UNRESPONSIVE:
            # Recorded unresponsive by a controller that stopped meanwhile: out of routing
            # until it answers, and restarted after the grace like any other.
            since = trio.current_time()
            restart_at = since + max(grace(), self.timeout)
            self.live.suspend(service_id, key, UNRESPONSIVE)
        try:
            while True:
                started = trio.current_time()
                try:
                    why = await self.probe(attempt, path) or ""
                except FiccError as exc:
                    log.debug("liveness probe of %s not sent: %s", key, exc.message)
                    await trio.sleep(min(self.interval, self.timeout))
                    continue
                now = trio.current_time()
                if why and self.contributors.attempt_trouble(attempt.node_id, key) is not None:
                    # Its node is in trouble (disconnected, silent): the node's state says
                    # so and the attempt's watch follows it; the engine is not judged.
                    why = ""
                    missed = 0
                    await trio.sleep_until(started + self.interval)
                    continue
                if not why:
                    missed = 0
                    if since > -math.inf:
                        await self._answered(attempt, now - since)
                        since, restart_at = -math.inf, math.inf
                else:
                    missed += 1
                    if self.metrics is not None:
                        self.metrics.liveness_misses.labels(*labels).inc()
                if why and missed >= self.misses and since == -math.inf:
                    since = now
                    # At least one more probe's time, so an answer can still put it back.
                    restart_at = now + max(grace(), self.timeout)
                    await self._unresponsive(attempt, missed, why, restart_at - now)
                if now >= restart_at:
                    outcome = "restarted"
                    return now - since
                if since > -math.inf:
                    # Unresponsive: probed on (one after the other) until the restart.
                    await trio.sleep_until(min(restart_at, started + self.timeout))
                    continue
                suspicion = self.live.suspicion(key)
                with trio.move_on_at(started + self.interval):
                    await suspicion.wait()
                    # Brought forward, but never more often than one probe per timeout.
                    await trio.sleep_until(started + min(self.interval, self.timeout))
        finally:
            if since > -math.inf and self.metrics is not None:
                self.metrics.liveness_unresponsive.labels(*labels).set(0)
                self.metrics.liveness_unresponsive_seconds.labels(service_id, outcome).observe(
                    trio.current_time() - since
                )
            # A restarted one stays out of routing until its attempt is released.
            if outcome != "restarted":
                self.live.forget_suspicion(key)

    async def _unresponsive(
        self, attempt: AttemptRecord, missed: int, why: str, restart_in: float
    ) -> None:
        key = attempt.attempt_id
        self.live.suspend(attempt.service_id, key, UNRESPONSIVE)
        if self.metrics is not None:
            self.metrics.liveness_unresponsive.labels(attempt.service_id, key).set(1)
        message = (
            f"its engine missed {missed} liveness probes in a row (every {self.interval:g} s, "
            f"{self.timeout:g} s each; last: {why}): out of routing, restarted in "
            f"{restart_in:g} s unless it answers first"
        )
        log.warning("service %s attempt %s: %s", attempt.service_id, key, message)
        await self._record(attempt, reason=UNRESPONSIVE, message=message, health="no answer")

    async def _answered(self, attempt: AttemptRecord, seconds: float) -> None:
        key = attempt.attempt_id
        self.live.resume(key)
        self.observations.changed(attempt.service_id)  # published again, with it
        if self.metrics is not None:
            self.metrics.liveness_unresponsive.labels(attempt.service_id, key).set(0)
            self.metrics.liveness_unresponsive_seconds.labels(
                attempt.service_id, "answered"
            ).observe(seconds)
        message = (
            f"its engine answered its liveness probe again after {seconds:.1f} s "
            "unresponsive: back in routing"
        )
        log.warning("service %s attempt %s: %s", attempt.service_id, key, message)
        await self._record(attempt, reason=None, message=message, health="200")

    async def _record(self, attempt: AttemptRecord, **changes: Any) -> None:
        try:
            await self.observations.set_attempt(attempt.service_id, attempt.attempt_id, **changes)
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            # The routing change is made already; the record follows at the next change.
            log.warning("recording attempt %s's liveness failed: %s", attempt.attempt_id, exc)


__all__ = ["PROBE_PATHS", "UNRESPONSIVE", "Liveness", "probe_path"]
