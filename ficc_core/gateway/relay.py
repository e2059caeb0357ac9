"""Relay: the engine's stream to the client, with authority re-checked before every read.

Chunks pass through as the endpoint action hands them over (at most 64 KiB each,
four queued per stream): the engine is read only as fast as the consumer takes
chunks. A non-streamed (JSON) answer is read to its end (up to ``prefetch_bytes``)
before the response is handed out, so an engine failing or a deadline passing
before it is complete still gets the envelope.

A :class:`ResponseChunks` is an ``async with`` resource: leaving it (or
``aclose()``) cancels the engine request if the response did not end by itself,
frees the replica slot and accounts the request.

Every wait for the engine has its own bound (:class:`Timeouts`, the ``timeout_*``
settings), kept on the request as the one bound its next event must beat: the
open (``dial``), a stream's head (``response_header``, a liveness check: heads
come before generation), a non-streamed answer as a whole (``generation``: its
head comes only with the finished answer), a stream's first chunk after the head
(``first_token``) and each later chunk (``idle``). A read past its bound returns
:class:`EngineTimeout` naming it; the request deadline is checked beside it.
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs
import trio

from ..base.errors import FiccError
from ..base.strictjson import dumps_error
from ..executor.types import BodyChunk, EndOfStream, ReadEvent, ResponseHead, StreamFailed
from .errors import DeadlineExceeded, EngineFailed, EngineTimeout, StreamInterrupted

if TYPE_CHECKING:
    from types import TracebackType

    from ..config import Config
    from ..contributors import NodeRegistry
    from ..executor.protocol import EndpointAction
    from ..routing.live import LiveReplica
    from ..schema import Fence
    from .checks import RequestChecks
    from .request import Request

SSE = "text/event-stream"
#: Engine response headers passed on to the client (lower case).
PASSED_HEADERS = frozenset({"content-type"})


def _bound(seconds: float) -> float:
    return seconds if seconds > 0 else math.inf


@attrs.frozen(kw_only=True)
class Timeouts:
    """The bounds of the gateway's waits for an engine, in seconds (``math.inf``: none).

    See the module docs and the ``timeout_*`` settings for what each bounds.
    """

    dial: float = math.inf
    response_header: float = math.inf
    generation: float = math.inf
    first_token: float = math.inf
    idle: float = math.inf

    @classmethod
    def from_config(cls, config: Config) -> Timeouts:
        """The bounds the settings give (0 there means none)."""
        return cls(
            dial=_bound(config.timeout_dial),
            response_header=_bound(config.timeout_response_header),
            generation=_bound(config.timeout_generation),
            first_token=_bound(config.timeout_first_token),
            idle=_bound(config.timeout_idle),
        )


#: What the engine did not do in time, by bound (the timeout's message).
_WAITED_FOR = {
    "timeout_dial": "accept the request",
    "timeout_response_header": "send its response head",
    "timeout_generation": "finish its answer",
    "timeout_first_token": "send the stream's first chunk",
    "timeout_idle": "send the stream's next chunk",
}


def _sse_error(error: FiccError) -> bytes:
    return b"data: " + dumps_error(error.envelope()) + b"\n\n"


def _failed(event: ReadEvent, what: str) -> EngineFailed:
    if isinstance(event, StreamFailed):
        return EngineFailed(
            f"the engine's stream failed{what}: {event.message}",
            details={"engine_code": event.code},
        )
    return EngineFailed(f"the engine's stream failed{what}: {event}", details={"engine_code": None})


@runtime_checkable
class HoldsEvents(Protocol):
    """An endpoint action that says how many events it holds queued for a stream, read
    without waiting (the executor's in-process endpoint and the node link's relay):
    :meth:`Relay.next_event` then takes a queued event without a cancel scope. Endpoint
    actions need not implement it (:class:`~ficc_core.executor.protocol.EndpointAction`
    does not declare it)."""

    def held(self, fence: Fence, stream_id: str) -> int:
        """Events queued for ``stream_id`` of ``fence``'s attempt now."""
        ...


#: Per endpoint action class, whether it is a :class:`HoldsEvents` (checked once: a
#: runtime protocol check costs microseconds).
_HOLDS_EVENTS: dict[type, bool] = {}


def _held_of(endpoint: EndpointAction) -> Callable[[Fence, str], int] | None:
    """``endpoint.held`` where its class implements :class:`HoldsEvents`, else None."""
    kind = type(endpoint)
    holds = _HOLDS_EVENTS.get(kind)
    if holds is None:
        holds = _HOLDS_EVENTS[kind] = isinstance(endpoint, HoldsEvents)
    return endpoint.held if holds else None  # type: ignore[attr-defined]


