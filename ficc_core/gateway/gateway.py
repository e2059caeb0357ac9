"""The inference gateway: authorise, route to a ready replica, relay its engine's answer.

One seam serves the HTTP routes and any future federation transport::

    status, chunks = await gateway.invoke(service_id, "/v1/chat/completions", body, actor)
    try:
        async for chunk in chunks:
            await transport.write(chunk)
    finally:
        await chunks.aclose()

``invoke`` raises a :class:`~ficc_core.errors.FiccError` (the one envelope) for
every refusal made before a response exists: authority, admission, body,
saturation, deadline, a failed engine. Otherwise it returns the engine's status
and a :class:`ResponseChunks`, which also carries ``content_type``, ``headers``
and ``deadline``.

**Routing.** Only the :class:`~ficc_core.inference.live.LiveService`'s ready
replicas of its current generation; the least loaded one with a free slot (ties
broken at random), each capped at the service's ``concurrency``. Without a free
slot a request waits in a bounded FIFO queue (``queue_factor`` x total capacity)
until a slot frees, the request deadline or ``max_queue_wait``. A request whose
replica fails before answering (open refused, node unavailable, the stream
failing before its response head, an engine 503) moves to another replica; once a
response head exists nothing is replayed.

**Authority throughout.** Before every read of the engine's stream, and at least
every ``recheck_interval`` seconds while a read waits, the gateway checks,
without SQLite: the credential is not revoked here and not expired
(:meth:`AuthService.still_valid`), the service's view is still the same
generation and not ``stopped``, and the request deadline. A failed check ends
the stream: an SSE response gets a last ``data: {"error": {...}}`` event; a
response not yet started gets the error envelope.

**Relay.** Chunks pass through as the endpoint action hands them over (at most
64 KiB each, four queued per stream): the engine is read only as fast as the
consumer takes chunks. A non-streamed (JSON) answer is read to its end (up to
``prefetch_bytes``) before ``invoke`` returns, so an engine failing or a deadline
passing before it is complete still gets the envelope. ``aclose()`` cancels the
engine request at once when the response did not end by itself.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import FiccError, Forbidden, InvalidRequest, PayloadTooLarge, Unauthenticated
from ..executor.types import BodyChunk, EndOfStream, ReadEvent, ResponseHead, StreamFailed
from ..strictjson import dumps, dumps_error, loads
from .errors import (
    CapabilityNotServed,
    DeadlineExceeded,
    EngineFailed,
    GenerationChanged,
    ModelNotFound,
    NoReadyReplica,
    NotForThisService,
    ServiceDraining,
    ServiceNotFound,
    ServiceSaturated,
    ServiceStopped,
    StreamInterrupted,
)

if TYPE_CHECKING:
    from ..auth import AuthService, Principal
    from ..config import Config
    from ..contributors import NodeRegistry
    from ..executor.protocol import EndpointAction
    from ..inference.live import LiveReplica, LiveService, LiveTable
    from ..metrics import Metrics

log = logging.getLogger("ficc.gateway")
usage_log = logging.getLogger("ficc.gateway.usage")

__all__ = ["PATHS", "Gateway", "ResponseChunks", "UsageRecord"]

#: The engine paths a client may invoke, with their HTTP method.
PATHS: Mapping[str, str] = {
    "/v1/models": "GET",
    "/v1/chat/completions": "POST",
    "/v1/embeddings": "POST",
}
INVOKE_SCOPE = "inference:invoke"
SSE = "text/event-stream"
#: Engine response headers passed on to the client (lower case).
PASSED_HEADERS = frozenset({"content-type"})
#: Executor refusals that say nothing about another replica: no retry, the client is told.
_FINAL_OPEN_CODES = frozenset({"path_not_admitted", "payload_too_large", "input_not_admitted"})
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


@attrs.frozen(kw_only=True)
class UsageRecord:
    """What one request used: tokens and time, for accounting.

    :ivar outcome: ``ok``, ``cancelled`` (the client went away) or an error code.
    :ivar queue_wait: seconds waited for a replica slot.
    :ivar ttfb: seconds from admission to the first response byte, or None.
    :ivar duration: seconds from admission to the end.
    """

    service_id: str
    generation: int
    replica: str
    node_id: str
    credential_id: str
    credential_kind: str
    path: str
    status: int
    outcome: str
    prompt_tokens: int | None
    completion_tokens: int | None
    queue_wait: float
    ttfb: float | None
    duration: float
    finished_at: float


@attrs.frozen
class _Series:
    """The labelled metric children of one (service, replica), looked up once."""

    inflight: Any
    requests: Any
    ttft: Any
    duration: Any


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


def _sse_error(error: FiccError) -> bytes:
    return b"data: " + dumps_error(error.envelope()) + b"\n\n"


def _usage(tail: bytes) -> tuple[int | None, int | None]:
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


class ResponseChunks:
    """The body of one relayed response: an async iterator of bytes with ``aclose()``.

    :ivar status: the engine's HTTP status.
    :ivar content_type: the response's content type.
    :ivar headers: the engine response headers passed on (only ``content-type``).
    :ivar streaming: whether it is a server-sent-event stream.
    :ivar deadline: the request deadline on the trio clock, or None.
    :ivar send_deadline: when sending this response must stop (the client not reading),
        on the trio clock: ``send_grace`` after the request deadline, or ``math.inf``.
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        status: int,
        content_type: str,
        headers: tuple[tuple[str, str], ...] = (),
        deadline: float | None = None,
        pending: list[bytes] | None = None,
        request: _Request | None = None,
    ) -> None:
        self._gateway = gateway
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.streaming = content_type.startswith(SSE)
        self.deadline = deadline
        self.send_deadline = math.inf if deadline is None else deadline + gateway.send_grace
        self._pending = deque(pending or ())
        self._request = request
        self._done = request is None or request.ended

    def __aiter__(self) -> ResponseChunks:
        return self

    def take_pending(self) -> list[bytes] | None:
        """The whole body when it is already read to its end (a prefetched JSON answer).

        Returns the chunks and leaves the iterator exhausted, or None (taking nothing)
        when more of the body is still to come from the engine.
        """
        if not self._done:
            return None
        pending = list(self._pending)
        self._pending.clear()
        return pending

    async def __anext__(self) -> bytes:
        if self._pending:
            return self._pending.popleft()
        request = self._request
        if self._done or request is None:
            raise StopAsyncIteration
        event = await self._gateway._next_event(request)
        if isinstance(event, BodyChunk):
            request.took(event.data)
            return event.data
        self._done = True
        if isinstance(event, EndOfStream):
            await self._gateway._finish(request, "ok")
            raise StopAsyncIteration
        error = (
            event
            if isinstance(event, FiccError)
            else EngineFailed(
                f"the engine's stream failed: {event.message}",
                details={"engine_code": getattr(event, "code", None)},
            )
        )
        await self._gateway._finish(request, error.code)
        if self.streaming:
            return _sse_error(error)
        raise StreamInterrupted(
            f"the response was cut after it started: {error.message}",
            details={"cause": error.code},
        )

    async def aclose(self) -> None:
        """End the response; cancel the engine request if it did not end by itself."""
        self._done = True
        self._pending.clear()
        if self._request is not None and not self._request.finished:
            await self._gateway._finish(self._request, "cancelled")

    def __del__(self) -> None:
        # A response that was never sent (the client went away between invoke and the
        # first chunk) must not hold its slot: release what needs no await.
        request = getattr(self, "_request", None)
        if request is not None and not request.finished:
            self._gateway._abandon(request)


