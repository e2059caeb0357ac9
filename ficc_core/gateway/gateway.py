"""The inference gateway: authorise, route to a ready replica, relay its engine's answer.

One seam serves the HTTP routes and any future federation transport, as an
``async with`` resource::

    async with gateway.open_response(service_id, "/v1/chat/completions", body, actor) as response:
        async for chunk in response:
            await transport.write(chunk)

or, as the contract names it, a call whose response the caller closes::

    status, chunks = await gateway.invoke(service_id, "/v1/chat/completions", body, actor)
    try:
        async for chunk in chunks:
            await transport.write(chunk)
    finally:
        await chunks.aclose()

Either raises a :class:`~ficc_core.base.errors.FiccError` (the one envelope) for every
refusal made before a response exists: authority, admission, body, saturation,
deadline, a failed engine. Otherwise the :class:`ResponseChunks` carries the
engine's ``status``, ``content_type``, ``headers``, ``deadline`` and
``send_deadline``; leaving it (or ``aclose()``) cancels the engine request if the
response did not end by itself, frees the replica slot and accounts the request.

The concerns live beside this module: :mod:`.checks` (authority, admission and
body checks), :mod:`.activation` (a request to an idle on-demand service wakes it
and waits, bounded, for a ready replica), :mod:`.admission` (replica slots and the
wait queue), :mod:`.relay`
(reading the engine's stream with authority re-checked, the response) and
:mod:`.accounting` (usage records and metrics). This module runs a request
through them: admit, take a slot, open the engine stream, and move to another
replica when one fails before anything reached the client (open refused, node
unavailable, the stream failing before its first bytes, an engine 502/503/504, a
timeout): at most ``retries`` more replicas, none whose breaker is open
(:mod:`.breakers`). A JSON answer is read whole and a stream's first chunk is read
before the response is handed out, so both count as "before"; after that nothing
is replayed. An engine's own JSON error answer is re-shaped as an OpenAI error
object in the envelope (:mod:`.engine_errors`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import trio

from ..base.errors import FiccError
from ..base.strictjson import dumps
from ..executor.errors import InputNotAdmitted, PathNotAdmitted
from ..executor.types import ResponseHead, StreamFailed
from ..quotas import QuotaGate, Unlimited
from ..routing.activation import ActivationChannel
from ..routing.demand import Demand, DemandBoard
from ..routing.idle import IdleSignal
from ..usage.records import UsageRecord
from .accounting import Accounting
from .activation import Activation
from .admission import Admission, no_replica
from .breakers import Breakers
from .catalog import model_entry, models_document
from .checks import Body, RequestChecks
from .engine_errors import engine_error
from .errors import (
    DeadlineExceeded,
    EngineFailed,
    EngineTimeout,
    ReplicaUnresponsive,
    not_served_here,
)
from .limits import ContextLimits
from .relay import SSE, Relay, ResponseChunks, Timeouts
from .request import Request
from .scoring import router_from_config

if TYPE_CHECKING:
    from types import TracebackType

    from ..auth import AuthService, Principal
    from ..config import Config
    from ..contributors import NodeRegistry
    from ..routing.live import LiveService, LiveTable
    from .metrics import GatewayMetrics

log = logging.getLogger("ficc.gateway")

__all__ = ["MODEL_PREFIX", "MODEL_ROUTE", "PATHS", "Gateway"]

#: The engine paths a client may invoke, with their HTTP method.
PATHS: Mapping[str, str] = {
    "/v1/models": "GET",
    "/v1/chat/completions": "POST",
    "/v1/embeddings": "POST",
    "/v1/completions": "POST",
}
#: The prefix of ``GET /v1/models/{model}``, one model's entry (what the ``openai``
#: client's ``models.retrieve`` asks): an extension beside :data:`PATHS`, answered
#: from memory as ``/v1/models`` is; ``MODEL_ROUTE`` is its path in usage records.
MODEL_PREFIX = "/v1/models/"
MODEL_ROUTE = "/v1/models/{model}"
#: Executor refusals of an open that say nothing about another replica: no retry, the
#: client is told (a body too large for the endpoint is a ``PathNotAdmitted``).
FINAL_REFUSALS = (DeadlineExceeded, PathNotAdmitted, InputNotAdmitted)
#: Engine statuses that say the engine did not take the request: another replica is tried.
RETRIED_STATUSES = frozenset({502, 503, 504})
#: Failures after the head, before anything reached the client, that another replica
#: may do better on (anything else there, such as a revoked credential, is final).
ENGINE_FAULTS = (EngineTimeout, EngineFailed)
#: A request without headers routing reads.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def method_of(path: str) -> str:
    """The HTTP method of the inference path ``path`` (one of :data:`PATHS`, or a model's
    ``/v1/models/{model}``); raise ``route_not_found`` for another."""
    method = PATHS.get(path)
    if method is None and path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
        return "GET"
    if method is None:
        raise FiccError(
            f"{path!r} is not an inference route; use one of {', '.join(PATHS)}",
            code="route_not_found",
            status=404,
        )
    return method


class _Opening:
    """What :meth:`Gateway.open_response` returns: ``async with`` it to get the response."""

    __slots__ = ("_args", "_gateway", "_response")

    def __init__(self, gateway: Gateway, args: tuple[Any, ...]) -> None:
        self._gateway = gateway
        self._args = args
        self._response: ResponseChunks | None = None

    async def __aenter__(self) -> ResponseChunks:
        _, self._response = await self._gateway.invoke(*self._args)
        return self._response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._response is not None:
            await self._response.aclose()


class Gateway:
    """Authorises, routes and relays inference requests (see the module docs).

    :param live: the reconciler's live routing table.
    :param contributors: the node registry (``endpoint(node_id)``).
    :param auth: the authentication service (revocations are learnt from it).
    :param metrics: the controller's Prometheus collectors.
    :param config: the controller's configuration (``max_body_bytes``).
    :param queue_factor: the wait queue holds this many times the service's capacity.
    :param max_queue_wait: the longest a request waits for a slot, in seconds.
    :param recheck_interval: how often a waiting read re-checks authority, seconds.
    :param max_attempts: replicas one request tries before its first byte (default:
        the ``retries`` setting plus one).
    :param prefetch_bytes: how much of a non-streamed answer is read before the response
        is handed out; a longer body streams after that.
    :param usage_records: how many :class:`UsageRecord` are kept in :attr:`usage`.
    :param send_grace: seconds a response may take to send after the request deadline
        (the client reading the final error event): :attr:`ResponseChunks.send_deadline`,
        where an invoke path stops sending and closes the response, which frees the
        slot of a client that stopped reading. Without a request deadline, no bound.
    :param usage_sinks: called with each :class:`UsageRecord` (e.g. to persist it);
        must not block. More can be added to :attr:`usage_sinks`.
    :param rng: breaks ties between equally loaded replicas (default: a new
        :class:`random.Random`).
    :param quotas: rate limits, budgets and spend (default: :class:`Unlimited`); asked
        before a replica is taken and when a request ends (:mod:`ficc_core.quotas`).
    :param activations: wakes an idle on-demand service (the autoscaler serves it; by
        default nothing does, and such a request is refused ``activation_failed``).
    :param board: the gateway serves it with :meth:`demand` (the autoscaler reads it).
    :param idle_signal: the gateway serves it with its wait for an attempt's requests
        in flight to end (the reconciler drains a retiring attempt by it).
    """

    def __init__(
        self,
        *,
        live: LiveTable,
        contributors: NodeRegistry,
        auth: AuthService,
        metrics: GatewayMetrics,
        config: Config,
        queue_factor: int = 4,
        max_queue_wait: float = 30.0,
        recheck_interval: float = 0.25,
        max_attempts: int | None = None,
        prefetch_bytes: int = 1 << 20,
        usage_records: int = 10_000,
        send_grace: float = 5.0,
        usage_sinks: Iterable[Callable[[UsageRecord], None]] = (),
        rng: random.Random | None = None,
        quotas: QuotaGate | None = None,
        activations: ActivationChannel | None = None,
        board: DemandBoard | None = None,
        idle_signal: IdleSignal | None = None,
    ) -> None:
        self.live = live
        self.max_attempts = max(1, config.retries + 1 if max_attempts is None else max_attempts)
        self.prefetch_bytes = prefetch_bytes
        self.checks = RequestChecks(auth, live, max_body_bytes=config.max_body_bytes)
        self.quotas: QuotaGate = Unlimited() if quotas is None else quotas
        self.accounting = Accounting(
            metrics, usage_records=usage_records, usage_sinks=usage_sinks, quotas=self.quotas
        )
        rng = random.Random() if rng is None else rng
        # Requests in flight per replica: admission counts them, the router reads them.
        load: dict[str, int] = {}
        self.router = router_from_config(
            config,
            live=live,
            contributors=contributors,
            local=lambda replica_key: load.get(replica_key, 0),
            metrics=metrics,
            rng=rng,
        )
        self.admission = Admission(
            self.checks,
            self.accounting,
            router=self.router,
            load=load,
            rng=rng,
            config=config,
            queue_factor=queue_factor,
            max_queue_wait=max_queue_wait,
            recheck_interval=recheck_interval,
        )
        self.breakers = Breakers(
            live, metrics, threshold=config.breaker_threshold, cooldown=config.breaker_cooldown
        )
        self.relay = Relay(
            contributors,
            self.checks,
            settle=self._settle,
            recheck_interval=recheck_interval,
            send_grace=send_grace,
            timeouts=Timeouts.from_config(config),
            timed_out=self._timed_out,
        )
        #: The context and output limits every request's checks apply (None: none).
        self.limits: ContextLimits | None = ContextLimits(
            self.relay, metrics, tokenize_timeout=config.tokenize_timeout
        )
        #: ``timeout_total``: the longest any request may take (``math.inf``: none).
        self.total_timeout = config.timeout_total or math.inf
        #: The latest requests' usage, oldest first.
        self.usage = self.accounting.usage
        #: Called with each :class:`UsageRecord` (e.g. to persist it); must not block.
        self.usage_sinks = self.accounting.usage_sinks
        #: Wakes an idle on-demand service: returns once its activation is recorded (a
        #: replica is starting), raises its refusal (no capacity, a recent failure).
        self.activations = ActivationChannel() if activations is None else activations
        #: The requests waiting for an activation (:mod:`.activation`).
        self.activation = Activation(
            self.checks, self.relay, metrics, config, recheck_interval=recheck_interval
        )
        # When a replica was last used is forgotten once it is no longer routed to.
        self.router.swept.append(self.admission.forget_idle)
        self.router.swept.append(self.accounting.forget_departed)
        if board is not None:
            board.serve(self.demand)
        if idle_signal is not None:
            idle_signal.serve(self.admission.wait_idle)

    # -- the seam ------------------------------------------------------------------------------

    def open_response(
        self,
        service_id: str,
        path: str,
        body: bytes | Mapping[str, Any] | Body,
        actor: Principal,
        headers: Mapping[str, str] = NO_HEADERS,
    ) -> _Opening:
        """``async with`` it: the response to ``actor``'s request to ``path`` of ``service_id``.

        Entering raises the refusal (a :class:`FiccError`) made before a response
        exists; leaving releases everything the response holds.
        """
        return _Opening(self, (service_id, path, body, actor, headers))

    async def invoke(
        self,
        service_id: str,
        path: str,
        body: bytes | Mapping[str, Any] | Body,
        actor: Principal,
        headers: Mapping[str, str] = NO_HEADERS,
    ) -> tuple[int, ResponseChunks]:
        """Serve one request of ``actor`` to ``path`` of service ``service_id``.

        :param headers: the client's request headers that routing reads (a session
            header, a band header), names in lower case, the first value of each.

        Returns the engine's status and the response, which the caller must close
        (``aclose()``, or ``async with``); raises the gateway's (or the executor's)
        :class:`FiccError` for a refusal.
        """
        started = trio.current_time()
        method = method_of(path)
        try:
            view = self.checks.authorise(service_id, actor)
        except FiccError as exc:
            # Not labelled with the service: a client must not mint metric series (nor
            # paths: a model's is recorded as its route).
            recorded = MODEL_ROUTE if path.startswith(MODEL_PREFIX) else path
            self.accounting.refused("", exc.code, actor, recorded, exc.status)
            raise
        if method == "GET":  # /v1/models, or one model's entry: answered from memory
            try:
                return 200, self._models(view, actor, path)
            except FiccError as exc:
                self.accounting.refused(
                    service_id,
                    exc.code,
                    actor,
                    MODEL_ROUTE,
                    exc.status,
                    view.model_id,
                    view.generation,
                )
                raise
        try:
            self.checks.admit(view)
            limits = self.limits
            prepared = self.checks.prepare(view, path, body, limits=limits)
            payload, prompt = prepared.payload, prepared.prompt_estimate
            if prepared.prompt_count is not None and limits is not None:
                prompt = await limits.settle(prepared.prompt_count) or prompt
        except FiccError as exc:
            self.accounting.refused(
                service_id, exc.code, actor, path, exc.status, view.model_id, view.generation
            )
            raise
        # The request's bound: the service's deadline, unless timeout_total is shorter.
        bound, seconds = "timeout_total", self.total_timeout
        if view.request_deadline is not None and view.request_deadline <= seconds:
            bound, seconds = "request_deadline", view.request_deadline
        request = Request(
            service_id=service_id,
            path=path,
            actor=actor,
            view=view,
            headers=headers,
            started=started,
            deadline=started + seconds,
            deadline_bound=bound,
            deadline_seconds=seconds,
            streaming=prepared.streaming,
            hide_usage=prepared.hide_usage,
            payload=payload,
            prompt_estimate=prompt,
            completion_estimate=prepared.completion_estimate,
        )
        try:
            self.quotas.admit(request)  # before a replica is taken
        except FiccError as exc:
            self.accounting.refused(
                service_id, exc.code, actor, path, exc.status, view.model_id, view.generation
            )
            raise
        # Counted in flight until settled (a drain waits for it): every way out settles.
        self.live.enter(service_id)
        try:
            # An idle on-demand service (no replica, an activation state) is woken first.
            if not view.replicas and view.activation:
                waiting = await self.activation.hold(
                    request,
                    self.activations.activate,
                    partial(self._respond, request, method, payload),
                )
                if waiting is not None:
                    return 200, waiting  # a stream kept alive until a replica is ready
            response = await self._respond(request, method, payload)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                code = exc.code if isinstance(exc, FiccError) else "cancelled"
                if isinstance(exc, FiccError) and not request.status:
                    request.status = exc.status  # a refusal before an engine answered
                await self.relay.finish(request, code)
            raise
        return response.status, response

    async def _respond(self, request: Request, method: str, payload: bytes) -> ResponseChunks:
        """The engine's response to ``request`` (an engine's JSON error raised as the
        refusal it is): what :meth:`invoke` does inline, for a stream answered while its
        service loaded (:class:`~.activation.WaitingResponse`)."""
        response = await self._dispatch(request, method, payload)
        if response.status >= 400 and not response.streaming:
            refusal = engine_error(response.status, response.take_pending())
            if refusal is not None:
                raise refusal
        return response

    @staticmethod
    def _models(view: LiveService, actor: Principal, path: str) -> ResponseChunks:
        """The service's ``/v1/models`` answer, or for ``/v1/models/{model}`` its one
        entry when ``model`` is its alias (the id that list shows)."""
        # A personal key's shared service is owned by its project (as /v1/models says).
        owner = view.project_id if actor.personal else actor.project_name or actor.project_id
        if path == "/v1/models":
            document = models_document((view,), owner)
        else:
            model = path[len(MODEL_PREFIX) :]
            if model != view.alias:
                raise not_served_here(model, view.alias)
            document = dumps(model_entry(view, owner))
        return ResponseChunks(status=200, content_type="application/json", pending=[document])

    async def _dispatch(self, request: Request, method: str, payload: bytes) -> ResponseChunks:
        headers = [
            ("content-type", "application/json"),
            ("accept", SSE if request.streaming else "application/json"),
        ]
        tried: set[str] = set()
        last: FiccError | None = None
        for attempt in range(self.max_attempts):
            if tried and all(r.key in tried for r in request.view.replicas):
                break
            await self.admission.slot(request, self.breakers.excluded(request.view, tried), last)
            if attempt == 0:
                request.queue_wait = trio.current_time() - request.started
                self.accounting.waited(request)
            replica = request.replica
            assert replica is not None
            self.breakers.attempt(replica.key)
            final = attempt + 1 == self.max_attempts
            try:
                failure, response = await self._attempt(request, method, headers, payload, final)
            except BaseException:
                self.breakers.abandoned(replica.key)
                raise
            if response is not None:
                if response.status >= 500:
                    self.breakers.failed(request.service_id, replica.key)
                else:
                    self.breakers.succeeded(replica.key)
                return response
            assert failure is not None
            self.breakers.failed(request.service_id, replica.key)
            log.info(
                "service %s: replica %s failed before answering (%s); trying another",
                request.service_id,
                replica.key,
                failure.code,
            )
            self.accounting.retried(request.service_id, replica.key, failure.code)
            await self.relay.cancel(request)
            self.admission.release(request)
            tried.add(replica.key)
            last = failure
        if isinstance(last, ENGINE_FAULTS):
            # The engines took the request and did not finish it: say so, not "no replica".
            last.details["replicas_tried"] = len(tried)
            raise last
        raise no_replica(request.view, f"{len(tried)} replicas failed before answering", last)

    async def _attempt(
        self,
        request: Request,
        method: str,
        headers: list[tuple[str, str]],
        payload: bytes,
        final: bool,
    ) -> tuple[FiccError | None, ResponseChunks | None]:
        """One try on the request's replica: its response with the first bytes read, or
        the failure another replica may not have (raises what no other would help with)."""
        try:
            head = await self.relay.open(request, method, headers, payload)
        except FINAL_REFUSALS:
            raise
        except FiccError as exc:
            return exc, None  # the open refused, the node unavailable, timeout_dial
        if isinstance(head, EngineTimeout | ReplicaUnresponsive):
            return head, None  # another replica may answer: nothing reached the client
        if isinstance(head, FiccError):
            # Authority, generation or deadline: no other replica would help.
            raise head
        if not isinstance(head, ResponseHead):
            return FiccError(
                f"the engine's stream failed before answering: {head}",
                code=(head.code if isinstance(head, StreamFailed) else "") or "engine_unavailable",
                status=503,
            ), None
        if head.status in RETRIED_STATUSES and not final:
            return FiccError(
                f"the engine answered {head.status} before anything was sent",
                code="engine_unavailable",
                status=503,
                details={"engine_status": head.status},
            ), None
        response = self.relay.response(request, head)
        try:
            if response.streaming:
                await response.first_chunk()
            else:
                # A JSON answer is read (bounded) so a failure before its end is an envelope.
                await response.prefetch(self.prefetch_bytes)
        except ENGINE_FAULTS as exc:
            # Nothing reached the client: what this attempt relayed is forgotten.
            assert request.stream is not None
            request.stream.forget()
            return exc, None
        replica = request.replica
        assert replica is not None
        self.accounting.series(request.service_id, replica.key).requests.inc()
        return None, response

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The gateway's background work until cancelled: reading the engines' load
        (:mod:`.scrape`) and forgetting replicas that left (:mod:`.scoring`)."""
        await self.router.run(task_status=task_status)

    def _timed_out(self, request: Request, bound: str) -> None:
        """A wait for an engine ran past ``bound``: counted, and its replica's liveness is
        probed at once (:mod:`~ficc_core.inference.reconciliation.liveness`)."""
        self.accounting.timed_out(request, bound)
        if request.replica is not None:
            self.live.suspect(request.replica.key)

    def _settle(self, request: Request, outcome: str) -> None:
        """A request ended: free its slot, leave the live count, account it. Once."""
        if request.finished:
            return
        request.finished = True
        self.admission.release(request)
        self.live.leave(request.service_id)
        self.accounting.settle(request, outcome)

    # -- what operators and tests look at -------------------------------------------------------

    def load(self, replica_key: str) -> int:
        """Requests in flight on the replica with ``replica_key`` (its attempt ID)."""
        return self.admission.load(replica_key)

    def queued(self, service_id: str) -> int:
        """Requests of ``service_id`` waiting for a slot."""
        return self.admission.queued(service_id)

    def demand(self, service_id: str) -> Demand:
        """What the autoscaler decides by for ``service_id`` (:class:`~.activation.Demand`):
        requests waiting (for a slot or an activation), the oldest one's wait, requests in
        flight, how long each replica of its view has served nothing, and the requests
        refused activation_timeout that are expected back. In memory,
        O(replicas + requests waiting) (the queues are bounded)."""
        now = trio.current_time()
        waits = self.admission.waits(service_id, now) + self.activation.waits(service_id, now)
        waits.sort(reverse=True)
        view = self.live.get(service_id)
        return Demand(
            waits=tuple(waits),
            inflight=self.live.inflight(service_id),
            idle_for=self.admission.idle_for(() if view is None else view.replicas, now),
            returning=self.activation.returning(service_id, now),
        )
