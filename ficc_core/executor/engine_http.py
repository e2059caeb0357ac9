"""HTTP/1.1 to one engine's socket, for the endpoint action: kept-alive connections, exchanges.

:class:`~ficc_core.executor.EndpointStreams` checks a request; what is here sends
it over the attempt's socket (framed by :mod:`~ficc_core.http1.engine_codec`) and
relays the answer into the stream's :class:`~ficc_core.executor.event_queue.EventQueue`,
never reading from the engine while the queue is full, so an unread stream blocks
the engine's writes in the kernel. Connections whose exchange ended cleanly wait
in an :class:`EnginePool` for the next request; a reused one the engine had closed
meanwhile is replaced and the request sent again, once.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import attrs
import trio

from ..http1.engine_codec import (
    EngineClosedEarly,
    EngineProtocolError,
    ResponseParser,
    encode_request,
)
from .event_queue import EventQueue
from .types import BodyChunk, EndOfStream, ResponseHead, StreamFailed

#: The largest body chunk a stream's reader gets.
CHUNK_SIZE = 64 * 1024
#: Engine connections kept open per attempt for the next requests (HTTP/1.1 keep-alive).
IDLE_CONNECTIONS = 32
#: Seconds an idle engine connection may wait for reuse before it is closed instead.
IDLE_CONNECTION_SECONDS = 20.0
#: What one exchange returns when a reused connection turned out to be closed by the
#: engine before it answered: the request is sent again on a new connection.
STALE = object()

Connector = Callable[[], Awaitable[trio.abc.Stream]]
#: An admitted input streamed as the body: (host path, size).
Upload = tuple[str, int]


@attrs.define(eq=False)
class EngineConnection:
    """An engine connection, kept between requests when it can be."""

    sock: trio.abc.Stream
    idle_since: float = 0.0


@attrs.define(eq=False)
class EnginePool:
    """One attempt's way to its engine, and its idle connections (most recent last).

    :ivar closed: the attempt ended; no connection is kept any more.
    """

    connect: Connector
    idle: list[EngineConnection] = attrs.field(factory=list)
    closed: bool = False

    def keep(self, connection: EngineConnection) -> bool:
        """Keep a connection whose exchange completed (its answer may be followed by
        another) for the next request, if there is room."""
        if self.closed or len(self.idle) >= IDLE_CONNECTIONS:
            return False
        connection.idle_since = trio.current_time()
        self.idle.append(connection)
        return True

    def take(self) -> tuple[EngineConnection | None, list[EngineConnection]]:
        """The most recent idle connection still young enough, and those too old to keep."""
        oldest = trio.current_time() - IDLE_CONNECTION_SECONDS
        expired = [c for c in self.idle if c.idle_since < oldest]
        self.idle = [c for c in self.idle if c.idle_since >= oldest]
        return (self.idle.pop() if self.idle else None), expired

    def close(self) -> list[EngineConnection]:
        """Keep nothing more; return the idle connections, for the caller to close."""
        self.closed = True
        idle, self.idle = self.idle, []
        return idle


async def exchange(
    pool: EnginePool,
    queue: EventQueue,
    head: bytes,
    body: bytes,
    upload: Upload | None,
    drop: Callable[[list[EngineConnection]], None],
    connection: EngineConnection | None = None,
    sent: int = 0,
) -> StreamFailed | None:
    """Send the request on an idle engine connection (or a new one) and relay the answer.

    Returns the failure to end the stream with, or None once :class:`EndOfStream` is
    queued. ``drop`` closes connections too old to reuse. With ``connection``, the
    request's first ``sent`` bytes already went on that (reused) connection.
    """
    if connection is None and upload is None:
        connection, expired = pool.take()
        if expired:
            drop(expired)
    while True:
        if connection is None:
            try:
                connection = EngineConnection(await pool.connect())
            except OSError as exc:
                return StreamFailed(
                    code="engine_unavailable", message=f"cannot reach the engine: {exc}"
                )
            reused = False
        else:
            reused = True
        result = await _exchange_once(pool, queue, connection, head, body, upload, reused, sent)
        if result is not STALE:
            return result  # type: ignore[return-value]
        connection, sent = None, 0


async def _exchange_once(
    pool: EnginePool,
    queue: EventQueue,
    connection: EngineConnection,
    head: bytes,
    body: bytes,
    upload: Upload | None,
    reused: bool,
    sent: int = 0,
) -> StreamFailed | object | None:
    sock = connection.sock
    parser = ResponseParser()
    kept = False
    try:
        if upload is None:
            await _send_all(sock, (head + body if body else head)[sent:])
        else:
            await send_file(sock, head, *upload)
        while True:
            # Backpressure: read nothing more while the reader is behind.
            await queue.wait_room()
            data = await _receive_some(sock, CHUNK_SIZE)
            if not data and reused and not parser.started:
                return STALE
            for event in parser.feed(data):
                if isinstance(event, EndOfStream) and upload is None and parser.keep_alive:
                    # Back in the pool before the reader learns of the end, so the
                    # reader's next request finds it.
                    kept = pool.keep(connection)
                await queue.put(event)
            if parser.complete:
                return None
    except EXCHANGE_ERRORS as exc:
        return exchange_failure(exc, retry=reused and not parser.started)
    finally:
        if not kept:
            await trio.aclose_forcefully(sock)


#: What ends an exchange early: the connection broke, or the engine's answer is not HTTP.
EXCHANGE_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, EngineProtocolError)


def exchange_failure(exc: BaseException, *, retry: bool) -> StreamFailed | object:
    """What ends a stream whose exchange raised one of :data:`EXCHANGE_ERRORS`:
    :data:`STALE` when the connection broke and ``retry`` (a reused connection, no
    byte of an answer yet), else the failure."""
    if isinstance(exc, EngineClosedEarly):
        return StreamFailed(code="engine_closed", message="the engine closed the connection early")
    if isinstance(exc, EngineProtocolError):
        return StreamFailed(code="bad_response", message=str(exc))
    if retry:
        return STALE
    return StreamFailed(code="engine_closed", message=f"the engine connection broke: {exc}")


# trio's SocketStream makes every send and receive a schedule point: it checks for
# cancellation, tries the call and, when the kernel took or gave the bytes at once,
# yields to the scheduler anyway (about 8 µs a call on the bench's machine, several
# per relayed request). An exchange needs to wait only when the socket would block,
# so on a SocketStream these two call the socket's file descriptor directly and
# wait for it only then (a wait is a checkpoint: the stream's cancellation and a
# close from another task arrive there). The exchange still yields at least every
# few events: the stream's queue holds four, and a full queue parks it. Any other
# stream (TLS, a test's memory stream) uses its own methods.


async def _send_all(sock: trio.abc.Stream, data: bytes) -> None:
    if type(sock) is not trio.SocketStream:
        await sock.send_all(data)
        return
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(sock.socket.fileno(), view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock.socket)


async def _receive_some(sock: trio.abc.Stream, size: int) -> bytes | bytearray:
    if type(sock) is not trio.SocketStream:
        return await sock.receive_some(size)
    while True:
        try:
            return os.read(sock.socket.fileno(), size)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock.socket)


async def request_once(
    sock: trio.abc.Stream,
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    body: bytes,
    upload: Upload | None,
    limit: int,
) -> tuple[int, bytes]:
    """One request on a connection of its own (closed after); the status and body prefix
    (what came, when the engine closed the connection before its answer ended).

    Raises :class:`~ficc_core.http1.engine_codec.EngineProtocolError` on an answer
    that is not HTTP.
    """
    async with sock:
        if upload is None:
            await sock.send_all(request_head(method, path, headers, len(body)) + body)
        else:
            await send_file(
                sock, request_head(method, path, headers, upload[1], upload=True), *upload
            )
        parser = ResponseParser()
        status, answer = 0, b""
        try:
            while not parser.complete:
                for event in parser.feed(await sock.receive_some(CHUNK_SIZE)):
                    if isinstance(event, ResponseHead):
                        status = event.status
                    elif isinstance(event, BodyChunk) and len(answer) < limit:
                        answer = (answer + event.data)[:limit]
        except EngineClosedEarly:
            pass
        return status, answer


def request_head(
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    size: int,
    *,
    upload: bool = False,
    keep_alive: bool = False,
) -> bytes:
    """The head of a request with a body of ``size`` bytes; an ``upload`` (an input's
    file as the body) is ``application/octet-stream`` on a connection of its own.

    Raises :class:`~ficc_core.http1.engine_codec.EngineProtocolError` for a target
    or header that could split the request.
    """
    if upload:
        headers = [(name, value) for name, value in headers if name != "content-type"]
        headers.append(("content-type", "application/octet-stream"))
    return encode_request(method, target, headers, size, keep_alive=keep_alive and not upload)


async def send_file(sock: trio.abc.Stream, head: bytes, path: str, size: int) -> None:
    """Send ``head``, then the file at ``path`` as the body, read in chunks."""
    await sock.send_all(head)
    sent = 0
    async with await trio.open_file(path, "rb") as file:
        while sent < size:
            data = await file.read(min(CHUNK_SIZE, size - sent))
            if not data:
                raise OSError(f"input {path} shrank while it was being sent")
            sent += len(data)
            await sock.send_all(data)
