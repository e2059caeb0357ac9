"""A small HTTPS server on loopback for tests, with faults injected at the byte level.

It speaks HTTP/1.1 with h11 over a :class:`trio.SSLStream` on a real TCP socket,
so a test can make it drop a connection mid-body, ignore ``Range``, stall, trickle,
send more bytes than the file holds or flip a byte, and then count exactly what
went over the wire. Use it as::

    ca = trustme.CA()
    async with open_https_server(ca) as server:
        server.add("/model.gguf", ServedFile(path, drop_after=1 << 20))
        server.add("/api/info", ServedJSON({"ok": True}))
        async with httpx.AsyncClient(verify=client_ssl_context(ca)) as client:
            response = await client.get(server.url("/model.gguf"))
        assert server.bytes_served["/model.gguf"] == 1 << 20

The certificate is issued by ``ca`` for ``127.0.0.1`` and ``localhost``; hand
:func:`write_ca_bundle` ``ca`` to get a PEM file for code that takes a CA bundle path.

Routes are looked up by the full request target first (``/api?x=1``), then by the
path without its query. A route is a :class:`ServedFile`, :class:`ServedJSON`,
:class:`Redirect`, or a handler: a callable (plain or async) that receives the
:class:`Request` and returns one of those. Unknown paths answer 404.

Every request is appended to :attr:`HttpsServer.requests`; body bytes actually
handed to the socket are added to :attr:`HttpsServer.bytes_served` under the path.
Bytes the kernel had buffered when a client hung up still count, so a client that
reads a prefix and closes is charged that prefix plus at most a few socket buffers.

Suggested pytest fixtures (``tests/conftest.py``)::

    @pytest.fixture
    def ca() -> trustme.CA:
        return trustme.CA()

    @pytest.fixture
    def ca_bundle(tmp_path, ca) -> Path:
        return write_ca_bundle(tmp_path, ca)

    @pytest.fixture
    async def https_server(ca):
        async with open_https_server(ca) as server:
            yield server
"""

from __future__ import annotations

import inspect
import json
import re
import socket
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import h11
import trio
import trustme

#: Body bytes are written in pieces of this size (``chunk_delay`` applies between them).
CHUNK = 64 * 1024
# Files on disk are read this much at a time, off the event loop.
_DISK_READ = 1024 * 1024
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class Request(NamedTuple):
    """One request as the server received it."""

    method: str
    #: The request target: path and query, as sent (``/api/models/a/b?blobs=true``).
    path: str
    #: Header names in lower case; a repeated header keeps its last value.
    headers: dict[str, str]


@attrs.define
class ServedFile:
    """A file served with optional faults; each fault applies to every response unless noted.

    :ivar data: the bytes, or a path streamed from disk in pieces (never read whole).
    :ivar honour_range: answer ``Range: bytes=N-``, ``bytes=N-M`` and ``bytes=-N``
        with 206 (416 past the end); when false, ignore ``Range`` and send 200 with
        everything.
    :ivar drop_after: close the TCP connection abruptly (no TLS close_notify) after
        this many body bytes of a response.
    :ivar drop_times: how many responses are dropped before the file is served
        normally (1: the first response drops, the retry succeeds).
    :ivar chunk_delay: seconds to sleep before each 64 KiB piece after the first.
    :ivar stall: send the headers, then nothing until the client gives up.
    :ivar extra: bytes appended after the file: the served entity is ``data + extra``
        with a matching ``Content-Length`` (a body longer than a manifest declares).
    :ivar corrupt: flip every bit of the byte in the middle of the file.
    :ivar status: answer with this status instead (the whole entity as the body,
        ``Range`` ignored).
    :ivar headers: headers added last, replacing the server's. Overriding
        ``Content-Length`` writes the body unframed and closes the connection after
        it, so a lying length reaches the client as is.
    :ivar redirect_to: answer ``302`` with this ``Location`` instead of the file.
    :ivar chunked: send the body with chunked transfer coding, without ``Content-Length``.
    :ivar content_type: the ``Content-Type`` header.
    """

    data: bytes | Path
    honour_range: bool = True
    drop_after: int | None = None
    drop_times: int = 1
    chunk_delay: float = 0.0
    stall: bool = False
    extra: bytes = b""
    corrupt: bool = False
    status: int | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    redirect_to: str | None = None
    content_type: str = "application/octet-stream"
    chunked: bool = False
    #: How many responses have been dropped so far.
    drops_done: int = attrs.field(default=0, init=False)

    def file_size(self) -> int:
        """The size of ``data`` alone, without ``extra``."""
        if isinstance(self.data, Path):
            return self.data.stat().st_size
        return len(self.data)


@attrs.frozen
class ServedJSON:
    """A JSON document (an API stand-in), with its status and extra headers."""

    document: Any
    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Redirect:
    """A redirect to ``location`` (absolute or relative), with ``status`` (302 by default)."""

    location: str
    status: int = 302


Route = ServedFile | ServedJSON | Redirect
Handler = Callable[[Request], "Route | Awaitable[Route]"]


