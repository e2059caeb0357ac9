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

Either raises a :class:`~ficc_core.errors.FiccError` (the one envelope) for every
refusal made before a response exists: authority, admission, body, saturation,
deadline, a failed engine. Otherwise the :class:`ResponseChunks` carries the
engine's ``status``, ``content_type``, ``headers``, ``deadline`` and
``send_deadline``; leaving it (or ``aclose()``) cancels the engine request if the
response did not end by itself, frees the replica slot and accounts the request.

The concerns live beside this module: :mod:`.checks` (authority, admission and
body checks), :mod:`.admission` (replica slots and the wait queue), :mod:`.relay`
(reading the engine's stream with authority re-checked, the response) and
:mod:`.accounting` (usage records and metrics). This module runs a request
through them: admit, take a slot, open the engine stream, and move to another
replica when one fails before answering (open refused, node unavailable, the
stream failing before its response head, an engine 503); once a response head
exists nothing is replayed.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import trio

from ..errors import FiccError
from ..executor.errors import InputNotAdmitted, PathNotAdmitted
from ..executor.types import ResponseHead
from ..strictjson import dumps
from .accounting import Accounting, UsageRecord
from .admission import Admission, no_replica
from .checks import RequestChecks
from .errors import DeadlineExceeded
from .relay import SSE, Relay, ResponseChunks
from .request import Request
from .scoring import router_from_config

if TYPE_CHECKING:
    from types import TracebackType

    from ..auth import AuthService, Principal
    from ..config import Config
    from ..contributors import NodeRegistry
    from ..inference.live import LiveService, LiveTable
    from ..metrics import Metrics

log = logging.getLogger("ficc.gateway")

__all__ = ["PATHS", "Gateway"]

#: The engine paths a client may invoke, with their HTTP method.
PATHS: Mapping[str, str] = {
    "/v1/models": "GET",
    "/v1/chat/completions": "POST",
    "/v1/embeddings": "POST",
}
#: Executor refusals of an open that say nothing about another replica: no retry, the
#: client is told (a body too large for the endpoint is a ``PathNotAdmitted``).
FINAL_REFUSALS = (DeadlineExceeded, PathNotAdmitted, InputNotAdmitted)
#: A request without headers routing reads.
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


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
    :param max_attempts: replicas one request tries before its first byte.
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
    """

    def __init__(
        self,
        *,
        live: LiveTable,
        contributors: NodeRegistry,
        auth: AuthService,
        metrics: Metrics,
        config: Config,
        queue_factor: int = 4,
        max_queue_wait: float = 30.0,
        recheck_interval: float = 0.25,
        max_attempts: int = 3,
        prefetch_bytes: int = 1 << 20,
        usage_records: int = 10_000,
        send_grace: float = 5.0,
        usage_sinks: Iterable[Callable[[UsageRecord], None]] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.live = live
        self.max_attempts = max(1, max_attempts)
        self.prefetch_bytes = prefetch_bytes
        self.checks = RequestChecks(auth, live, max_body_bytes=config.max_body_bytes)
        self.accounting = Accounting(metrics, usage_records=usage_records, usage_sinks=usage_sinks)
        self.admission = Admission(
            self.checks,
            self.accounting,
            rng=random.Random() if rng is None else rng,
            queue_factor=queue_factor,
            max_queue_wait=max_queue_wait,
            recheck_interval=recheck_interval,
        )
        self.router = self.admission.router = router_from_config(
            config,
            live=live,
            contributors=contributors,
            local=self.admission.load,
            metrics=metrics,
            rng=self.admission.rng,
        )
        self.relay = Relay(
            contributors,
            self.checks,
            settle=self._settle,
            recheck_interval=recheck_interval,
            send_grace=send_grace,
        )
        #: The latest requests' usage, oldest first.
        self.usage = self.accounting.usage
        #: Called with each :class:`UsageRecord` (e.g. to persist it); must not block.
        self.usage_sinks = self.accounting.usage_sinks

    # -- the seam ------------------------------------------------------------------------------

    def open_response(
        self,
        service_id: str,
        path: str,
        body: bytes | Mapping[str, Any],
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
        body: bytes | Mapping[str, Any],
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
        method = PATHS.get(path)
        if method is None:
            raise FiccError(
                f"{path!r} is not an inference route; use one of {', '.join(PATHS)}",
                code="route_not_found",
                status=404,
            )
        try:
            view = self.checks.authorise(service_id, actor)
        except FiccError as exc:
            # Not labelled with the service: a client must not mint metric series.
            self.accounting.refused("", exc.code)
            raise
        if path == "/v1/models":
            return 200, self._models(view)
        try:
            self.checks.admit(view)
            payload, streaming = self.checks.prepare(view, path, body)
        except FiccError as exc:
            self.accounting.refused(service_id, exc.code)
            raise
        request = Request(
            service_id=service_id,
            path=path,
            actor=actor,
            view=view,
            headers=headers,
            started=started,
            deadline=math.inf if view.request_deadline is None else started + view.request_deadline,
            payload=payload,
        )
        # Counted in flight until settled (a drain waits for it): every way out settles.
        self.live.enter(service_id)
        try:
            response = await self._dispatch(request, method, payload, streaming)
            if not response.streaming:
                # A JSON answer is read (bounded) so a failure before its end is an envelope.
                await response.prefetch(self.prefetch_bytes)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                code = exc.code if isinstance(exc, FiccError) else "cancelled"
                await self.relay.finish(request, code)
            raise
        return response.status, response

    def _models(self, view: LiveService) -> ResponseChunks:
        document = {
            "object": "list",
            "data": [{"id": view.alias, "object": "model", "created": 0, "owned_by": "ficc"}],
        }
        return ResponseChunks(
            status=200, content_type="application/json", pending=[dumps(document)]
        )

    async def _dispatch(
        self, request: Request, method: str, payload: bytes, streaming: bool
    ) -> ResponseChunks:
        headers = [
            ("content-type", "application/json"),
            ("accept", SSE if streaming else "application/json"),
        ]
        tried: set[str] = set()
        last: FiccError | None = None
        for attempt in range(self.max_attempts):
            await self.admission.slot(request, tried, last)
            if attempt == 0:
                request.queue_wait = trio.current_time() - request.started
                self.accounting.waited(request)
            replica = request.replica
            assert replica is not None
            failure: FiccError | None = None
            head = None
            try:
                head = await self.relay.open(request, method, headers, payload)
            except FINAL_REFUSALS:
                raise
            except FiccError as exc:
                failure = exc
            if isinstance(head, FiccError):
                # Authority, generation or deadline: no other replica would help.
                raise head
            if isinstance(head, ResponseHead) and not (
                head.status == 503 and attempt + 1 < self.max_attempts
            ):
                self.accounting.series(request.service_id, replica.key).requests.inc()
                return self.relay.response(request, head)
            if failure is None:
                failure = FiccError(
                    f"the engine answered 503 or its stream failed before answering: {head}",
                    code=getattr(head, "code", None) or "engine_unavailable",
                    status=503,
                )
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
        raise no_replica(request.view, f"{len(tried)} replicas failed before answering", last)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The gateway's background work until cancelled: reading the engines' load
        (:mod:`.scrape`) and forgetting replicas that left (:mod:`.scoring`)."""
        await self.router.run(task_status=task_status)

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
