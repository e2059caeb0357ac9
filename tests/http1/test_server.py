"""HTTP/1.1 on llhttp (``ficc_core.http1.server``) under hypercorn's trio worker.

Each test serves a small ASGI app with hypercorn on 127.0.0.1 (a port the OS picks)
and speaks raw bytes to it over real sockets. Where the protocol must answer as
h11 did, the same bytes are sent to a second server of the same app with stock
hypercorn, and the answers are compared.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from trio_websocket import open_websocket_url

from ficc_core.http1.server import use_http1

pytestmark = pytest.mark.trio

LIMIT = 16 * 1024  # hypercorn's h11_max_incomplete_size


class App:
    """The ASGI app both servers run; it records the order in which requests start and end."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.release = trio.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            message = await receive()
            await send({"type": "websocket.send", "text": "echo:" + message.get("text", "")})
            await send({"type": "websocket.close"})
            return
        path = scope["path"]
        self.log.append("start " + path)
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if path == "/held":
            await self.release.wait()
        if path == "/stream":  # a streamed answer whose first chunk waits
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await self.release.wait()
            await send({"type": "http.response.body", "body": b"late"})
        elif path == "/chunks":  # no content-length: the protocol frames it
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"one,", "more_body": True})
            await send({"type": "http.response.body", "body": b"two"})
        elif path == "/split":
            bad = [(b"x-bad", b"a\r\nset-cookie: injected=1")]
            await send({"type": "http.response.start", "status": 200, "headers": bad})
            await send({"type": "http.response.body", "body": b"no"})
        elif path == "/overlong":
            headers = [(b"content-length", b"3")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"12345"})
        else:
            answer = json.dumps(
                {
                    "method": scope["method"],
                    "path": path,
                    "query": scope["query_string"].decode(),
                    "version": scope["http_version"],
                    "body": body.decode("latin-1"),
                    "headers": [[n.decode(), v.decode("latin-1")] for n, v in scope["headers"]],
                }
            ).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(answer)),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        self.log.append("end " + path)


