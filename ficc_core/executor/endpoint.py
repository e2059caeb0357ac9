"""The fenced endpoint action providers share: bounded HTTP/1.1 streams to an engine.

A gateway never connects to an engine itself. It calls ``open`` with a fence, a
stream ID and one request, then ``read`` until the end. :class:`EndpointStreams`
implements that for every provider: it checks the fence and the job's endpoint
contract, passes only allow-listed headers, speaks HTTP/1.1 to the engine's socket
(:mod:`~ficc_core.http1.engine_codec`) and hands the response back as a
:class:`ResponseHead`, body chunks of at most 64 KiB, then :class:`EndOfStream` or
:class:`StreamFailed`.

Each stream holds at most four events. While they are unread, the task that
reads from the engine does not read, so the engine's writes block in the kernel:
real backpressure, bounded memory (:mod:`~ficc_core.executor.event_queue`; the
HTTP/1.1 exchanges and kept-alive connections are :mod:`~ficc_core.executor.engine_http`).
``cancel`` closes the engine connection before it returns. Streams per attempt are
bounded and a stream nobody reads for ``idle_timeout`` seconds is closed.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import trio

from ..http1.engine_codec import EngineProtocolError
from .engine_http import (
    CHUNK_SIZE,
    STALE,
    Connector,
    EngineConnection,
    EnginePool,
    exchange,
    request_head,
    request_once,
)
from .engine_pull import Pull, start_now
from .errors import (
    EngineUnavailable,
    InputNotAdmitted,
    PathNotAdmitted,
    PayloadTooLarge,
    StaleFence,
    StreamExists,
    TooManyStreams,
    UnknownAttempt,
    UnknownStream,
)
from .event_queue import EventQueue
from .types import ReadEvent, StreamFailed, is_terminal

if TYPE_CHECKING:
    from ..schema import EndpointContract, Fence
    from .protocol import Headers

__all__ = [
    "ALLOWED_REQUEST_HEADERS",
    "CHUNK_SIZE",
    "QUEUE_CHUNKS",
    "EndpointStreams",
    "check_fence",
]

#: The most events one stream holds before the engine feels backpressure.
QUEUE_CHUNKS = 4
#: The only request headers that reach an engine (lower case). Credentials,
#: cookies, hosts and hop-by-hop headers never do.
ALLOWED_REQUEST_HEADERS = frozenset({"accept", "content-type", "x-request-id"})
#: The methods the endpoint action sends.
ALLOWED_METHODS = frozenset({"GET", "POST"})
_STREAM_ID_MAX = 128


def check_fence(known: Mapping[str, Fence], fence: Fence) -> None:
    """Raise :class:`UnknownAttempt` or :class:`StaleFence` unless ``fence`` is current."""
    current = known.get(fence.attempt_id)
    if current is None:
        raise UnknownAttempt(
            f"no attempt {fence.attempt_id!r} runs on this executor",
            details={"attempt_id": fence.attempt_id},
        )
    if current != fence:
        raise StaleFence(
            f"the fence for attempt {fence.attempt_id!r} is stale: it carries generation "
            f"{fence.generation} and plan {fence.plan_digest}, the attempt runs generation "
            f"{current.generation} and plan {current.plan_digest}",
            details={
                "attempt_id": fence.attempt_id,
                "generation": fence.generation,
                "current_generation": current.generation,
            },
        )


#: Open streams per attempt, unless a provider is told otherwise. The gateway caps each
#: replica at its service's ``concurrency`` and queues the rest; this bounds what one
#: attempt may buffer (four 64 KiB chunks per stream) as the relay bounds a node.
DEFAULT_MAX_STREAMS = 256


@attrs.define(eq=False)
class _Stream:
    id: str
    queue: EventQueue = attrs.field(factory=lambda: EventQueue(QUEUE_CHUNKS))
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    finished: trio.Event = attrs.field(factory=trio.Event)
    #: The answer its readers read from the engine themselves (:mod:`.engine_pull`),
    #: while no task moves it; None once it ended, or when a task does.
    pull: Pull | None = None


@attrs.define(eq=False)
class _Attempt:
    fence: Fence
    contract: EndpointContract
    engine: EnginePool
    inputs: dict[str, str] = attrs.field(factory=dict)
    streams: dict[str, _Stream] = attrs.field(factory=dict)


class EndpointStreams:
    """The endpoint action of one executor: fenced, bounded streams to its engines.

    Start it with ``await nursery.start(streams.run)``; a provider then calls
    :meth:`attach` for each attempt whose engine is reachable and :meth:`detach`
    when the attempt ends.

    :param max_streams: open streams allowed per attempt.
    :param idle_timeout: seconds a stream may go without a ``read`` before it is closed.
    :param max_body: the largest request body ``open`` accepts, in bytes.
    """

    def __init__(
        self,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        idle_timeout: float = 60.0,
        max_body: int = 16 * 1024 * 1024,
    ) -> None:
        self.max_streams = max_streams
        self.idle_timeout = idle_timeout
        self.max_body = max_body
        self._attempts: dict[str, _Attempt] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the stream tasks and expire idle streams until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._expire_idle)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    def attach(
        self,
        fence: Fence,
        contract: EndpointContract,
        connect: Connector,
        inputs: Mapping[str, str] | None = None,
    ) -> None:
        """Make the engine of the attempt ``fence`` names reachable through the action.

        :param inputs: the job's admitted inputs, ID -> host path; only these can be
            streamed to the engine as a request body (``open(..., input_id=...)``).
        """
        self._attempts[fence.attempt_id] = _Attempt(
            fence, contract, EnginePool(connect), dict(inputs or {})
        )

    def detach(self, attempt_id: str) -> None:
        """Close every stream of the attempt and forget it."""
        attempt = self._attempts.pop(attempt_id, None)
        if attempt is None:
            return
        self._drop(attempt.engine.close())
        for stream in list(attempt.streams.values()):
            self._close(
                attempt, stream, StreamFailed(code="attempt_ended", message="the attempt ended")
            )

    def held(self, fence: Fence, stream_id: str) -> int:
        """Return how many events the stream holds now (never more than four)."""
        return len(self._stream(fence, stream_id)[1].queue)

    async def open(
        self,
        fence: Fence,
        stream_id: str,
        method: str,
        path: str,
        headers: Headers,
        body: bytes = b"",
        *,
        input_id: str | None = None,
    ) -> None:
        """Check the request and start sending it to the engine as stream ``stream_id``.

        With ``input_id``, the body is that admitted input's file, streamed by the
        executor itself (the engine's native model-blob upload route); ``body``
        must then be empty. Any other ID, or an input that is not a regular file,
        is refused with ``input_not_admitted``.
        """
        attempt = self._attempt(fence)
        if not isinstance(stream_id, str) or not 0 < len(stream_id) <= _STREAM_ID_MAX:
            raise UnknownStream(
                "a stream ID is 1 to 128 characters", details={"stream_id": stream_id}
            )
        method = method.upper()
        route = path.split("?", 1)[0]
        if method not in ALLOWED_METHODS:
            raise PathNotAdmitted(
                f"method {method} is not admitted; the endpoint action sends GET and POST",
                details={"method": method, "path": route},
            )
        if not attempt.contract.admits(route):
            raise PathNotAdmitted(
                f"path {route!r} is not in the job's endpoint contract "
                f"(admitted: {', '.join(attempt.contract.paths)})",
                details={"path": route, "admitted": list(attempt.contract.paths)},
            )
        if len(body) > self.max_body:
            raise PayloadTooLarge(
                f"the request body has {len(body)} bytes; at most {self.max_body} are admitted"
            )
        upload: tuple[str, int] | None = None
        if input_id is not None:
            upload = await self._admitted_input(attempt, input_id, method, body)
        if stream_id in attempt.streams:
            raise StreamExists(
                f"stream {stream_id!r} is already open on attempt {fence.attempt_id!r}",
                details={"stream_id": stream_id},
            )
        if len(attempt.streams) >= self.max_streams:
            raise TooManyStreams(
                f"attempt {fence.attempt_id!r} already has {self.max_streams} open streams; "
                "read one to its end or cancel it first",
                details={"max_streams": self.max_streams},
            )
        if self._nursery is None:
            raise EngineUnavailable("the executor's endpoint action is not running")
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        passed = [
            (name.lower(), value)
            for name, value in pairs
            if name.lower() in ALLOWED_REQUEST_HEADERS
        ]
        size = len(body) if upload is None else upload[1]
        try:
            head = request_head(
                method, path, passed, size, upload=upload is not None, keep_alive=True
            )
        except EngineProtocolError as exc:
            raise PathNotAdmitted(
                f"the request cannot be sent to the engine: {exc}", details={"path": route}
            ) from None
        stream = _Stream(stream_id)
        attempt.streams[stream_id] = stream
        connection, sent = None, 0
        if upload is None:
            pull, connection, sent = start_now(attempt.engine, head + body, self._drop)
            if pull is not None:
                stream.pull = pull
                return
        self._nursery.start_soon(
            self._pump, attempt, stream, head, bytes(body), upload, connection, sent
        )

    async def _admitted_input(
        self, attempt: _Attempt, input_id: str, method: str, body: bytes
    ) -> tuple[str, int]:
        source = attempt.inputs.get(input_id)
        if source is None:
            raise InputNotAdmitted(
                f"input {input_id!r} is not one of this job's inputs "
                f"(admitted: {', '.join(sorted(attempt.inputs)) or 'none'})",
                details={"input_id": input_id},
            )
        if method != "POST" or body:
            raise InputNotAdmitted(
                "an input is uploaded with POST and an empty body; the executor streams it",
                details={"input_id": input_id},
            )
        try:
            info = await trio.to_thread.run_sync(os.stat, source)
        except OSError as exc:
            raise InputNotAdmitted(
                f"input {input_id!r} cannot be read: {exc.strerror}", details={"input_id": input_id}
            ) from None
        if not stat.S_ISREG(info.st_mode):
            raise InputNotAdmitted(
                f"input {input_id!r} is a directory, not a file; only files can be uploaded",
                details={"input_id": input_id},
            )
        return source, info.st_size

    async def read(self, fence: Fence, stream_id: str) -> ReadEvent:
        """Return the next event: the head, a chunk of at most 64 KiB, then the end or an error."""
        attempt, stream = self._stream(fence, stream_id)
        pull = stream.pull
        if pull is not None and not pull.busy and not stream.queue.events:
            await self._pull(attempt, stream, pull)
        event = await stream.queue.get()
        if is_terminal(event):
            attempt.streams.pop(stream_id, None)
        return event

    async def _pull(self, attempt: _Attempt, stream: _Stream, pull: Pull) -> None:
        """Read the stream's answer from the engine in the reader's task (a reader
        cancelled while it waits leaves the answer where it was, for the next read)."""
        queue = stream.queue
        pull.busy = True
        queue.last_read = math.inf  # a reading reader is not idle
        try:
            result = await pull.fill(queue, self._drop)
        finally:
            pull.busy = False
            queue.last_read = trio.current_time()
        if not pull.done or stream.pull is not pull:
            return  # more to come, or the stream was closed meanwhile
        stream.pull = None
        if result is STALE and self._nursery is not None:
            # The engine had closed the reused connection: a task sends it again.
            self._nursery.start_soon(self._pump, attempt, stream, pull.request, b"", None)
            return
        if isinstance(result, StreamFailed):
            queue.push(result)
        stream.finished.set()

    async def cancel(self, fence: Fence, stream_id: str) -> None:
        """Close the stream's engine connection now; later reads raise :class:`UnknownStream`."""
        attempt, stream = self._stream(fence, stream_id)
        self._close(
            attempt, stream, StreamFailed(code="cancelled", message="the stream was cancelled")
        )
        await stream.finished.wait()

    async def request(
        self,
        attempt_id: str,
        method: str,
        path: str,
        *,
        limit: int = 65536,
        body: bytes = b"",
        content_type: str | None = None,
        input_id: str | None = None,
    ) -> tuple[int, bytes]:
        """Send one request outside the gateway's streams (readiness probe, bootstrap).

        With ``input_id``, the body is that admitted input's file, streamed from disk.
        """
        attempt = self._attempts.get(attempt_id)
        if attempt is None:
            raise EngineUnavailable(f"attempt {attempt_id!r} is not reachable")
        upload = None
        if input_id is not None:
            upload = await self._admitted_input(attempt, input_id, method, body)
        headers = [] if content_type is None else [("content-type", content_type)]
        try:
            sock = await attempt.engine.connect()
        except OSError as exc:
            raise EngineUnavailable(f"the engine refused the connection: {exc}") from None
        return await request_once(sock, method, path, headers, body, upload, limit)

    def _attempt(self, fence: Fence) -> _Attempt:
        held = self._attempts.get(fence.attempt_id)
        check_fence({} if held is None else {fence.attempt_id: held.fence}, fence)
        return self._attempts[fence.attempt_id]

    def _stream(self, fence: Fence, stream_id: str) -> tuple[_Attempt, _Stream]:
        attempt = self._attempt(fence)
        stream = attempt.streams.get(stream_id)
        if stream is None:
            raise UnknownStream(
                f"stream {stream_id!r} is not open on attempt {fence.attempt_id!r} "
                "(it ended, was cancelled or expired)",
                details={"stream_id": stream_id},
            )
        return attempt, stream

    def _close(self, attempt: _Attempt, stream: _Stream, event: StreamFailed) -> None:
        attempt.streams.pop(stream.id, None)
        stream.scope.cancel()
        stream.queue.end(event)
        if stream.pull is not None:
            stream.pull.close(self._drop)
            stream.pull = None
            stream.finished.set()

    async def _expire_idle(self) -> None:
        while True:
            await trio.sleep(max(self.idle_timeout / 4, 0.01))
            deadline = trio.current_time() - self.idle_timeout
            for attempt in list(self._attempts.values()):
                for stream in list(attempt.streams.values()):
                    if stream.queue.last_read < deadline:
                        self._close(
                            attempt,
                            stream,
                            StreamFailed(code="idle_timeout", message="nobody read the stream"),
                        )

    async def _pump(
        self,
        attempt: _Attempt,
        stream: _Stream,
        head: bytes,
        body: bytes,
        upload: tuple[str, int] | None,
        connection: EngineConnection | None = None,
        sent: int = 0,
    ) -> None:
        failure: StreamFailed | None = None
        try:
            with stream.scope:
                failure = await exchange(
                    attempt.engine, stream.queue, head, body, upload, self._drop, connection, sent
                )
        finally:
            if failure is not None:
                stream.queue.push(failure)  # dropped if the stream was closed
            stream.finished.set()

    def _drop(self, connections: list[EngineConnection]) -> None:
        for connection in connections:
            if self._nursery is not None:
                self._nursery.start_soon(trio.aclose_forcefully, connection.sock)
