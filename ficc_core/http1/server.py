"""HTTP/1.1 for hypercorn's trio worker, parsed by llhttp instead of h11.

hypercorn speaks HTTP/1.1 through h11, a pure-Python state machine: about 115 µs
of CPU to parse a typical gateway request and write its answer (in process, on the
bench's machine), an eighth of what ``ficc serve`` spends on a relayed request.
:class:`Http1Protocol` takes h11's place for plain requests: llhttp (``httptools``,
the parser Node.js and uvicorn use, already parsing engine answers in
:mod:`ficc_core.http1.engine_codec`) parses each request, and the response head
is written directly, for about 10 µs. Everything above the protocol stays
hypercorn's: the ASGI stream (``HTTPStream``), the connection's reader, TLS and
shutdown. So does the keep-alive timeout, but watched by one task per connection
(:meth:`Http1Protocol._watch_idle`) instead of hypercorn's idle task, which was
spawned at every answer's end and cancelled at the next request.

What h11 did, this does the same way: keep-alive for HTTP/1.1 unless either side
says ``connection: close`` (an HTTP/1.0 connection carries one request); one request
at a time, a pipelined one read only once the previous answer has ended (so a
client that does not read its answers stops being read); ``100 Continue`` sent as
soon as a request that expects it arrives; a request head over
``h11_max_incomplete_size`` answered 431; the answer framed by its
``content-length``, else chunked (HTTP/1.1) or ended by closing the connection
(HTTP/1.0), no body for ``HEAD``, 204 and 304; a response header whose name is not
a token or whose value holds a control character refused, so nothing an
application sets can split the response.

Whatever is not a plain request goes to hypercorn's own ``H11Protocol`` for the
rest of the connection: a WebSocket or h2c upgrade, ``CONNECT``, HTTP/2 with prior
knowledge, and, in a connection's first request, anything llhttp refuses or that
h11 would answer differently (a missing ``host``, a method llhttp does not know, a
head too large). That request then gets exactly the answer it got before. A later
malformed request on a kept-alive connection is answered 400 and the connection
closed.

:func:`install` makes hypercorn use this for the servers whose ``Config`` is marked
by :func:`use_http1`; any other hypercorn server in the process keeps h11.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from time import time
from typing import Any

import httptools
import hypercorn.protocol as hypercorn_protocol
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import (
    Body,
    EndBody,
    InformationalResponse,
    Request,
    Response,
    StreamClosed,
)
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream

__all__ = ["Http1Protocol", "install", "use_http1"]

STREAM_ID = 1
_MARK = "_ficc_http1"

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_NO_BODY_STATUS = frozenset({204, 304})

# The kinds of parsed events, in the order llhttp reports them.
_REQUEST, _BODY, _END = 0, 1, 2


class _Problem(Exception):
    """A request this protocol does not serve itself; ``status`` answers it if it
    cannot be handed to h11."""

    def __init__(self, status: int) -> None:
        self.status = status


def use_http1(config: Config) -> Config:
    """Mark ``config``: servers started with it speak HTTP/1.1 through :class:`Http1Protocol`."""
    install()
    setattr(config, _MARK, True)
    return config


def install() -> None:
    """Make hypercorn's protocol wrapper build :class:`Http1Protocol` for marked configs."""
    if getattr(hypercorn_protocol.H11Protocol, _MARK, False):
        return

    def choose(app: Any, config: Config, *args: Any) -> Any:
        if getattr(config, _MARK, False):
            return Http1Protocol(app, config, *args)
        return H11Protocol(app, config, *args)

    setattr(choose, _MARK, True)
    hypercorn_protocol.H11Protocol = choose  # type: ignore[misc, assignment]