def client_ssl_context(ca: trustme.CA) -> ssl.SSLContext:
    """Return a client context that trusts ``ca`` (and nothing else): ``httpx`` ``verify=``."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(context)
    return context


def write_ca_bundle(directory: Path, ca: trustme.CA) -> Path:
    """Write ``ca``'s certificate as a PEM bundle in ``directory`` and return its path."""
    path = Path(directory) / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


class _Drop(Exception):
    """Raised inside a response to close the connection abruptly."""


class HttpsServer:
    """An HTTPS server on an OS-chosen loopback port; see the module docstring."""

    def __init__(self, ca: trustme.CA, routes: Mapping[str, Route | Handler] | None = None):
        self.routes: dict[str, Route | Handler] = dict(routes or {})
        self.requests: list[Request] = []
        self.bytes_served: Counter[str] = Counter()
        #: Unexpected exceptions raised while serving (client hang-ups are not errors).
        self.errors: list[BaseException] = []
        self.port = 0
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1", "localhost").configure_cert(self._context)

    def url(self, path: str = "/") -> str:
        """Return ``https://127.0.0.1:PORT/path`` for this server."""
        return f"https://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def add(self, path: str, route: Route | Handler) -> None:
        """Serve ``route`` at ``path`` (a path, or a path with its query)."""
        self.routes["/" + path.lstrip("/")] = route

    def requests_for(self, path: str) -> list[Request]:
        """The requests whose target, without its query, is ``path``."""
        return [r for r in self.requests if r.path.split("?", 1)[0] == path]

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 and serve until cancelled; report the port when listening."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(self.port)

    async def _connection(self, tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, self._context, server_side=True, https_compatible=True)
        try:
            await self._serve(stream)
        except _Drop:
            # Close the TCP socket under TLS: no close_notify, so the client reads every
            # byte sent so far and then an unexpected EOF mid-body. (An RST would let
            # the kernel discard bytes already sent, making the cut-off point vague.)
            await tcp.aclose()
            return
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            ssl.SSLError,
            h11.ProtocolError,
        ):
            pass
        except Exception as exc:
            self.errors.append(exc)
        await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.SSLStream) -> None:
        connection = h11.Connection(h11.SERVER)
        while True:
            request = await self._next_request(stream, connection)
            if request is None:
                return
            keep_open = await self._respond(stream, connection, request)
            if not keep_open or connection.our_state is not h11.DONE:
                return
            try:
                connection.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _next_request(self, stream: trio.SSLStream, connection: h11.Connection):
        request = None
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(CHUNK)
                connection.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                request = Request(
                    event.method.decode("ascii"),
                    event.target.decode("ascii"),
                    {k.decode("ascii").lower(): v.decode("latin-1") for k, v in event.headers},
                )
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                self.requests.append(request)
                return request

    async def _route(self, request: Request) -> Route | None:
        route = self.routes.get(request.path) or self.routes.get(request.path.split("?", 1)[0])
        if route is None or isinstance(route, ServedFile | ServedJSON | Redirect):
            return route
        result = route(request)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _respond(self, stream, connection, request: Request) -> bool:
        route = await self._route(request)
        path = request.path.split("?", 1)[0]
        if route is None:
            body = json.dumps({"error": "not found", "path": path}).encode()
            await self._simple(stream, connection, 404, body, "application/json")
            return True
        if isinstance(route, Redirect):
            await self._simple(
                stream, connection, route.status, b"", extra={"location": route.location}
            )
            return True
        if isinstance(route, ServedJSON):
            body = json.dumps(route.document).encode()
            await self._simple(
                stream, connection, route.status, body, "application/json", extra=route.headers
            )
            return True
        if route.redirect_to is not None:
            await self._simple(stream, connection, 302, b"", extra={"location": route.redirect_to})
            return True
        return await self._file(stream, connection, request, path, route)

    async def _simple(
        self, stream, connection, status, body, content_type="text/plain", extra=None
    ):
        headers = {"content-type": content_type, "content-length": str(len(body))}
        headers.update({k.lower(): v for k, v in (extra or {}).items()})
        await self._send(
            stream, connection, h11.Response(status_code=status, headers=list(headers.items()))
        )
        await self._send(stream, connection, h11.Data(data=body))
        await self._send(stream, connection, h11.EndOfMessage())

    async def _file(
        self, stream, connection, request: Request, path: str, file: ServedFile
    ) -> bool:
        total = file.file_size() + len(file.extra)
        start, end, status = 0, total, 200
        headers = {"content-type": file.content_type, "accept-ranges": "bytes"}
        header = request.headers.get("range")
        if file.status is not None:
            status = file.status
        elif header is not None and file.honour_range:
            wanted = _parse_range(header, total)
            if wanted is None:
                pass  # unparseable or multiple ranges: ignored, as RFC 9110 allows
            elif wanted == "unsatisfiable":
                extra = {"content-range": f"bytes */{total}"}
                await self._simple(stream, connection, 416, b"", extra=extra)
                return True
            else:
                start, end = wanted
                status = 206
                headers["content-range"] = f"bytes {start}-{end - 1}/{total}"
        if not file.chunked:
            headers["content-length"] = str(end - start)
        overrides = {k.lower(): v for k, v in file.headers.items()}
        headers.update(overrides)
        # A Content-Length the framing layer would refuse to honour: write raw, then close.
        raw = "content-length" in overrides
        response = h11.Response(status_code=status, headers=list(headers.items()))
        await self._send(stream, connection, response)
        if request.method == "HEAD":
            await self._send(stream, connection, h11.EndOfMessage())
            return True
        if file.stall:
            await trio.sleep_forever()
        dropping = file.drop_after is not None and file.drops_done < file.drop_times
        if dropping:
            file.drops_done += 1
        sent = 0
        async with aclosing(_entity(file, start, end)) as pieces:
            async for piece in pieces:
                if dropping and sent + len(piece) >= file.drop_after:
                    await self._body(stream, connection, path, piece[: file.drop_after - sent], raw)
                    raise _Drop
                if sent and file.chunk_delay:
                    await trio.sleep(file.chunk_delay)
                await self._body(stream, connection, path, piece, raw)
                sent += len(piece)
        if dropping:
            raise _Drop
        if raw:
            return False
        await self._send(stream, connection, h11.EndOfMessage())
        return True

    async def _body(self, stream, connection, path: str, piece: bytes, raw: bool) -> None:
        if not piece:
            return
        if raw:
            await stream.send_all(piece)
        else:
            await self._send(stream, connection, h11.Data(data=piece))
        self.bytes_served[path] += len(piece)

    async def _send(self, stream, connection, event) -> None:
        data = connection.send(event)
        if data:
            await stream.send_all(data)