@attrs.define(eq=False, slots=True)
class Stream:
    """One engine stream of a request's attempt: the relay's own state, made by
    :meth:`Relay.open` and read and written by the relay alone.

    :ivar stream_id: the stream's ID at the endpoint (unique per gateway).
    :ivar endpoint: the endpoint action of the replica's node.
    :ivar held: the endpoint's ``held`` (:class:`HoldsEvents`), or None.
    :ivar wait_bound: the timeout setting the stream's next event must beat, or "".
    :ivar wait_until: when that bound passes, on the trio clock (``math.inf``: none).
    :ivar opened: the endpoint accepted the open.
    :ivar ended: the stream ended by itself (``EndOfStream`` or ``StreamFailed``), or
        was cancelled.
    :ivar first_byte: when its first body chunk was relayed, on the trio clock.
    :ivar prev_chunk: the body chunk before the last one (accounting reads the usage
        from the last two).
    :ivar last_chunk: the last body chunk relayed.
    """

    stream_id: str
    endpoint: EndpointAction
    held: Callable[[Fence, str], int] | None
    wait_bound: str
    wait_until: float
    opened: bool = False
    ended: bool = False
    first_byte: float | None = None
    prev_chunk: bytes = b""
    last_chunk: bytes = b""

    def took(self, data: bytes) -> None:
        """Note a body chunk relayed: the first byte's time, the last two chunks (usage)."""
        if self.first_byte is None:
            self.first_byte = trio.current_time()
        self.prev_chunk, self.last_chunk = self.last_chunk, data

    def forget(self) -> None:
        """Forget what was relayed (nothing of it reached the client: another replica
        is tried, or the request fails with no answer)."""
        self.first_byte, self.prev_chunk, self.last_chunk = None, b"", b""


