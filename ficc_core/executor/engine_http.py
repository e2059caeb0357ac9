"""HTTP/1.1 to one engine's socket, for the endpoint action: kept-alive connections, exchanges.

:class:`~ficc_core.executor.EndpointStreams` checks a request; what is here sends
it (h11, over the attempt's socket) and relays the answer into the stream's
:class:`~ficc_core.executor.event_queue.EventQueue`, never reading from the engine
while the queue is full, so an unread stream blocks the engine's writes in the
kernel. Connections whose exchange ended cleanly wait in an :class:`EnginePool`
for the next request; a reused one the engine had closed meanwhile is replaced
and the request sent again, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import h11
import trio

from .event_queue import EventQueue
from .types import BodyChunk, EndOfStream, ResponseHead, StreamFailed

#: The largest body chunk a stream's reader gets.
CHUNK_SIZE = 64 * 1024
#: Engine connections kept open per attempt for the next requests (HTTP/1.1 keep-alive).
IDLE_CONNECTIONS = 32
#: Seconds an idle engine connection may wait for reuse before it is closed instead.
IDLE_CONNECTION_SECONDS = 20.0
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
)
#: What one exchange returns when a reused connection turned out to be closed by the
#: engine before it answered: the request is sent again on a new connection.
_STALE = object()

Connector = Callable[[], Awaitable[trio.abc.Stream]]
#: An admitted input streamed as the body: (host path, size).
Upload = tuple[str, int]


@attrs.define(eq=False)
class EngineConnection:
    """An engine connection and its HTTP/1.1 state, kept between requests when it can be."""

    sock: trio.abc.Stream
    conn: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))
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
        """Keep a connection whose exchange completed for the next request, if it may be."""
        conn = connection.conn
        if (
            conn.our_state is not h11.DONE
            or conn.their_state is not h11.DONE
            or self.closed
            or len(self.idle) >= IDLE_CONNECTIONS
        ):
            return False
        conn.start_next_cycle()
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
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
    upload: Upload | None,
    drop: Callable[[list[EngineConnection]], None],
) -> StreamFailed | None:
    """Send the request on an idle engine connection (or a new one) and relay the answer.

    Returns the failure to end the stream with, or None once :class:`EndOfStream` is
    queued. ``drop`` closes connections too old to reuse.
    """
    connection = None
    if upload is None:
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
        result = await _exchange_once(
            pool, queue, connection, method, target, headers, body, upload, reused
        )
        if result is not _STALE:
            return result  # type: ignore[return-value]
        connection = None


async def _exchange_once(
    pool: EnginePool,
    queue: EventQueue,
    connection: EngineConnection,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
    upload: Upload | None,
    reused: bool,
) -> StreamFailed | object | None:
    sock, conn = connection.sock, connection.conn
    answered = kept = False
    try:
        if upload is None:
            await sock.send_all(request_bytes(conn, method, target, headers, body, keep_alive=True))
        else:
            await send_file(conn, sock, method, target, headers, *upload)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                # Backpressure: read nothing more while the reader is behind.
                await queue.wait_room()
                data = await sock.receive_some(CHUNK_SIZE)
                if not data and reused and not answered:
                    return _STALE
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                answered = True
                await queue.put(
                    ResponseHead(status=event.status_code, headers=_response_headers(event))
                )
            elif isinstance(event, h11.Data):
                data = bytes(event.data)
                for start in range(0, len(data), CHUNK_SIZE):
                    await queue.put(BodyChunk(data[start : start + CHUNK_SIZE]))
            elif isinstance(event, h11.EndOfMessage):
                # Back in the pool before the reader learns of the end, so the
                # reader's next request finds it.
                kept = pool.keep(connection)
                await queue.put(EndOfStream())
                return None
            else:
                return StreamFailed(
                    code="engine_closed", message="the engine closed the connection early"
                )
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        if reused and not answered:
            return _STALE
        return StreamFailed(code="engine_closed", message=f"the engine connection broke: {exc}")
    except h11.ProtocolError as exc:
        return StreamFailed(code="bad_response", message=f"the engine sent invalid HTTP: {exc}")
    finally:
        if not kept:
            await trio.aclose_forcefully(sock)


async def request_once(
    sock: trio.abc.Stream,
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    body: bytes,
    upload: Upload | None,
    limit: int,
) -> tuple[int, bytes]:
    """One request on a connection of its own (closed after); the status and body prefix."""
    async with sock:
        conn = h11.Connection(h11.CLIENT)
        if upload is None:
            await sock.send_all(request_bytes(conn, method, path, headers, body))
        else:
            await send_file(conn, sock, method, path, headers, *upload)
        status, answer = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await sock.receive_some(CHUNK_SIZE))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                answer = (answer + bytes(event.data))[:limit]
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, answer


def request_bytes(
    conn: h11.Connection,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes,
    *,
    keep_alive: bool = False,
) -> bytes:
    """The whole request, head and body, as bytes to send."""
    all_headers = [
        ("host", "engine"),
        *(() if keep_alive else (("connection", "close"),)),
        ("content-length", str(len(body))),
        *headers,
    ]
    data = conn.send(h11.Request(method=method, target=target, headers=all_headers)) or b""
    if body:
        data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    return data


async def send_file(
    conn: h11.Connection,
    sock: trio.abc.Stream,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    path: str,
    size: int,
) -> None:
    """Send a request whose body is the file at ``path``, read in chunks."""
    all_headers = [
        ("host", "engine"),
        ("connection", "close"),
        ("content-length", str(size)),
        *[(name, value) for name, value in headers if name != "content-type"],
        ("content-type", "application/octet-stream"),
    ]
    await sock.send_all(conn.send(h11.Request(method=method, target=target, headers=all_headers)))
    sent = 0
    async with await trio.open_file(path, "rb") as file:
        while sent < size:
            data = await file.read(min(CHUNK_SIZE, size - sent))
            if not data:
                raise OSError(f"input {path} shrank while it was being sent")
            sent += len(data)
            await sock.send_all(conn.send(h11.Data(data=data)))
    await sock.send_all(conn.send(h11.EndOfMessage()))


def _response_headers(response: Any) -> tuple[tuple[str, str], ...]:
    return tuple(
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in response.headers
        if name.decode("latin-1").lower() not in _HOP_BY_HOP
    )