def _parse_range(header: str, total: int) -> tuple[int, int] | str | None:
    """Return ``(start, end)`` (end exclusive), ``"unsatisfiable"``, or None to ignore."""
    match = _RANGE.fullmatch(header.strip())
    if match is None or (not match[1] and not match[2]):
        return None
    if not match[1]:
        suffix = int(match[2])
        if suffix == 0:
            return "unsatisfiable"
        return max(0, total - suffix), total
    start = int(match[1])
    end = total if not match[2] else int(match[2]) + 1
    if match[2] and end <= start:
        return None
    if start >= total:
        return "unsatisfiable"
    return start, min(end, total)


async def _entity(file: ServedFile, start: int, end: int) -> AsyncIterator[bytes]:
    """Yield the bytes ``[start, end)`` of ``file.data + file.extra`` in 64 KiB pieces."""
    size = file.file_size()
    middle = size // 2
    position = start
    handle = await trio.open_file(file.data, "rb") if isinstance(file.data, Path) else None
    try:
        while position < end:
            if position < size:
                want = min(end, size, position + _DISK_READ) - position
                if handle is None:
                    block = bytes(file.data[position : position + want])
                else:
                    await handle.seek(position)
                    block = await handle.read(want)
                    if len(block) != want:
                        raise OSError(f"{file.data} shrank while being served")
                if file.corrupt and position <= middle < position + len(block):
                    flipped = bytearray(block)
                    flipped[middle - position] ^= 0xFF
                    block = bytes(flipped)
            else:
                block = file.extra[position - size : end - size]
            for offset in range(0, len(block), CHUNK):
                yield block[offset : offset + CHUNK]
            position += len(block)
    finally:
        if handle is not None:
            await handle.aclose()


@asynccontextmanager
async def open_https_server(
    ca: trustme.CA, routes: Mapping[str, Route | Handler] | None = None
) -> AsyncIterator[HttpsServer]:
    """Start an :class:`HttpsServer` for ``ca`` on loopback; stop it on exit."""
    server = HttpsServer(ca, routes)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


class ScriptedResolver(trio.abc.HostnameResolver):
    """A name resolver that answers from a script: a rebinding name, for tests.

    ``answers`` maps a host name to the addresses given on its first, second, ...
    lookup (the last one repeats). Install it with :func:`resolving_with`; every
    lookup is recorded in :attr:`lookups` as ``(host, address)``.
    """

    def __init__(self, answers: Mapping[str, Sequence[str]]) -> None:
        self.answers = {host: list(addresses) for host, addresses in answers.items()}
        self.lookups: list[tuple[str, str]] = []

    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode("ascii") if isinstance(host, bytes) else host
        script = self.answers.get(name)
        if not script:
            raise socket.gaierror(socket.EAI_NONAME, f"{name} is not in the script")
        address = script.pop(0) if len(script) > 1 else script[0]
        self.lookups.append((name, address))
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    async def getnameinfo(self, sockaddr, flags):
        raise NotImplementedError


@contextmanager
def resolving_with(resolver: trio.abc.HostnameResolver) -> Iterator[None]:
    """Make ``resolver`` trio's name resolver in this run, then restore the previous one."""
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        yield
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