@asynccontextmanager
async def served(
    app: App, *, ours: bool = True, keep_alive: float = 5.0, stop: trio.Event | None = None
):
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.keep_alive_timeout = keep_alive
    if ours:
        use_http1(config)
    stop = trio.Event() if stop is None else stop
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(
                app, config, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        host, port = urls[0].removeprefix("http://").rsplit(":", 1)
        try:
            yield host, int(port)
        finally:
            stop.set()


class Conn:
    """A raw client connection that reads whole responses."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""
        self.eof = False

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _more(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
        self.buffer += data

    async def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if self.eof:
                raise EOFError(self.buffer)
            await self._more()
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """One response: status, headers (lower-case names, the last value of each), body."""
        head = await self._until(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        status = int(status_line.split(b" ")[1])
        headers = {}
        for line in lines:
            name, _, value = line.partition(b":")
            headers[name.decode().lower()] = value.strip().decode("latin-1")
        if status < 200 or status in (204, 304):
            return status, headers, b""
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(self.buffer) < size and not self.eof:
                await self._more()
            body, self.buffer = self.buffer[:size], self.buffer[size:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(await self._until(b"\r\n"), 16)
                if size == 0:
                    await self._until(b"\r\n")
                    break
                while len(self.buffer) < size + 2:
                    await self._more()
                body += self.buffer[:size]
                self.buffer = self.buffer[size + 2 :]
        else:
            while not self.eof:
                await self._more()
            body, self.buffer = self.buffer, b""
        return status, headers, body

    async def closed(self) -> bool:
        """The server closed the connection (read to its end)."""
        while not self.eof:
            await self._more()
        return self.buffer == b""


@asynccontextmanager
async def connect(address):
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        yield Conn(stream)


async def answered(conn: Conn) -> None:
    """A plain request on ``conn``, answered: the connection is then kept alive and idle."""
    await conn.send(request("/ok"))
    assert (await conn.response())[0] == 200


def request(path: str = "/", method: str = "POST", body: bytes = b"", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


@pytest.mark.deadline(30)
async def test_keep_alive_serves_requests_one_after_another_on_one_connection():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            for n in range(3):
                await conn.send(request(f"/r{n}?q={n}", body=b"x" * n, extra="X-Trace:  t \r\n"))
                status, headers, body = await conn.response()
                answer = json.loads(body)
                assert status == 200
                assert (answer["path"], answer["query"], answer["body"]) == (
                    f"/r{n}",
                    f"q={n}",
                    "x" * n,
                )
                assert ["x-trace", "t"] in answer["headers"]  # names lower-cased, values trimmed
                assert headers["server"] == "hypercorn-h11" and headers["date"].endswith("GMT")
                assert "connection" not in headers


@pytest.mark.deadline(30)
async def test_an_idle_kept_alive_connection_closes_after_the_keep_alive_timeout():
    app = App()
    with trio.fail_after(20):
        async with served(app, keep_alive=0.5) as address, connect(address) as conn:
            for _ in range(3):  # busy, then idle for less than the timeout: kept
                await conn.send(request("/ok"))
                assert (await conn.response())[0] == 200
            idle_from = trio.current_time()
            assert await conn.closed()
            assert trio.current_time() - idle_from >= 0.5


@pytest.mark.deadline(30)
async def test_shutdown_closes_an_idle_connection_at_once_and_a_busy_one_after_its_answer():
    app = App()
    stop = trio.Event()
    with trio.fail_after(20):
        async with served(app, keep_alive=75, stop=stop) as address:
            async with connect(address) as idle, connect(address) as busy:
                await answered(idle)
                await busy.send(request("/held"))
                await trio.testing.wait_all_tasks_blocked()
                stop.set()
                assert await idle.closed()  # long before the 75 s timeout
                app.release.set()
                status, headers, _ = await busy.response()
                assert status == 200 and headers["connection"] == "close"
                assert await busy.closed()


@pytest.mark.deadline(30)
async def test_pipelined_requests_are_answered_in_order_and_the_next_starts_after_the_last_ended():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(request("/held") + request("/second") + request("/third"))
            await trio.testing.wait_all_tasks_blocked()
            assert app.log == ["start /held"]  # the pipelined ones wait their turn
            app.release.set()
            paths = [json.loads((await conn.response())[2])["path"] for _ in range(3)]
    assert paths == ["/held", "/second", "/third"]
    assert app.log == [f"{step} {path}" for path in paths for step in ("start", "end")]


@pytest.mark.deadline(30)
async def test_a_chunked_request_body_arrives_whole_and_an_unframed_answer_is_chunked():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(
                b"POST /echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"
            )
            await conn.send(b"2\r\nde\r\n0\r\n\r\n")
            status, _, body = await conn.response()
            assert status == 200 and json.loads(body)["body"] == "abcde"
            await conn.send(request("/chunks"))
            status, headers, body = await conn.response()
            assert headers["transfer-encoding"] == "chunked" and body == b"one,two"


@pytest.mark.deadline(30)
async def test_a_streamed_answer_s_head_is_sent_before_its_first_chunk():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(request("/stream"))
            head = await conn._until(b"\r\n\r\n")  # while the body waits
            assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
            app.release.set()
            assert await conn._until(b"0\r\n\r\n") == b"4\r\nlate\r\n"


@pytest.mark.deadline(30)
async def test_http_1_0_carries_one_request_and_an_unframed_answer_ends_with_the_connection():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(b"GET /chunks HTTP/1.0\r\n\r\n")
            status, headers, body = await conn.response()  # read to the close
            assert (status, body, headers["connection"]) == (200, b"one,two", "close")
            assert "transfer-encoding" not in headers
        async with served(app) as address, connect(address) as conn:
            await conn.send(b"GET /echo HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            status, headers, body = await conn.response()
            assert json.loads(body)["version"] == "1.0" and headers["connection"] == "close"
            assert await conn.closed()


@pytest.mark.deadline(30)
async def test_connection_close_from_the_client_closes_after_the_answer():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(request("/a", extra="Connection: close\r\n") + request("/never"))
            status, headers, _ = await conn.response()
            assert status == 200 and headers["connection"] == "close"
            assert await conn.closed()
    assert "start /never" not in app.log


@pytest.mark.deadline(30)
async def test_expect_100_continue_is_answered_before_the_body_is_sent():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(
                b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
            )
            status, _, _ = await conn.response()
            assert status == 100
            await conn.send(b"body")
            status, _, body = await conn.response()
            assert status == 200 and json.loads(body)["body"] == "body"


@pytest.mark.deadline(30)
async def test_head_answers_the_headers_without_the_body():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(b"HEAD /h HTTP/1.1\r\nhost: t\r\n\r\n" + request("/next"))
            head = await conn._until(b"\r\n\r\n")
            assert b"content-length: " in head.lower()
            status, _, body = await conn.response()  # the next answer follows at once
            assert status == 200 and json.loads(body)["path"] == "/next"


@pytest.mark.deadline(30)
async def test_a_response_header_that_would_split_the_response_is_refused():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(request("/split"))
            status, headers, _ = await conn.response()
            assert status == 500 and "set-cookie" not in headers


@pytest.mark.deadline(30)
async def test_an_answer_longer_than_its_content_length_is_not_sent_and_the_connection_closed():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(request("/overlong"))
            # Its head waited for the body, which was refused whole: nothing of it is sent,
            # so nothing of it can be read as the start of a next answer.
            assert await conn.closed()


@pytest.mark.deadline(30)
async def test_a_malformed_request_on_a_kept_alive_connection_is_answered_400_and_closed():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await answered(conn)
            await conn.send(b"GET / HTTP/1.1\r\nbad header: x\r\n\r\n")
            status, headers, _ = await conn.response()
            assert (status, headers["connection"]) == (400, "close")
            assert await conn.closed()


@pytest.mark.deadline(30)
async def test_a_request_head_over_the_limit_is_answered_431_even_if_it_never_ends():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await answered(conn)
            await conn.send(b"GET / HTTP/1.1\r\nhost: t\r\nx-long: ")
            with pytest.raises(trio.BrokenResourceError):
                for _ in range(2 * LIMIT // 1024 + 8):  # a header value that never ends
                    await conn.send(b"a" * 1024)
                    await trio.lowlevel.checkpoint()
            status, _, _ = await conn.response()
            assert status == 431


@pytest.mark.deadline(30)
async def test_a_websocket_upgrade_is_served_first_on_a_connection_and_after_a_plain_request():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address:
            url = f"ws://{address[0]}:{address[1]}/ws"
            async with open_websocket_url(url) as ws:
                await ws.send_message("hi")
                assert await ws.get_message() == "echo:hi"
            async with connect(address) as conn:
                await conn.send(request("/plain"))
                assert (await conn.response())[0] == 200
                await conn.send(
                    b"GET /ws HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                    b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"sec-websocket-version: 13\r\n\r\n"
                )
                status, headers, _ = await conn.response()
                assert status == 101 and headers["upgrade"].lower() == "websocket"


@pytest.mark.deadline(30)
async def test_http2_with_prior_knowledge_is_still_served():
    app = App()
    with trio.fail_after(20):
        async with served(app) as address, connect(address) as conn:
            await conn.send(
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            )
            while len(conn.buffer) < 9:
                await conn._more()
            assert conn.buffer[3] == 0x04  # the server's SETTINGS frame


FIRST_REQUESTS = [
    b"get / HTTP/1.1\r\nhost: t\r\n\r\n",  # a method llhttp does not know
    b"FROB / HTTP/1.1\r\nhost: t\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",  # no host
    b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: t\r\nx: " + b"a" * (LIMIT + 10) + b"\r\n\r\n",
    b"GET / HTTP/1.1\nhost: t\n\n",
    b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabc",
    b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: gzip\r\n\r\n",
    b"GET / HTTP/9.9\r\nhost: t\r\n\r\n",
    b"GET /\x00 HTTP/1.1\r\nhost: t\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: t\r\nupgrade: h2c\r\nconnection: Upgrade, HTTP2-Settings\r\n"
    b"http2-settings: AAMAAABkAAQAAP__\r\n\r\n",
]


@pytest.mark.parametrize("data", FIRST_REQUESTS, ids=range(len(FIRST_REQUESTS)))
@pytest.mark.deadline(42)
async def test_a_connection_s_first_request_that_is_not_plain_gets_the_answer_h11_gave(data):
    async def answer(ours: bool) -> tuple[bytes, list[str]]:
        app = App()
        async with served(app, ours=ours) as address, connect(address) as conn:
            await conn.send(data)
            with trio.move_on_after(2):  # the answers that keep the connection open
                while not conn.eof:
                    await conn._more()
        head, _, body = conn.buffer.partition(b"\r\n\r\n")
        lines = [line for line in head.split(b"\r\n") if not line.startswith(b"date:")]
        if head.startswith(b"HTTP/1.1 101 "):
            body = b""  # HTTP/2 frames, the date in them compressed
        return lines, body, app.log

    with trio.fail_after(30):
        assert await answer(True) == await answer(False)
