"""The shared executor pieces in ficc_core: the protocol, fences, errors, the endpoint action."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from ficc_executor_container.provider import ContainerProvider
from ficc_executor_process.provider import ProcessProvider

import ficc_core
from ficc_core import (
    BodyChunk,
    EndOfStream,
    EndpointContract,
    EndpointStreams,
    ExecutorError,
    ExecutorProvider,
    Fence,
    ResponseHead,
    StaleFence,
    UnknownAttempt,
    check_fence,
)


def _fence(generation: int = 1, attempt_id: str = "a-1") -> Fence:
    return Fence(attempt_id=attempt_id, generation=generation, plan_digest="sha256:" + "ab" * 32)


@pytest.mark.parametrize("provider_class", [ProcessProvider, ContainerProvider])
def test_built_in_providers_implement_the_protocol(provider_class, tmp_path):
    assert isinstance(provider_class(state_dir=tmp_path), ExecutorProvider)
    assert provider_class.API_VERSION == 1


def test_every_executor_error_has_its_own_code():
    classes = [
        getattr(ficc_core, name)
        for name in ficc_core.__all__
        if isinstance(getattr(ficc_core, name), type)
        and issubclass(getattr(ficc_core, name), ExecutorError)
    ]
    codes = [cls.code for cls in classes]
    assert len(classes) >= 12
    assert len(codes) == len(set(codes))
    assert {"stale_fence", "unknown_attempt", "path_not_admitted", "isolation_unavailable"} <= set(
        codes
    )


def test_a_fence_must_match_generation_and_plan():
    known = {"a-1": _fence()}
    check_fence(known, _fence())
    with pytest.raises(StaleFence):
        check_fence(known, _fence(generation=2))
    with pytest.raises(UnknownAttempt):
        check_fence(known, _fence(attempt_id="a-2"))


async def _one_big_response(stream: trio.SocketStream) -> None:
    # A minimal engine: read the request head, answer with one 1 MiB body.
    request = b""
    while b"\r\n\r\n" not in request:
        request += await stream.receive_some(65536)
    body = b"y" * (1024 * 1024)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n"
        b"Content-Type: text/plain\r\nX-Engine: 1\r\n\r\n" % len(body)
    )
    await stream.send_all(head + body)
    await stream.aclose()


@pytest.mark.deadline(40)
async def test_a_large_body_comes_back_in_chunks_of_at_most_64_kib():
    directory = Path(tempfile.mkdtemp(prefix="fe-", dir="/tmp"))
    path = str(directory / "engine.sock")
    listener_socket = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener_socket.bind(path)
    listener_socket.listen()
    listener = trio.SocketListener(listener_socket)
    streams = EndpointStreams()
    fence = _fence()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, _one_big_response, [listener])
                await nursery.start(streams.run)
                streams.attach(
                    fence, EndpointContract.unix(["/big"]), partial(trio.open_unix_socket, path)
                )
                await streams.open(fence, "s", "GET", "/big", {"Authorization": "Bearer x"}, b"")
                head = await streams.read(fence, "s")
                sizes = []
                while not isinstance(event := await streams.read(fence, "s"), EndOfStream):
                    assert isinstance(event, BodyChunk), event
                    assert streams.held(fence, "s") <= 4
                    sizes.append(len(event.data))
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert isinstance(head, ResponseHead) and head.status == 200
    names = {name.lower() for name, _ in head.headers}
    assert "x-engine" in names and "content-length" not in names and "connection" not in names
    assert sum(sizes) == 1024 * 1024
    assert max(sizes) <= 64 * 1024


class _KeepAliveEngine:
    """An HTTP/1.1 engine that keeps connections open, numbering them.

    With ``close_after_answer``, it closes each connection right after answering
    without saying so (as an engine's idle-connection timeout does).
    """

    def __init__(self, *, close_after_answer: bool = False, slow: bool = False) -> None:
        self.connections = 0
        self.close_after_answer = close_after_answer
        self.slow = slow

    async def __call__(self, stream: trio.SocketStream) -> None:
        import h11

        self.connections += 1
        number = self.connections
        conn = h11.Connection(h11.SERVER)
        answered = 0
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    answered += 1
                    body = f"connection {number} request {answered}".encode()
                    if self.slow:
                        await stream.send_all(
                            conn.send(h11.Response(status_code=200, headers=[]))
                            + conn.send(h11.Data(data=b"x" * 65536))
                        )
                        await trio.sleep_forever()
                    await stream.send_all(
                        conn.send(
                            h11.Response(
                                status_code=200, headers=[("content-length", str(len(body)))]
                            )
                        )
                        + conn.send(h11.Data(data=body))
                        + conn.send(h11.EndOfMessage())
                    )
                    if self.close_after_answer:
                        return
                elif isinstance(event, h11.EndOfMessage):
                    conn.start_next_cycle()
                elif not isinstance(event, h11.Data):
                    return
        except (trio.BrokenResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()


async def _answers(engine: _KeepAliveEngine, count: int, *, cancel_first: bool = False):
    directory = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    path = str(directory / "engine.sock")
    listener_socket = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener_socket.bind(path)
    listener_socket.listen()
    listener = trio.SocketListener(listener_socket)
    streams = EndpointStreams()
    fence = _fence()
    answers = []
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, engine, [listener])
                await nursery.start(streams.run)
                streams.attach(
                    fence, EndpointContract.unix(["/chat"]), partial(trio.open_unix_socket, path)
                )
                if cancel_first:
                    await streams.open(fence, "cut", "POST", "/chat", {}, b"{}")
                    assert isinstance(await streams.read(fence, "cut"), ResponseHead)
                    await streams.cancel(fence, "cut")
                    engine.slow = False
                for index in range(count):
                    await streams.open(fence, f"s{index}", "POST", "/chat", {}, b"{}")
                    body = b""
                    while not isinstance(
                        event := await streams.read(fence, f"s{index}"), EndOfStream
                    ):
                        if isinstance(event, BodyChunk):
                            body += event.data
                        else:
                            assert isinstance(event, ResponseHead), event
                    answers.append(body.decode())
                streams.detach(fence.attempt_id)
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return answers


async def test_engine_connections_are_kept_open_between_requests():
    engine = _KeepAliveEngine()
    answers = await _answers(engine, 5)
    assert answers == [f"connection 1 request {n}" for n in range(1, 6)]
    assert engine.connections == 1


async def test_a_connection_the_engine_closed_while_idle_is_replaced_and_the_request_sent_again():
    engine = _KeepAliveEngine(close_after_answer=True)
    answers = await _answers(engine, 3)
    # Each reuse finds the connection closed, so each request goes out on a new one.
    assert answers == [f"connection {n} request 1" for n in range(1, 4)]
    assert engine.connections == 3


async def test_a_cancelled_stream_never_leaves_its_connection_for_reuse():
    engine = _KeepAliveEngine(slow=True)
    answers = await _answers(engine, 2, cancel_first=True)
    # The cut connection was closed; the next requests share a new one.
    assert answers == ["connection 2 request 1", "connection 2 request 2"]


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/chat?q=1 HTTP/1.1\r\nhost: x\r\n\r\nPOST /chat", {}),
        ("/chat", {"x-request-id": "1\r\nauthorization: Bearer stolen"}),
        ("/chat", {"content-type": "application/json\0"}),
    ],
)
async def test_a_request_that_would_split_on_the_engine_socket_is_refused_before_it_is_sent(
    path: str, headers: dict[str, str]
) -> None:
    connected = []

    async def connect() -> trio.abc.Stream:
        connected.append(True)
        raise OSError("not reached")

    streams = EndpointStreams()
    fence = _fence()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(streams.run)
            streams.attach(fence, EndpointContract.unix(["/chat"]), connect)
            with pytest.raises(ficc_core.PathNotAdmitted, match="cannot be sent"):
                await streams.open(fence, "s1", "POST", path, headers, b"{}")
            # Nothing was opened: the ID is free and the engine was never dialled.
            await streams.open(fence, "s1", "POST", "/chat", {}, b"{}")
            assert isinstance(await streams.read(fence, "s1"), ficc_core.StreamFailed)
            assert connected == [True]
            nursery.cancel_scope.cancel()


async def _digest_of_the_body(stream: trio.abc.Stream) -> None:
    # An engine that reads the request slowly (4 KiB at a time), then answers with the
    # sha256 of the body it received.
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    size = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < size:
        body += await stream.receive_some(4096)
    answer = hashlib.sha256(body).hexdigest().encode()
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(answer) + answer
    )
    await stream.aclose()


async def _answer_of(streams: EndpointStreams, fence: Fence, body: bytes) -> bytes:
    await streams.open(fence, "s", "POST", "/digest", {}, body)
    head = await streams.read(fence, "s")
    assert isinstance(head, ResponseHead) and head.status == 200, head
    answer = b""
    while not isinstance(event := await streams.read(fence, "s"), EndOfStream):
        assert isinstance(event, BodyChunk), event
        answer += event.data
    return answer


@pytest.mark.deadline(40)
async def test_a_body_larger_than_the_socket_buffer_reaches_a_slow_engine_whole():
    # 8 MiB cannot go into a Unix socket's buffer at once: the pump waits for the
    # engine to read, many times, and every byte arrives in order.
    body = bytes(range(256)) * (32 * 1024)
    directory = Path(tempfile.mkdtemp(prefix="fd-", dir="/tmp"))
    path = str(directory / "engine.sock")
    listener_socket = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener_socket.bind(path)
    listener_socket.listen()
    streams, fence = EndpointStreams(), _fence()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    trio.serve_listeners,
                    _digest_of_the_body,
                    [trio.SocketListener(listener_socket)],
                )
                await nursery.start(streams.run)
                streams.attach(
                    fence, EndpointContract.unix(["/digest"]), partial(trio.open_unix_socket, path)
                )
                answer = await _answer_of(streams, fence, body)
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert answer.decode() == hashlib.sha256(body).hexdigest()


@pytest.mark.deadline(40)
async def test_a_connector_that_gives_no_socket_is_served_through_its_own_stream_methods():
    # A provider may connect through any trio stream (TLS, a relay); the endpoint action
    # then uses the stream's send_all and receive_some.
    body = b"x" * 300_000
    streams, fence = EndpointStreams(), _fence()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def connect() -> trio.abc.Stream:
                ours, engines = trio.testing.memory_stream_pair()
                nursery.start_soon(_digest_of_the_body, engines)
                return ours

            await nursery.start(streams.run)
            streams.attach(fence, EndpointContract.unix(["/digest"]), connect)
            answer = await _answer_of(streams, fence, body)
            nursery.cancel_scope.cancel()
    assert answer.decode() == hashlib.sha256(body).hexdigest()