@attrs.define(eq=False)
class _Request:
    """One admitted request on one replica, from open to finish."""

    service_id: str
    path: str
    actor: Principal
    view: LiveService
    started: float
    deadline: float
    queue_wait: float
    replica: LiveReplica | None = None
    endpoint: EndpointAction | None = None
    stream_id: str = ""
    status: int = 0
    opened: bool = False
    ended: bool = False  # the engine's stream ended (EndOfStream or StreamFailed)
    finished: bool = False
    holds_slot: bool = False
    first_byte: float | None = None
    prev_chunk: bytes = b""
    last_chunk: bytes = b""
    live_exit: Callable[[], None] | None = None

    def took(self, data: bytes) -> None:
        if self.first_byte is None:
            self.first_byte = trio.current_time()
        self.prev_chunk, self.last_chunk = self.last_chunk, data


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
    :param prefetch_bytes: how much of a non-streamed answer is read before ``invoke``
        returns; a longer body streams after that.
    :param usage_records: how many :class:`UsageRecord` are kept in :attr:`usage`.
    :param send_grace: seconds a response may take to send after the request deadline
        (the client reading the final error event): :attr:`ResponseChunks.send_deadline`,
        where an invoke path stops sending and closes the response, which frees the
        slot of a client that stopped reading. Without a request deadline, no bound.
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
    ) -> None:
        self.live = live
        self.contributors = contributors
        self.auth = auth
        self.metrics = metrics
        self.config = config
        self.queue_factor = queue_factor
        self.max_queue_wait = max_queue_wait
        self.recheck_interval = recheck_interval
        self.max_attempts = max(1, max_attempts)
        self.prefetch_bytes = prefetch_bytes
        self.send_grace = send_grace
        #: The latest requests' usage, oldest first.
        self.usage: deque[UsageRecord] = deque(maxlen=usage_records)
        #: Called with each :class:`UsageRecord` (e.g. to persist it); must not block.
        self.usage_sinks: list[Callable[[UsageRecord], None]] = []
        self._load: dict[str, int] = {}
        self._queues: dict[str, _Queue] = {}
        # Stream IDs: unique per gateway (a random prefix, then a counter), cheap to make.
        self._stream_prefix = f"g{uuid.uuid4().hex[:8]}-"
        self._stream_numbers = itertools.count(1)
        # Labelled metric series per (service, replica), made once.
        self._series: dict[tuple[str, str], _Series] = {}

    # -- the seam ------------------------------------------------------------------------------

    async def invoke(
        self, service_id: str, path: str, body: bytes | Mapping[str, Any], actor: Principal
    ) -> tuple[int, ResponseChunks]:
        """Serve one request of ``actor`` to ``path`` of service ``service_id``.

        Returns the engine's status and the response body chunks; raises the
        gateway's (or the executor's) :class:`FiccError` for a refusal.
        """
        started = trio.current_time()
        method = PATHS.get(path)
        if method is None:
            raise FiccError(
                f"{path!r} is not an inference route; use one of {', '.join(PATHS)}",
                code="route_not_found",
                status=404,
            )
        view = self._authorise(service_id, actor)
        if path == "/v1/models":
            return 200, self._models(view)
        if view.admission == "draining":
            self._refused(service_id, "service_draining")
            raise ServiceDraining(
                f"service {service_id!r} is draining: requests in flight finish, new ones "
                "are refused",
                details={"service": service_id},
            )
        if view.admission != "serving":
            self._refused(service_id, "service_stopped")
            raise ServiceStopped(
                f"service {service_id!r} is stopped; start it to serve requests",
                details={"service": service_id},
            )
        try:
            payload, streaming = self._prepare(view, path, body)
        except FiccError as exc:
            self._refused(service_id, exc.code)
            raise
        deadline = math.inf if view.request_deadline is None else started + view.request_deadline
        request = _Request(
            service_id=service_id,
            path=path,
            actor=actor,
            view=view,
            started=started,
            deadline=deadline,
            queue_wait=0.0,
        )
        context = self.live.request(service_id)
        context.__enter__()
        request.live_exit = lambda: context.__exit__(None, None, None)
        try:
            return await self._dispatch(request, method, payload, streaming)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                code = exc.code if isinstance(exc, FiccError) else "cancelled"
                await self._finish(request, code)
            raise

    # -- authority and the request ------------------------------------------------------------

    def _authorise(self, service_id: str, actor: Principal) -> LiveService:
        try:
            self.auth.check_valid(actor)
            if INVOKE_SCOPE not in actor.scopes:
                raise Forbidden(
                    f"this credential lacks the scope {INVOKE_SCOPE}",
                    code="missing_scope",
                    details={"required": [INVOKE_SCOPE], "missing": [INVOKE_SCOPE]},
                )
            if actor.service_id not in (None, service_id):
                raise NotForThisService(
                    "this credential is bound to another inference service",
                    details={"service": service_id},
                )
            view = self.live.get(service_id)
            if view is None or view.project_id != actor.project_id:
                raise ServiceNotFound(
                    f"no inference service {service_id!r} in this project",
                    details={"id": service_id},
                )
        except FiccError as exc:
            # Not labelled with the service: a client must not mint metric series.
            self._refused("", exc.code)
            raise
        return view

    def _models(self, view: LiveService) -> ResponseChunks:
        document = {
            "object": "list",
            "data": [{"id": view.alias, "object": "model", "created": 0, "owned_by": "ficc"}],
        }
        return ResponseChunks(
            self,
            status=200,
            content_type="application/json",
            pending=[dumps(document)],
        )

    def _prepare(
        self, view: LiveService, path: str, body: bytes | Mapping[str, Any]
    ) -> tuple[bytes, bool]:
        if path == "/v1/embeddings" and "embeddings" not in view.capabilities:
            raise CapabilityNotServed(
                f"service {view.id!r} does not serve embeddings (its engine's capabilities: "
                f"{', '.join(view.capabilities) or 'none declared'})",
                details={"capabilities": list(view.capabilities)},
            )
        if isinstance(body, Mapping):
            document: Any = dict(body)
        else:
            limit = self.config.max_body_bytes
            if len(body) > limit:
                raise PayloadTooLarge(
                    f"the request body is {len(body)} bytes; at most {limit} are accepted",
                    details={"limit": limit, "size": len(body)},
                )
            if not bytes(body).strip():
                raise InvalidRequest(
                    "the request body is empty; send a JSON object", code="invalid_json"
                )
            document = loads(body)
        if not isinstance(document, dict):
            raise InvalidRequest(
                "the request body must be a JSON object",
                details={"errors": [{"path": "$", "message": "expected object"}]},
            )
        model = document.get("model")
        if model is not None and model != view.alias:
            raise ModelNotFound(
                f"The model `{model}` does not exist: this service serves `{view.alias}`",
                details={"model": model, "served": view.alias},
            )
        # The client's bytes go to the engine unchanged unless something must be set.
        changed = model is None or not isinstance(body, bytes | bytearray | memoryview)
        document["model"] = view.alias
        stream = document.get("stream", False)
        if not isinstance(stream, bool):
            raise InvalidRequest(
                "`stream` must be a boolean",
                details={"errors": [{"path": "$.stream", "message": "expected boolean"}]},
            )
        if path == "/v1/chat/completions":
            if not isinstance(document.get("messages"), list):
                raise InvalidRequest(
                    "a chat completion needs a `messages` array",
                    details={"errors": [{"path": "$.messages", "message": "expected array"}]},
                )
            if stream:
                options = document.get("stream_options")
                if options is None:
                    options = {}
                if not isinstance(options, dict):
                    raise InvalidRequest(
                        "`stream_options` must be an object",
                        details={
                            "errors": [{"path": "$.stream_options", "message": "expected object"}]
                        },
                    )
                if options.get("include_usage") is not True:
                    document["stream_options"] = {**options, "include_usage": True}
                    changed = True
        elif path == "/v1/embeddings":
            stream = False
            if not isinstance(document.get("input"), str | list):
                raise InvalidRequest(
                    "an embeddings request needs an `input` string or array",
                    details={
                        "errors": [{"path": "$.input", "message": "expected string or array"}]
                    },
                )
        if not changed:
            return bytes(body), stream  # type: ignore[arg-type]
        try:
            return dumps(document), stream
        except (ValueError, TypeError) as exc:
            # Only a mapping handed to the seam can get here; bytes were decoded strictly.
            raise InvalidRequest(
                f"the request body cannot be sent as strict JSON: {type(exc).__name__}",
                code="invalid_json",
            ) from None

    # -- routing ---------------------------------------------------------------------------------

    def _pick(self, view: LiveService, tried: set[str]) -> LiveReplica | None:
        best: LiveReplica | None = None
        best_load, ties = 0, 0
        for replica in view.replicas:
            if replica.key in tried:
                continue
            load = self._load.get(replica.key, 0)
            if load >= view.concurrency:
                continue
            if best is None or load < best_load:
                best, best_load, ties = replica, load, 1
            elif load == best_load:
                ties += 1
                if random.random() * ties < 1:
                    best = replica
        return best

    def _series_of(self, service_id: str, key: str) -> _Series:
        series = self._series.get((service_id, key))
        if series is None:
            metrics = self.metrics
            series = self._series[(service_id, key)] = _Series(
                inflight=metrics.gateway_inflight.labels(service_id, key),
                requests=metrics.gateway_requests.labels(service_id, key),
                ttft=metrics.gateway_ttft.labels(service_id, key),
                duration=metrics.gateway_duration.labels(service_id, key),
            )
        return series

    def _take(self, request: _Request, replica: LiveReplica) -> None:
        self._load[replica.key] = self._load.get(replica.key, 0) + 1
        request.replica, request.holds_slot = replica, True
        self._series_of(request.service_id, replica.key).inflight.inc()

    def _release(self, request: _Request) -> None:
        if not request.holds_slot or request.replica is None:
            return
        request.holds_slot = False
        key = request.replica.key
        left = self._load.get(key, 1) - 1
        if left > 0:
            self._load[key] = left
        else:
            self._load.pop(key, None)
        self._series_of(request.service_id, key).inflight.dec()
        queue = self._queues.get(request.service_id)
        if queue is not None:
            queue.kick()

    def _current(self, request: _Request) -> LiveService:
        """The service's view for a request still waiting for a replica.

        Nothing was sent yet, so a request queued across a new generation is served
        by the new generation's replicas.
        """
        view = self.live.get(request.service_id)
        if view is None:
            raise ServiceNotFound(
                f"service {request.service_id!r} was removed", details={"id": request.service_id}
            )
        if view.admission == "stopped":
            raise ServiceStopped(f"service {request.service_id!r} stopped")
        request.view = view
        return view

    def _no_replica(self, view: LiveService, why: str, last: FiccError | None) -> NoReadyReplica:
        details: dict[str, Any] = {"service": view.id, "ready_replicas": len(view.replicas)}
        if last is not None:
            details["last_error"] = {"code": last.code, "message": last.message}
        return NoReadyReplica(
            f"service {view.id!r} has no ready replica to serve: {why}", details=details
        )

    async def _slot(self, request: _Request, tried: set[str], last: FiccError | None) -> None:
        """Take a slot on a replica not in ``tried``, waiting in the queue if need be."""
        view = self._current(request)
        if not [r for r in view.replicas if r.key not in tried]:
            why = "every replica failed before answering" if tried else "none is ready"
            raise self._no_replica(view, why, last)
        queue = self._queues.setdefault(request.service_id, _Queue())
        if not queue.waiters:
            replica = self._pick(view, tried)
            if replica is not None:
                self._take(request, replica)
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
        gauge = self.metrics.gateway_queued.labels(request.service_id)
        gauge.inc()
        limit = min(request.deadline, trio.current_time() + self.max_queue_wait)
        try:
            while True:
                now = trio.current_time()
                if now >= limit:
                    raise self._no_replica(
                        view, f"no slot freed within {now - request.started:.1f} s", last
                    )
                with trio.move_on_at(min(limit, now + self.recheck_interval)):
                    await waiter.event.wait()
                view = self._current(request)
                self._check_authority(request)
                if not [r for r in view.replicas if r.key not in tried]:
                    raise self._no_replica(view, "none is ready", last)
                replica = self._pick(view, tried)
                if replica is not None:
                    self._take(request, replica)
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

    async def _dispatch(
        self, request: _Request, method: str, payload: bytes, streaming: bool
    ) -> tuple[int, ResponseChunks]:
        headers = [
            ("content-type", "application/json"),
            ("accept", SSE if streaming else "application/json"),
        ]
        tried: set[str] = set()
        last: FiccError | None = None
        for attempt in range(self.max_attempts):
            await self._slot(request, tried, last)
            if attempt == 0:
                request.queue_wait = trio.current_time() - request.started
                self.metrics.gateway_queue_wait.labels(request.service_id).observe(
                    request.queue_wait
                )
            replica = request.replica
            assert replica is not None
            request.stream_id = f"{self._stream_prefix}{next(self._stream_numbers)}"
            request.opened = request.ended = False
            failure: FiccError | None = None
            head: ReadEvent | FiccError | None = None
            try:
                request.endpoint = self.contributors.endpoint(replica.node_id)
                with trio.move_on_at(request.deadline):
                    await request.endpoint.open(
                        replica.fence, request.stream_id, method, request.path, headers, payload
                    )
                    request.opened = True
                if not request.opened:
                    raise DeadlineExceeded("the request deadline passed before the engine answered")
                head = await self._next_event(request)
            except FiccError as exc:
                if isinstance(exc, DeadlineExceeded) or exc.code in _FINAL_OPEN_CODES:
                    raise
                failure = exc
            if isinstance(head, FiccError):
                # Authority, generation or deadline: no other replica would help.
                raise head
            if isinstance(head, ResponseHead) and not (
                head.status == 503 and attempt + 1 < self.max_attempts
            ):
                self._series_of(request.service_id, replica.key).requests.inc()
                return await self._answer(request, head)
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
            self.metrics.gateway_retries.labels(request.service_id, replica.key).inc()
            self.metrics.gateway_errors.labels(request.service_id, replica.key, failure.code).inc()
            await self._close_stream(request)
            self._release(request)
            tried.add(replica.key)
            last = failure
        raise self._no_replica(request.view, f"{len(tried)} replicas failed before answering", last)

    async def _answer(self, request: _Request, head: ResponseHead) -> tuple[int, ResponseChunks]:
        request.status = head.status
        headers = tuple((k.lower(), v) for k, v in head.headers if k.lower() in PASSED_HEADERS)
        content_type = dict(headers).get("content-type", "application/json")
        chunks = ResponseChunks(
            self,
            status=head.status,
            content_type=content_type,
            headers=headers,
            deadline=None if math.isinf(request.deadline) else request.deadline,
            request=request,
        )
        if chunks.streaming:
            return head.status, chunks
        # A JSON answer: read it (bounded) so a failure before its end is still an envelope.
        held = 0
        while held < self.prefetch_bytes:
            event = await self._next_event(request)
            if isinstance(event, BodyChunk):
                request.took(event.data)
                chunks._pending.append(event.data)
                held += len(event.data)
            elif isinstance(event, EndOfStream):
                chunks._done = True
                await self._finish(request, "ok" if head.status < 400 else f"engine_{head.status}")
                break
            elif isinstance(event, FiccError):
                raise event
            else:
                raise EngineFailed(
                    f"the engine's stream failed before the answer was complete: "
                    f"{getattr(event, 'message', event)}",
                    details={"engine_code": getattr(event, "code", None)},
                )
        return head.status, chunks

    # -- reading, with authority re-checked ------------------------------------------------------

    def _check_authority(self, request: _Request) -> None:
        actor = request.actor
        if not self.auth.still_valid(actor):
            self.auth.check_valid(actor)
            raise Unauthenticated("the credential is no longer valid", code="credential_revoked")

    def _problem(self, request: _Request) -> FiccError | None:
        """Why the request must end now, or None (no I/O: it runs before every read)."""
        if not self.auth.still_valid(request.actor):
            try:
                self.auth.check_valid(request.actor)
            except FiccError as exc:
                return exc
            return Unauthenticated("the credential is no longer valid", code="credential_revoked")
        view = self.live.get(request.service_id)
        if view is not request.view:
            if view is None:
                return ServiceStopped(f"service {request.service_id!r} was removed")
            if view.generation != request.view.generation:
                return GenerationChanged(
                    f"service {request.service_id!r} moved to generation {view.generation} "
                    "while the response streamed; send the request again",
                    details={"generation": view.generation},
                )
            if view.admission == "stopped":
                return ServiceStopped(
                    f"service {request.service_id!r} stopped while the response streamed"
                )
            request.view = view
        if trio.current_time() >= request.deadline:
            return DeadlineExceeded(
                f"the request ran past the service's deadline of {request.view.request_deadline} s",
                details={"request_deadline": request.view.request_deadline},
            )
        return None

    async def _next_event(self, request: _Request) -> ReadEvent | FiccError:
        """The stream's next event, or the error that ends it (authority, generation, deadline)."""
        endpoint, replica = request.endpoint, request.replica
        assert endpoint is not None and replica is not None
        while True:
            problem = self._problem(request)
            if problem is not None:
                return problem
            wake = min(request.deadline, trio.current_time() + self.recheck_interval)
            with trio.move_on_at(wake):
                try:
                    event = await endpoint.read(replica.fence, request.stream_id)
                except FiccError as exc:
                    request.ended = True
                    return StreamFailed(code=exc.code, message=exc.message)
                if isinstance(event, EndOfStream | StreamFailed):
                    request.ended = True
                return event

    # -- the end of a request ---------------------------------------------------------------------

    async def _close_stream(self, request: _Request) -> None:
        if not request.opened or request.ended or request.endpoint is None:
            return
        request.ended = True
        replica = request.replica
        assert replica is not None
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                await request.endpoint.cancel(replica.fence, request.stream_id)
            except FiccError:
                pass  # the stream or attempt is already gone

    async def _finish(self, request: _Request, outcome: str) -> None:
        """Close the engine stream (if open), free the slot, account the request. Idempotent."""
        if request.finished:
            return
        await self._close_stream(request)
        self._settle(request, outcome)

    def _abandon(self, request: _Request) -> None:
        """Settle a request nobody will close (no await: the engine stream idles out)."""
        if not request.finished:
            self._settle(request, "abandoned")

    def _settle(self, request: _Request, outcome: str) -> None:
        if request.finished:
            return
        request.finished = True
        self._release(request)
        if request.live_exit is not None:
            exit_, request.live_exit = request.live_exit, None
            exit_()
        replica = request.replica
        if replica is None:
            if outcome not in ("ok", "cancelled"):
                self.metrics.gateway_errors.labels(request.service_id, "", outcome).inc()
            return
        key, now = replica.key, trio.current_time()
        service = request.service_id
        if outcome not in ("ok", "cancelled"):
            self.metrics.gateway_errors.labels(service, key, outcome).inc()
        ttfb = None if request.first_byte is None else request.first_byte - request.started
        series = self._series_of(service, key)
        if ttfb is not None:
            series.ttft.observe(ttfb)
        duration = now - request.started
        series.duration.observe(duration)
        prompt, completion = _usage(request.prev_chunk + request.last_chunk)
        if prompt:
            self.metrics.gateway_tokens.labels(service, key, "prompt").inc(prompt)
        if completion:
            self.metrics.gateway_tokens.labels(service, key, "completion").inc(completion)
        record = UsageRecord(
            service_id=service,
            generation=request.view.generation,
            replica=key,
            node_id=replica.node_id,
            credential_id=request.actor.id,
            credential_kind=request.actor.kind,
            path=request.path,
            status=request.status,
            outcome=outcome,
            prompt_tokens=prompt,
            completion_tokens=completion,
            queue_wait=request.queue_wait,
            ttfb=ttfb,
            duration=duration,
            finished_at=time.time(),
        )
        self.usage.append(record)
        usage_log.debug("%s", record)
        for sink in self.usage_sinks:
            try:
                sink(record)
            except Exception:
                log.exception("a usage sink failed")

    def _refused(self, service_id: str, code: str) -> None:
        self.metrics.gateway_errors.labels(service_id, "", code).inc()

    # -- what operators and tests look at -------------------------------------------------------

    def load(self, replica_key: str) -> int:
        """Requests in flight on the replica with ``replica_key`` (its attempt ID)."""
        return self._load.get(replica_key, 0)

    def queued(self, service_id: str) -> int:
        """Requests of ``service_id`` waiting for a slot."""
        queue = self._queues.get(service_id)
        return 0 if queue is None else len(queue.waiters)