class ResponseChunks:
    """One relayed response: an async iterator of body chunks, and an ``async with`` resource.

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
        *,
        status: int,
        content_type: str,
        headers: tuple[tuple[str, str], ...] = (),
        deadline: float | None = None,
        send_deadline: float = math.inf,
        pending: Iterable[bytes] = (),
        relay: Relay | None = None,
        request: Request | None = None,
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.streaming = content_type.startswith(SSE)
        self.deadline = deadline
        self.send_deadline = send_deadline
        self._pending = deque(pending)
        self._relay = relay
        self._request = request
        #: The engine stream relayed (its tally of what was relayed: accounting's input).
        self._stream = None if request is None else request.stream
        self._done = request is None or request.ended

    @property
    def request(self) -> Request | None:
        """The gateway request it answers (None for an answer made without one)."""
        return self._request

    async def __aenter__(self) -> ResponseChunks:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> ResponseChunks:
        return self

    async def prefetch(self, limit: int) -> None:
        """Read the body up to its end or ``limit`` bytes, to hand it out whole.

        Raises the request's refusal (the envelope) when the stream fails or the
        request must end before the body is complete; the response then stays open
        for its owner to close.
        """
        request, relay, stream = self._request, self._relay, self._stream
        assert request is not None and relay is not None and stream is not None
        held = 0
        while held < limit:
            event = await relay.next_event(request)
            if isinstance(event, BodyChunk):
                stream.took(event.data)
                self._pending.append(event.data)
                held += len(event.data)
            elif isinstance(event, EndOfStream):
                self._done = True
                status = request.status
                await relay.finish(request, "ok" if status < 400 else f"engine_{status}")
                return
            elif isinstance(event, FiccError):
                raise event
            else:
                raise _failed(event, " before the answer was complete")

    async def first_chunk(self) -> None:
        """Read a stream's first chunk and hold it, so a stream that fails or stalls
        before it (``timeout_first_token``) is still a failure before anything reached
        the client: another replica may be tried.

        Raises like :meth:`prefetch`.
        """
        request, relay, stream = self._request, self._relay, self._stream
        assert request is not None and relay is not None and stream is not None
        event = await relay.next_event(request)
        if isinstance(event, BodyChunk):
            stream.took(event.data)
            self._pending.append(event.data)
        elif isinstance(event, EndOfStream):
            self._done = True
            await relay.finish(request, "ok")
        elif isinstance(event, FiccError):
            raise event
        else:
            raise _failed(event, " before its first chunk")

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
        request = self._request
        hide = request is not None and request.hide_usage
        while self._pending:
            data = self._pending.popleft()
            if hide:
                data = without_usage(data)
            if data:
                return data
        relay, stream = self._relay, self._stream
        if self._done or request is None or relay is None or stream is None:
            raise StopAsyncIteration
        event = await relay.next_event(request)
        while isinstance(event, BodyChunk):
            stream.took(event.data)  # accounting reads the usage, hidden or not
            data = without_usage(event.data) if hide else event.data
            if data:
                return data
            event = await relay.next_event(request)
        self._done = True
        if isinstance(event, EndOfStream):
            await relay.finish(request, "ok")
            raise StopAsyncIteration
        error = event if isinstance(event, FiccError) else _failed(event, "")
        await relay.finish(request, error.code)
        if self.streaming:
            return _sse_error(error)
        raise StreamInterrupted(
            f"the response was cut after it started: {error.message}",
            details={"cause": error.code},
        )

    async def aclose(self) -> None:
        """End the response: cancel the engine request if it did not end by itself,
        free the slot, account the request. Idempotent."""
        self._done = True
        self._pending.clear()
        request = self._request
        if request is not None and not request.finished and self._relay is not None:
            await self._relay.finish(request, "cancelled")


class Relay:
    """Opens, reads and cancels engine streams through the nodes' endpoint actions.

    :param contributors: the node registry (``endpoint(node_id)``).
    :param checks: what is re-checked before every read (:meth:`RequestChecks.problem`).
    :param settle: called once when a request ends (free its slot, account it).
    :param recheck_interval: how often a waiting read re-checks, in seconds.
    :param send_grace: seconds a response may take to send after the request deadline.
    :param timeouts: the bounds of each wait for the engine.
    :param timed_out: called with the request and the bound when a wait runs past it.
    """

    def __init__(
        self,
        contributors: NodeRegistry,
        checks: RequestChecks,
        *,
        settle: Callable[[Request, str], None],
        recheck_interval: float,
        send_grace: float,
        timeouts: Timeouts | None = None,
        timed_out: Callable[[Request, str], None] = lambda request, bound: None,
    ) -> None:
        self.contributors = contributors
        self.checks = checks
        self.settle = settle
        self.recheck_interval = recheck_interval
        self.send_grace = send_grace
        self.timeouts = Timeouts() if timeouts is None else timeouts
        self.timed_out = timed_out
        # Stream IDs: unique per gateway (a random prefix, then a counter), cheap to make.
        self._stream_prefix = f"g{uuid.uuid4().hex[:8]}-"
        self._stream_numbers = itertools.count(1)

    async def open(
        self, request: Request, method: str, headers: list[tuple[str, str]], payload: bytes
    ) -> ReadEvent | FiccError:
        """Open a stream on the request's replica; return its first event (its head, mostly).

        Raises the endpoint's refusal of the open, :class:`DeadlineExceeded`, or
        :class:`EngineTimeout` (``timeout_dial``).
        """
        replica = request.replica
        assert replica is not None
        timeouts = self.timeouts
        endpoint = self.contributors.endpoint(replica.node_id)
        stream = request.stream = Stream(
            f"{self._stream_prefix}{next(self._stream_numbers)}",
            endpoint,
            _held_of(endpoint),
            "timeout_dial",
            trio.current_time() + timeouts.dial,
        )
        with trio.move_on_at(min(request.deadline, stream.wait_until)):
            await endpoint.open(
                replica.fence, stream.stream_id, method, request.path, headers, payload
            )
            stream.opened = True
        if not stream.opened:
            if trio.current_time() < request.deadline:
                raise self._timeout(request, stream)
            raise DeadlineExceeded("the request deadline passed before the engine answered")
        if request.streaming:
            stream.wait_bound = "timeout_response_header"
            stream.wait_until = trio.current_time() + timeouts.response_header
        else:
            stream.wait_bound = "timeout_generation"
            stream.wait_until = trio.current_time() + timeouts.generation
        return await self.next_event(request)

    async def fetch(
        self, replica: LiveReplica, path: str, body: bytes, *, limit: int
    ) -> tuple[int, bytes]:
        """POST one small JSON request to ``replica``'s engine outside any slot (its
        tokenizer route): its status and body. The caller bounds the wait.

        Raises the endpoint's refusal, or :class:`EngineFailed` when the stream fails
        or the body is longer than ``limit`` bytes.
        """
        endpoint = self.contributors.endpoint(replica.node_id)
        fence, stream_id = replica.fence, f"{self._stream_prefix}{next(self._stream_numbers)}"
        headers = [("content-type", "application/json"), ("accept", "application/json")]
        await endpoint.open(fence, stream_id, "POST", path, headers, body)
        ended = False
        try:
            head = await endpoint.read(fence, stream_id)
            if not isinstance(head, ResponseHead):
                ended = True
                raise _failed(head, " before answering")
            chunks, size = [], 0
            while True:
                event = await endpoint.read(fence, stream_id)
                if isinstance(event, BodyChunk):
                    size += len(event.data)
                    if size > limit:
                        raise EngineFailed(f"the engine's answer to {path} is over {limit} bytes")
                    chunks.append(event.data)
                    continue
                ended = True
                if isinstance(event, EndOfStream):
                    return head.status, b"".join(chunks)
                raise _failed(event, " mid-answer")
        finally:
            if not ended:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    try:
                        await endpoint.cancel(fence, stream_id)
                    except FiccError:
                        pass  # the stream or attempt is already gone

    def _timeout(self, request: Request, stream: Stream) -> EngineTimeout:
        bound = stream.wait_bound
        seconds = attrs.asdict(self.timeouts)[bound.removeprefix("timeout_")]
        self.timed_out(request, bound)
        return EngineTimeout(bound, seconds, _WAITED_FOR[bound])

    def response(self, request: Request, head: ResponseHead) -> ResponseChunks:
        """The response to relay for ``head``, the stream's first event."""
        request.status = head.status
        headers = tuple((k.lower(), v) for k, v in head.headers if k.lower() in PASSED_HEADERS)
        deadline = None if math.isinf(request.deadline) else request.deadline
        return ResponseChunks(
            status=head.status,
            content_type=dict(headers).get("content-type", "application/json"),
            headers=headers,
            deadline=deadline,
            send_deadline=math.inf if deadline is None else deadline + self.send_grace,
            relay=self,
            request=request,
        )

    async def next_event(self, request: Request) -> ReadEvent | FiccError:
        """The stream's next event, or the error that ends it (authority, generation,
        deadline, a timeout)."""
        stream, replica = request.stream, request.replica
        assert stream is not None and replica is not None
        while True:
            problem = self.checks.problem(request)
            if problem is not None:
                return problem
            now = trio.current_time()
            if now >= stream.wait_until:
                return self._timeout(request, stream)
            try:
                event = await self._read(request.deadline, stream, replica.fence, now)
            except FiccError as exc:
                stream.ended = True
                return StreamFailed(code=exc.code, message=exc.message)
            if event is None:
                continue  # the wait reached a bound or its re-check
            if isinstance(event, EndOfStream | StreamFailed):
                stream.ended = True
            elif request.streaming:
                # A non-streamed answer keeps its one generation bound to the end.
                if isinstance(event, ResponseHead):
                    stream.wait_bound = "timeout_first_token"
                    stream.wait_until = trio.current_time() + self.timeouts.first_token
                else:
                    stream.wait_bound = "timeout_idle"
                    stream.wait_until = trio.current_time() + self.timeouts.idle
            return event

    async def _read(
        self, deadline: float, stream: Stream, fence: Fence, now: float
    ) -> ReadEvent | None:
        """The stream's next event, or None when waiting for it reached the request's
        ``deadline``, its wait bound or the next re-check first."""
        held = stream.held
        if held is not None and held(fence, stream.stream_id):
            # Queued already: taken without a cancel scope (one costs about 7 µs to
            # enter and leave, and most events of an answer arrive with the one before).
            return await stream.endpoint.read(fence, stream.stream_id)
        with trio.move_on_at(min(deadline, stream.wait_until, now + self.recheck_interval)):
            return await stream.endpoint.read(fence, stream.stream_id)
        return None

    async def cancel(self, request: Request) -> None:
        """Cancel the engine request of a stream that is open and did not end by itself."""
        stream = request.stream
        if stream is None or not stream.opened or stream.ended:
            return
        stream.ended = True
        replica = request.replica
        assert replica is not None
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                await stream.endpoint.cancel(replica.fence, stream.stream_id)
            except FiccError:
                pass  # the stream or attempt is already gone

    async def finish(self, request: Request, outcome: str) -> None:
        """Cancel the engine stream (if open), then settle the request. Idempotent."""
        if request.finished:
            return
        await self.cancel(request)
        if not request.finished:
            self.settle(request, outcome)


#: What marks a stream's usage event: OpenAI's (and the engines') usage chunk is the one
#: with no choices (compact JSON, as llama.cpp and vLLM write it, or spaced).
_NO_CHOICES = (b'"choices":[]', b'"choices": []')


def without_usage(data: bytes) -> bytes:
    """``data`` (SSE bytes) without the usage event, the chunk whose ``choices`` is empty,
    for a client that did not ask for it (``stream_options.include_usage``): the gateway
    asks the engine for it to account the request. An event split across two reads is
    left as it is (never cut in half)."""
    at = data.find(_NO_CHOICES[0])
    if at < 0:
        at = data.find(_NO_CHOICES[1])
        if at < 0:
            return data
    start = data.rfind(b"data:", 0, at)
    end = data.find(b"\n\n", at)
    if start < 0 or end < 0 or (start and data[start - 1 : start] != b"\n"):
        return data
    return data[:start] + data[end + 2 :]
