"""Activation: a request to an idle on-demand service waits, within bounds, for it to load.

A scaled service that may run no replica is published with an ``activation``
(:class:`~ficc_core.routing.live.LiveService`): ``idle``, ``activating`` or
``failed``. A request that finds such a service with no ready replica is not
refused ``no_ready_replica``: it calls ``Gateway.activate`` (every such request
does; the autoscaler runs one activation however many ask) and waits until the
view has a ready replica, then is served as any other (a slot, the engine). The
wait is bounded in three ways:

- **In time**: ``activation_wait``, or the request deadline when sooner: 503
  ``activation_timeout`` with ``Retry-After`` (``activation_retry``, at least 1 s).
- **In size**: at most ``activation_queue`` requests of one service wait; the next
  one gets 429 ``service_saturated`` at once.
- **By the outcome**: the view turning ``failed`` answers every waiter at once with
  the failure's own code and message (503, ``Retry-After``, ``details.activation``
  ``failed``); ``activate`` refusing (no capacity, a recent failure) answers the
  request that asked; a drain, stop or removal, a revoked credential or the end of
  the shutdown grace answer as they do elsewhere.

A streaming request whose wait outlasts ``activation_keepalive`` is answered at
once (200, ``text/event-stream``) by a :class:`WaitingResponse`: an SSE comment
line every ``activation_keepalive`` (``: ficc waiting for <alias> to load``, which
OpenAI clients skip) keeps proxies with short idle timeouts from closing the
connection; the engine's stream follows once a replica is ready, and a failure
after the response started is its last SSE event (the relay's error event). A
non-streaming request just waits.

A client that leaves while waiting leaves the queue (outcome ``left``); the
activation goes on: the gateway only waits for ``activate``'s answer, whose work
runs in the autoscaler's own task. ``ficc_activation_waiting`` counts the waiters,
``ficc_activation_wait_seconds`` times each wait by outcome (``served``,
``timeout``, ``failed``, ``left``).

A request answered ``activation_timeout`` is expected back after its
``Retry-After``: until :func:`~ficc_core.routing.demand.retry_window` has passed it counts as
demand (:meth:`Activation.returning`, read by ``Gateway.demand``), so the replica its
wait woke does not go idle before the retry comes and starts another load.

A service with a ready replica costs the request path one attribute read
(``view.replicas``) here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

from ..base.errors import FiccError
from ..routing.demand import retry_after, retry_window
from .errors import ActivationTimeout, ServiceSaturated
from .relay import SSE, ResponseChunks, _sse_error

if TYPE_CHECKING:
    from ..config import Config
    from ..routing.live import LiveService
    from .checks import RequestChecks
    from .metrics import GatewayMetrics
    from .relay import Relay
    from .request import Request

__all__ = ["Activation", "WaitingResponse"]

#: A refusal that is about the activation: it sends a project-endpoint request to the
#: service's fallbacks (:mod:`.project`).
ACTIVATION_FAILED = "failed"


@attrs.define(eq=False)
class _Hold:
    """One request waiting for its service's activation.

    :ivar limit: when it stops waiting (``activation_wait`` or the request deadline).
    :ivar stale: a ``failed`` view seen when ``activate`` had answered: the previous
        activation's verdict, not this one's (a new failure is a new view).
    """

    request: Request
    joined: float
    limit: float
    stale: LiveService | None = None
    ended: bool = False


def activation_refusal(error: FiccError) -> bool:
    """Whether ``error`` says a service could not be woken (or not in time)."""
    return error.code == ActivationTimeout.code or (
        error.details.get("activation") == ACTIVATION_FAILED
    )


class Activation:
    """The requests waiting for activations, per service (see the module docs).

    :param checks: the request checks (the view, authority, the shutdown grace).
    :param relay: settles a :class:`WaitingResponse`'s request (``finish``).
    :param metrics: the controller's Prometheus collectors.
    :param config: ``activation_wait``, ``activation_queue``, ``activation_keepalive``
        and ``activation_retry``.
    :param recheck_interval: how often a waiter re-checks its authority, in seconds.
    """

    def __init__(
        self,
        checks: RequestChecks,
        relay: Relay,
        metrics: GatewayMetrics,
        config: Config,
        *,
        recheck_interval: float,
    ) -> None:
        self.checks = checks
        self.live = checks.live
        self.relay = relay
        self.metrics = metrics
        self.wait_bound = config.activation_wait
        self.capacity = config.activation_queue
        self.keepalive = config.activation_keepalive
        self.retry_after = str(retry_after(config.activation_retry))
        #: Seconds a request refused activation_timeout is expected back.
        self.retry_window = retry_window(config.activation_retry)
        self.recheck_interval = recheck_interval
        # Per service, its waiters in the order they came (a dict: O(1) leave, oldest first).
        self._holds: dict[str, dict[_Hold, None]] = {}
        # Per service, when each request refused activation_timeout stops being expected
        # back (in the order they were refused: the window is one length for all).
        self._returning: dict[str, deque[float]] = {}

    def waiting(self, service_id: str) -> int:
        """Requests of ``service_id`` waiting for its activation now."""
        return len(self._holds.get(service_id, ()))

    def waits(self, service_id: str, now: float) -> list[float]:
        """Seconds each request of ``service_id`` waiting for its activation has waited."""
        return [now - hold.joined for hold in self._holds.get(service_id, ())]

    def returning(self, service_id: str, now: float) -> int:
        """Requests of ``service_id`` refused ``activation_timeout`` that are still
        expected back (their ``retry_window`` has not passed)."""
        expiries = self._returning.get(service_id)
        if expiries is None:
            return 0
        while expiries and expiries[0] <= now:
            expiries.popleft()
        if not expiries:
            del self._returning[service_id]
            return 0
        return len(expiries)

    async def hold(
        self,
        request: Request,
        activate: Callable[[str], Awaitable[None]],
        respond: Callable[[], Awaitable[ResponseChunks]],
    ) -> ResponseChunks | None:
        """Wake ``request``'s service and wait until it has a ready replica.

        Returns None once one is ready (the caller serves the request), or, for a
        stream still waiting after ``activation_keepalive``, the :class:`WaitingResponse`
        that goes on waiting and then serves it with ``respond``. Raises the refusal.
        """
        service_id = request.service_id
        holds = self._holds.get(service_id)
        if holds is None:
            holds = self._holds[service_id] = {}
        if len(holds) >= self.capacity:
            raise ServiceSaturated(
                f"service {request.view.alias!r} is loading and already holds "
                f"{len(holds)} requests waiting for it (activation_queue {self.capacity}); "
                "retry shortly",
                details={
                    "service": service_id,
                    "waiting": len(holds),
                    "activation_queue": self.capacity,
                },
            )
        now = trio.current_time()
        hold = _Hold(request, now, min(now + self.wait_bound, request.deadline))
        holds[hold] = None
        # Counted against activation_queue, not the slot queue's bound, once it is woken.
        request.woken = True
        self.metrics.activation_waiting.labels(service_id).inc()
        outcome, handed = "left", False
        try:
            await self._activate(hold, activate)
            if request.streaming:
                if not await self.until(hold, hold.joined + self.keepalive):
                    handed = True
                    return WaitingResponse(self, hold, respond)
            else:
                await self.until(hold, math.inf)
            outcome = "served"
            return None
        except FiccError as exc:
            outcome = "timeout" if isinstance(exc, ActivationTimeout) else "failed"
            raise
        finally:
            if not handed:
                self.end(hold, outcome)

    async def _activate(self, hold: _Hold, activate: Callable[[str], Awaitable[None]]) -> None:
        """Ask for the activation; raise its refusal. Only the wait for its answer is
        bounded here: the activation itself runs in the autoscaler's own task, which
        neither this bound nor a client leaving cancels."""
        request = hold.request
        try:
            with trio.move_on_at(hold.limit) as bounded:
                await activate(request.service_id)
        except FiccError as exc:
            raise self._refused(request, exc) from None
        if bounded.cancelled_caught:
            raise self._timeout(hold, trio.current_time())
        view = self.live.get(request.service_id)
        if view is not None and view.activation == "failed":
            hold.stale = view

    async def until(self, hold: _Hold, until: float) -> bool:
        """Wait until the service has a ready replica (True) or ``until`` passes (False);
        raise the refusal (a failure, the bound, a drain or stop, authority)."""
        request, checks = hold.request, self.checks
        service_id = request.service_id
        while True:
            view = checks.current(request)  # removed, stopped: that refusal
            if view.replicas:
                return True
            if view.admission != "serving":
                checks.admit(view)  # draining
            if view.activation == "failed" and view is not hold.stale:
                raise self._failed(view)
            problem = checks.authority(request.actor) or checks.shutdown_problem()
            if problem is not None:
                raise problem
            now = trio.current_time()
            if now >= hold.limit:
                raise self._timeout(hold, now)
            if now >= until:
                return False
            with trio.move_on_at(min(until, hold.limit, now + self.recheck_interval)):
                await self.live.changed(service_id).wait()

    def end(self, hold: _Hold, outcome: str) -> None:
        """``hold`` stops waiting with ``outcome`` (once): out of the queue, measured."""
        if hold.ended:
            return
        hold.ended = True
        request = hold.request
        service_id = request.service_id
        holds = self._holds.get(service_id)
        if holds is not None:
            holds.pop(hold, None)
            if not holds:
                del self._holds[service_id]
        now = trio.current_time()
        # Until a slot is taken, what it waited is its activation wait.
        request.queue_wait = now - request.started
        self.metrics.activation_waiting.labels(service_id).dec()
        self.metrics.activation_wait.labels(service_id, outcome).observe(now - hold.joined)

    # -- the refusals ----------------------------------------------------------------------

    def _timeout(self, hold: _Hold, now: float) -> ActivationTimeout:
        """The refusal of a wait that passed its bound; the request is expected back."""
        request = hold.request
        waited = now - hold.joined
        self.returning(request.service_id, now)  # the expired ones go first
        self._returning.setdefault(request.service_id, deque()).append(now + self.retry_window)
        bound = (
            "the request deadline"
            if hold.limit < hold.joined + self.wait_bound
            else (f"activation_wait ({self.wait_bound:g} s)")
        )
        return ActivationTimeout(
            f"service {request.view.alias!r} did not load within {waited:.1f} s ({bound}); "
            "it is still loading: retry shortly",
            details={
                "service": request.service_id,
                "waited": round(waited, 3),
                "activation_wait": self.wait_bound,
            },
            headers={"Retry-After": self.retry_after},
        )

    def _failed(self, view: LiveService) -> FiccError:
        failure = view.activation_error
        return FiccError(
            failure.message if failure else f"the activation of service {view.alias!r} failed",
            code=failure.code if failure else "activation_failed",
            status=503,
            details={
                **(failure.details if failure else {}),
                "service": view.id,
                "activation": ACTIVATION_FAILED,
            },
            headers={"Retry-After": self.retry_after},
        )

    def _refused(self, request: Request, exc: FiccError) -> FiccError:
        """``activate``'s refusal, as this request's (a copy: one refusal may answer many)."""
        headers = dict(exc.headers)
        if exc.status in (429, 503):
            headers.setdefault("Retry-After", self.retry_after)
        return FiccError(
            exc.message,
            code=exc.code,
            status=exc.status,
            details={
                **exc.details,
                "service": request.service_id,
                "activation": ACTIVATION_FAILED,
            },
            headers=headers,
        )


class WaitingResponse(ResponseChunks):
    """A stream answered before its service loaded: keepalive comments, then the engine's
    stream (``respond``), or the refusal as its last SSE event (see the module docs).

    Closing it (``aclose``, leaving ``async with``) while it waits leaves the queue
    (outcome ``left``) and settles the request as ``cancelled``.
    """

    def __init__(
        self,
        activation: Activation,
        hold: _Hold,
        respond: Callable[[], Awaitable[ResponseChunks]],
    ) -> None:
        request, relay = hold.request, activation.relay
        deadline = None if math.isinf(request.deadline) else request.deadline
        comment = f": ficc waiting for {request.view.alias} to load\n\n".encode()
        super().__init__(
            status=200,
            content_type=SSE,
            deadline=deadline,
            send_deadline=math.inf if deadline is None else deadline + relay.send_grace,
            pending=[comment],
            relay=relay,
            request=request,
        )
        self._activation = activation
        self._hold = hold
        self._respond = respond
        self._comment = comment
        self._inner: ResponseChunks | None = None
        request.status = 200  # what the client got, whatever follows

    async def __anext__(self) -> bytes:
        inner = self._inner
        if inner is not None:
            return await inner.__anext__()
        if self._pending:
            return self._pending.popleft()
        request, relay = self._request, self._relay
        if self._done or request is None or relay is None:
            raise StopAsyncIteration
        activation, hold = self._activation, self._hold
        try:
            if not await activation.until(hold, trio.current_time() + activation.keepalive):
                return self._comment
            activation.end(hold, "served")
            inner = await self._respond()
        except FiccError as error:
            activation.end(hold, "timeout" if isinstance(error, ActivationTimeout) else "failed")
            self._done = True
            request.status = 200
            await relay.finish(request, error.code)
            return _sse_error(error)
        self._inner = inner
        return await inner.__anext__()

    async def aclose(self) -> None:
        """End the response: leave the queue if still waiting, close the engine's stream if
        it began, settle the request. Idempotent."""
        self._activation.end(self._hold, "left")
        inner = self._inner
        if inner is not None:
            await inner.aclose()
        await super().aclose()
