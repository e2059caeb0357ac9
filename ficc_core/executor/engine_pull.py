"""The reader-driven exchange: a request sent at once, its answer read by whoever reads the stream.

Most requests a gateway relays find an idle kept-alive connection to their engine
and fit into its socket's send buffer. For those, a task per stream that sends
the request and moves the answer into the stream's queue (:func:`.engine_http.exchange`)
is pure cost: spawning and scheduling it, and handing each event over through the
queue, took about 70 µs of the 135 µs the endpoint action spent on a relayed
request (in process, on the bench's machine). :func:`start_now` writes such a
request without waiting; :meth:`Pull.fill` is then called by the stream's reader
and reads the engine's socket only when the queue is empty, in the reader's task.

The guarantees stay those of the task: the engine's writes block in the kernel while
nobody reads (nothing is read ahead of the reader), each read takes at most 64 KiB,
a stream's connection goes back to the pool as its end is queued, and a closed
stream's connection is closed (a reader waiting on it is woken). Whatever does not
fit the fast path (no idle connection, a socket that is not a plain one, a request
the kernel did not take whole, a reused connection the engine closed meanwhile) is
left to the task, with what was already sent.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs
import trio

from ..http1.engine_codec import ResponseParser
from .engine_http import (
    CHUNK_SIZE,
    EXCHANGE_ERRORS,
    STALE,
    EngineConnection,
    EnginePool,
    exchange_failure,
)
from .event_queue import EventQueue
from .types import EndOfStream, StreamFailed

__all__ = ["Pull", "start_now"]

Drop = Callable[[list[EngineConnection]], None]


@attrs.define(eq=False)
class Pull:
    """One request sent whole on ``connection``; its answer, read on demand.

    :ivar busy: a reader is reading the socket now (another one waits on the queue).
    :ivar done: the answer ended or failed; the connection is back in the pool or closed.
    """

    pool: EnginePool
    connection: EngineConnection
    request: bytes
    parser: ResponseParser = attrs.field(factory=ResponseParser)
    busy: bool = False
    done: bool = False

    async def fill(self, queue: EventQueue, drop: Drop) -> StreamFailed | object | None:
        """Read the engine until an event is queued or the answer ended.

        Returns a failure to end the stream with, :data:`STALE`, or None.
        """
        sock = self.connection.sock
        parser = self.parser
        try:
            fd = sock.socket.fileno()  # type: ignore[attr-defined]
            while not queue.events:
                try:
                    data = os.read(fd, CHUNK_SIZE)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock.socket)  # type: ignore[attr-defined]
                    continue
                if not data and not parser.started:
                    self._end(drop, kept=False)
                    return STALE
                events = parser.feed(data)
                kept = False
                for event in events:
                    if isinstance(event, EndOfStream) and parser.keep_alive:
                        kept = self.pool.keep(self.connection)  # before the reader learns
                    queue.push(event)
                if parser.complete:
                    self._end(drop, kept=kept)
                    return None
        except EXCHANGE_ERRORS as exc:
            self._end(drop, kept=False)
            return exchange_failure(exc, retry=not parser.started)
        return None

    def close(self, drop: Drop) -> None:
        """The stream was closed before its answer ended: close the connection (a reader
        waiting on it is woken with ``ClosedResourceError``)."""
        self._end(drop, kept=False)

    def _end(self, drop: Drop, *, kept: bool) -> None:
        if self.done:
            return
        self.done = True
        if not kept:
            drop([self.connection])


def start_now(
    pool: EnginePool, request: bytes, drop: Drop
) -> tuple[Pull | None, EngineConnection | None, int]:
    """Send ``request`` on an idle connection without waiting, if it can be.

    Returns ``(pull, None, 0)`` when the kernel took the whole request, else
    ``(None, connection, sent)``: the connection it was partly written to (and how
    many bytes went), or ``None`` for the task to take or dial one.
    """
    connection, expired = pool.take()
    if expired:
        drop(expired)
    if connection is None:
        return None, None, 0
    sock = connection.sock
    if type(sock) is not trio.SocketStream:
        pool.idle.append(connection)  # as it was: the task sends through the stream's methods
        return None, None, 0
    try:
        sent = os.write(sock.socket.fileno(), request)
    except BlockingIOError:
        sent = 0
    except OSError:
        drop([connection])  # the engine closed it while it was idle
        return None, None, 0
    if sent < len(request):
        return None, connection, sent
    return Pull(pool, connection, request), None, 0
