"""HTTP/1.1 framing on an engine connection: a request's bytes out, the response's events in.

The endpoint action speaks HTTP/1.1 to engines on every request, so its framing is
on the gateway's request path. Responses are parsed by llhttp (Node.js's parser,
through ``httptools``), in C: parsing an engine's answer with h11 cost about 75 µs
of the 0.9 ms of CPU a relayed request takes, llhttp about 3 µs. Requests are
written here directly: the endpoint action sends only ``GET`` and ``POST`` with
headers it chose, and :func:`encode_request` refuses anything that could split
a request (a CR, LF or NUL in the target or a header, a space in the target).

A :class:`ResponseParser` reads one response (any ``1xx`` before it skipped) and
turns it into the stream's events: :class:`~ficc_core.http1.events.ResponseHead`,
:class:`~ficc_core.http1.events.BodyChunk` and :class:`~ficc_core.http1.events.EndOfStream`.
A body framed by neither ``Content-Length`` nor chunked coding ends when the engine
closes the connection (:meth:`ResponseParser.closed`); anything else cut short by
a close is an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import httptools

from .events import BodyChunk, EndOfStream, ResponseHead

if TYPE_CHECKING:
    from ..executor.types import ReadEvent

__all__ = ["EngineClosedEarly", "EngineProtocolError", "ResponseParser", "encode_request"]

#: Response headers that describe one connection's framing, not the answer.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
)
_FORBIDDEN = ("\r", "\n", "\0")


class EngineProtocolError(Exception):
    """The engine sent something that is not a valid HTTP/1.1 response, or the request
    to send would not be one."""


class EngineClosedEarly(EngineProtocolError):
    """The engine closed the connection before its answer was complete."""


def _clean(text: str, what: str) -> bytes:
    if any(c in text for c in _FORBIDDEN):
        raise EngineProtocolError(f"{what} holds a CR, LF or NUL: {text[:80]!r}")
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise EngineProtocolError(f"{what} is not Latin-1: {text[:80]!r}") from None


def encode_request(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    content_length: int,
    *,
    keep_alive: bool,
) -> bytes:
    """The request's head (``host: engine``, its ``Content-Length``, ``headers``);
    the body is sent after it."""
    if " " in target or not target.startswith("/"):
        raise EngineProtocolError(f"the request target is not an origin form: {target[:80]!r}")
    parts = [
        method.encode("ascii"),
        b" ",
        _clean(target, "the request target"),
        b" HTTP/1.1\r\nhost: engine\r\ncontent-length: ",
        str(content_length).encode("ascii"),
        b"\r\n" if keep_alive else b"\r\nconnection: close\r\n",
    ]
    for name, value in headers:
        parts += (_clean(name, "a header name"), b": ", _clean(value, "a header value"), b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class ResponseParser:
    """The events of one engine response, from the bytes received (see the module).

    :ivar complete: the response ended (its :class:`EndOfStream` was produced).
    :ivar keep_alive: the connection may carry another request once it is complete:
        HTTP/1.1 without ``connection: close``, and nothing sent after the response.
    """

    __slots__ = (
        "_events",
        "_headers",
        "_parser",
        "_status",
        "_until_close",
        "complete",
        "keep_alive",
        "started",
    )

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._events: list[ReadEvent] = []
        self._headers: list[tuple[str, str]] = []
        self._status = 0
        self._until_close = False
        self.complete = False
        self.keep_alive = False
        #: Bytes of a response arrived (a reused connection's silent close is not one).
        self.started = False

    def feed(self, data: bytes | bytearray) -> list[ReadEvent]:
        """The events ``data`` completes (``b""``: the engine closed the connection)."""
        self._events = []
        if not data:
            return self.closed()
        self.started = True
        if self.complete:
            self.keep_alive = False  # bytes after the response: the connection is not reused
            return []
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise EngineProtocolError("the engine switched protocols") from None
        except httptools.HttpParserError as exc:
            if not self.complete:
                raise EngineProtocolError(f"the engine sent invalid HTTP: {exc}") from None
            self.keep_alive = False  # junk after a complete answer: not reused
        if self.complete:
            # llhttp holds this object's callbacks, so the two form a reference cycle
            # that only the cyclic collector would free: one per relayed request, its
            # events and headers with it. Nothing is parsed after the end.
            del self._parser
        return self._events

    def closed(self) -> list[ReadEvent]:
        """The events the engine's close completes; raises if the response is cut short."""
        if self.complete:
            return []
        if self._until_close and self._status:
            self.complete, self.keep_alive = True, False
            del self._parser  # as in feed: no cycle outlives the answer
            return [EndOfStream()]
        raise EngineClosedEarly("the engine closed the connection before its answer was complete")

    # -- llhttp's callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        headers, self._headers = self._headers, []
        if status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self._status = status
        names = {name for name, _ in headers}
        coding = dict(headers).get("transfer-encoding", "")
        self._until_close = (
            "content-length" not in names
            and "chunked" not in coding.lower()
            and status not in (204, 304)
        )
        self.keep_alive = self._parser.should_keep_alive() and not self._until_close
        self._events.append(
            ResponseHead(
                status=status,
                headers=tuple((n, v) for n, v in headers if n not in HOP_BY_HOP),
            )
        )

    def on_body(self, body: bytes) -> None:
        if self._status:
            self._events.append(BodyChunk(bytes(body)))

    def on_message_complete(self) -> None:
        if not self._status or self.complete:
            return  # the end of an interim answer
        self.complete = True
        self._events.append(EndOfStream())