class _ServerHeaders:
    """``config.response_headers("h11")`` (its date, its server name), built once a second."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.second = -1
        self.headers: list[tuple[bytes, bytes]] = []

    def now(self) -> list[tuple[bytes, bytes]]:
        second = int(time())
        if second != self.second:
            self.second = second
            self.headers = self.config.response_headers("h11")
        return self.headers


class Http1Protocol:
    """One HTTP/1.x connection; hypercorn's ``H11Protocol`` interface (see the module docs)."""

    # Set by _new_cycle, for each request and its answer.
    our_done: bool
    held: bytes

    def __init__(
        self,
        app: Any,
        config: Config,
        context: Any,
        task_group: Any,
        connection_state: Any,
        ssl: bool,
        client: tuple[str, int] | None,
        server: tuple[str, int] | None,
        send: Callable[[Event], Awaitable[None]],
    ) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.task_group = task_group
        self.connection_state = connection_state
        self.ssl = ssl
        self.client = client
        self.server = server
        self.send = send
        self.can_read = context.event_class()
        self.stream: HTTPStream | None = None
        self.keep_alive_requests = 0
        self.delegate: H11Protocol | None = None
        self.headers = _ServerHeaders(config)
        self.parser = httptools.HttpRequestParser(self)
        self.limit = config.h11_max_incomplete_size
        # Raw bytes kept until the connection's first request is served, so that h11
        # can be handed them whole; None after.
        self.raw: list[bytes] | None = []
        self.events: list[tuple[Any, ...]] = []
        self.closing = False
        # Idleness is watched by one task per connection (see _watch_idle).
        self.busy_announced = False
        self.idle_deadline = 0.0
        self.watching: trio.CancelScope | None = None
        self.idle_wait: trio.Event | None = None
        # The last request ended and said that it is the last one (llhttp refuses what
        # follows it, which is not read: the connection closes after its answer).
        self.last_ended = False
        self.last_keeps = True
        # Bytes received while a request head is incomplete: llhttp buffers a header
        # until it ends, so a head that never ends is bounded here.
        self.reading_head = True
        self.head_raw = 0
        self._new_message()
        self._new_cycle()

    # -- what the parser reports (llhttp callbacks, inside feed_data) --

    def _new_message(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.begin = len(self.events)

    def on_message_begin(self) -> None:
        self._new_message()
        self.reading_head = True
        self.head_raw = 0
        self.last_ended = False

    def on_url(self, url: bytes) -> None:
        self.head_size += len(url)
        if self.head_size > self.limit:
            raise _Problem(431)
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size > self.limit:
            raise _Problem(431)
        self.fields.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        self.reading_head = False
        self.head_raw = 0
        version = self.parser.get_http_version()
        keep_alive = version == "1.1"
        expect = False
        hosts = 0
        for name, value in self.fields:
            if name == b"connection":
                if b"close" in value.lower():
                    keep_alive = False
            elif name == b"host":
                hosts += 1
            elif name == b"expect":
                expect = value.lower() == b"100-continue"
        if hosts > 1 or (hosts == 0 and version == "1.1"):
            raise _Problem(400)
        method = self.parser.get_method().decode("ascii")
        self.last_keeps = keep_alive
        self.events.append((_REQUEST, method, version, self.url, self.fields, keep_alive, expect))

    def on_body(self, body: bytes) -> None:
        self.events.append((_BODY, body))

    def on_message_complete(self) -> None:
        self.events.append((_END,))
        self.last_ended = True

    # -- hypercorn's protocol interface --

    async def initiate(self) -> None:
        pass

    async def handle(self, event: Event) -> None:
        if self.delegate is not None:
            await self.delegate.handle(event)
        elif isinstance(event, RawData):
            await self._received(event.data)
        elif isinstance(event, Closed):
            self.closing = True
            if self.watching is not None:
                self.watching.cancel()
            await self.can_read.set()  # a pipelined request waiting for its turn gives up
            if self.stream is not None:
                await self._close_stream()

    async def _received(self, data: bytes) -> None:
        if self.closing or self._after_last():
            return
        if not data:  # the client's end of file
            if self.cycle and not self.their_done:  # in the middle of a request
                await self._refuse(400)
            return
        if self.raw is not None:
            self.raw.append(data)
            if data.startswith(b"PRI * HTTP/2.0"):
                await self._hand_over(b"".join(self.raw))
                return
        if self.reading_head:
            self.head_raw += len(data)
        upgrade: int | None = None
        problem: _Problem | None = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            upgrade = exc.args[0]
        except _Problem as raised:
            problem = raised
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            problem = cause if isinstance(cause, _Problem) else _Problem(400)
        except httptools.HttpParserError:
            if not self._after_last():
                problem = _Problem(400)
        if problem is None and self.reading_head and self.head_raw > self.limit:
            problem = _Problem(431)
        if self.raw is not None and (upgrade is not None or problem is not None):
            if self.begin == 0:  # still the connection's first request: h11 takes it all
                self.events.clear()
                await self._hand_over(b"".join(self.raw))
                return
        if upgrade is not None:
            await self._upgrade(data[upgrade:])
            return
        await self._serve_events()
        if problem is not None:
            await self._refuse(problem.status)

    def _after_last(self) -> bool:
        """The last request ended and said it was the last: what follows is not read."""
        return self.last_ended and not self.last_keeps

    async def _serve_events(self) -> None:
        events, self.events = self.events, []
        self.begin = 0
        for event in events:
            if self.closing:
                return
            kind = event[0]
            if kind is _REQUEST:
                await self._start(*event[1:])
            elif kind is _BODY:
                if self.stream is not None:
                    await self.stream.handle(Body(stream_id=STREAM_ID, data=event[1]))
            else:
                self.their_done = True
                if self.stream is not None:
                    await self.stream.handle(EndBody(stream_id=STREAM_ID))

    async def _start(
        self,
        method: str,
        version: str,
        target: bytes,
        fields: list[tuple[bytes, bytes]],
        keep_alive: bool,
        expect: bool,
    ) -> None:
        await self._wait_turn()
        if self.closing:
            return
        self.raw = None
        self.cycle = True
        self.version = version
        self.head_request = method == "HEAD"
        self.keep_alive = keep_alive
        if not self.busy_announced:  # stops hypercorn's idle task: _watch_idle takes over
            self.busy_announced = True
            await self.send(Updated(idle=False))
        if expect and version == "1.1":
            await self._write_head(100, [])
        self.stream = HTTPStream(
            self.app,
            self.config,
            self.context,
            self.task_group,
            self.ssl,
            self.client,
            self.server,
            self.stream_send,
            STREAM_ID,
        )
        await self.stream.handle(
            Request(
                stream_id=STREAM_ID,
                headers=fields,
                http_version=version,
                method=method,
                raw_path=target,
                state=self.connection_state,
            )
        )
        self.keep_alive_requests += 1
        await self.context.mark_request()

    async def stream_send(self, event: Any) -> None:
        kind = type(event)
        if kind is StreamClosed:
            await self._maybe_recycle()
            return
        if self.closing or self.our_done:
            return
        if kind is Body:
            if self.framing == "chunked":
                data = b"%x\r\n%b\r\n" % (len(event.data), event.data)
            elif self.framing == "length":
                self.remaining -= len(event.data)
                if self.remaining < 0:
                    self.keep_alive = False
                    raise ValueError("the response body is longer than its content-length")
                data = self.held + event.data if self.held else event.data
                self.held = b""
            elif self.framing == "none":
                return
            else:
                data = event.data
            await self.send(RawData(data=data))
        elif kind is Response:
            await self._respond(event.status_code, event.headers)
        elif kind is EndBody:
            self.our_done = True
            if self.held:
                await self.send(RawData(data=self.held))
                self.held = b""
            if self.framing == "chunked":
                await self.send(RawData(data=b"0\r\n\r\n"))
            elif self.framing == "length" and self.remaining:
                self.keep_alive = False  # cut short: the client learns by the close
        elif kind is not InformationalResponse:  # early hints: HTTP/2 and 3 only
            raise ValueError(f"unexpected stream event {event!r}")

    # -- answering --

    async def _respond(self, status: int, app_headers: list[tuple[bytes, bytes]]) -> None:
        if status < 200:
            await self._write_head(status, app_headers)
            return
        length: int | None = None
        length_header: tuple[bytes, bytes] = (b"", b"")
        chunked = False
        headers = []
        for name, value in app_headers:
            lowered = name.lower()
            if lowered == b"content-length":
                length = int(value)
                if length < 0:
                    raise ValueError(f"invalid content-length {value!r}")
                length_header = (name, value)
                continue  # written below, unless the body is chunked
            elif lowered == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
                continue  # written below, as the framing needs it
            elif lowered == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
                continue  # written below
            headers.append((name, value))
        if (
            self.keep_alive_requests >= self.config.keep_alive_max_requests
            or self.context.terminated.is_set()  # shutting down: the client should not reuse it
        ):
            self.keep_alive = False
        if self.head_request or status in _NO_BODY_STATUS:
            self.framing = "none"
            if chunked:
                headers.append((b"transfer-encoding", b"chunked"))
            elif length is not None:
                headers.append(length_header)
        elif length is not None and not chunked:
            self.framing, self.remaining = "length", length
            headers.append(length_header)
        elif self.version == "1.1":
            self.framing = "chunked"
            headers.append((b"transfer-encoding", b"chunked"))
        else:  # HTTP/1.0: the end of the body is the end of the connection
            self.framing = "close"
            self.keep_alive = False
        if not self.keep_alive:
            headers.append((b"connection", b"close"))
        # The head of an answer of known length goes out with its body, in one write
        # (a streamed answer's head goes at once: a client may wait on it).
        await self._write_head(status, headers, hold=self.framing in ("length", "none"))

    async def _write_head(
        self, status: int, headers: list[tuple[bytes, bytes]], hold: bool = False
    ) -> None:
        lines = [b"HTTP/1.1 %d \r\n" % status]
        for name, value in headers:
            if not _TOKEN.fullmatch(name) or _CONTROL.search(value):
                raise ValueError(f"invalid response header {name!r}: {value!r}")
            lines.append(b"%b: %b\r\n" % (name, value))
        for name, value in self.headers.now():
            lines.append(b"%b: %b\r\n" % (name, value))
        lines.append(b"\r\n")
        if hold:
            self.held = b"".join(lines)
        else:
            await self.send(RawData(data=b"".join(lines)))

    async def _refuse(self, status: int) -> None:
        """Answer a malformed request (if its answer has not started) and close."""
        if self.their_done:  # a later request is malformed: first the answer before it
            await self._wait_turn()
            if self.closing:
                return
        if not self.response_started():
            self.framing = "none"
            await self._write_head(status, [(b"content-length", b"0"), (b"connection", b"close")])
        self.closing = True
        await self.send(Closed())

    def response_started(self) -> bool:
        return self.framing != ""

    async def _maybe_recycle(self) -> None:
        await self._close_stream()
        if (
            not self.context.terminated.is_set()
            and self.our_done
            and self.their_done
            and self.keep_alive
        ):
            self._new_cycle()
            await self.can_read.set()
            self.idle_deadline = trio.current_time() + self.config.keep_alive_timeout
            if self.idle_wait is not None:
                self.idle_wait.set()
            elif self.watching is None:
                self.watching = trio.CancelScope()
                self.task_group.spawn(self._watch_idle, self.watching)
        else:
            self.closing = True
            await self.can_read.set()
            await self.send(Closed())

    async def _watch_idle(self, scope: trio.CancelScope) -> None:
        """Close the connection once it has been idle for ``keep_alive_timeout``, and at
        once if the server shuts down while it is idle.

        hypercorn's own idle task does the same, but it is started anew at the end of
        every answer and cancelled at the next request: a task spawned and ended per
        request. This one task lives as long as the connection, and a request costs
        it one clock read. A connection that shuts down while busy closes at its
        answer's end (:meth:`_maybe_recycle`).
        """
        terminated = self.context.terminated
        with scope:
            while True:
                with trio.move_on_at(self.idle_deadline):
                    await terminated.wait()
                if self.cycle:  # busy: wait until it is idle again
                    if terminated.is_set():
                        return
                    self.idle_wait = trio.Event()
                    await self.idle_wait.wait()
                    self.idle_wait = None
                elif terminated.is_set() or trio.current_time() >= self.idle_deadline:
                    with trio.CancelScope(shield=True):
                        await self.send(Closed())
                    return

    async def _wait_turn(self) -> None:
        """Wait until the answer in progress has ended (or the connection closes)."""
        while self.cycle and not self.closing:
            await self.can_read.clear()
            await self.can_read.wait()

    def _new_cycle(self) -> None:
        self.cycle = False
        self.their_done = False
        self.our_done = False
        self.framing = ""
        self.held = b""  # a response head waiting for its body
        self.remaining = 0
        self.keep_alive = False
        self.head_request = False
        self.version = "1.1"

    async def _close_stream(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            await stream.handle(StreamClosed(stream_id=STREAM_ID))

    # -- what h11 serves --

    async def _upgrade(self, rest: bytes) -> None:
        """A later request on the connection asks for an upgrade: serve the requests
        before it, then hand h11 that request's head (as parsed) and what follows."""
        begin = self.begin
        upgrade = self.events[begin]
        self.events = self.events[:begin]
        await self._serve_events()
        await self._wait_turn()
        if self.closing:
            return
        _, method, version, target, fields, _, _ = upgrade
        head = [b"%b %b HTTP/%b\r\n" % (method.encode("ascii"), target, version.encode("ascii"))]
        head.extend(b"%b: %b\r\n" % field for field in fields)
        head.append(b"\r\n")
        await self._hand_over(b"".join(head) + rest)

    async def _hand_over(self, data: bytes) -> None:
        self.raw = None
        if self.watching is not None:  # h11 tells hypercorn's idle task itself
            self.watching.cancel()
        self.delegate = H11Protocol(
            self.app,
            self.config,
            self.context,
            self.task_group,
            self.connection_state,
            self.ssl,
            self.client,
            self.server,
            self.send,
        )
        await self.delegate.initiate()
        await self.delegate.handle(RawData(data=data))
