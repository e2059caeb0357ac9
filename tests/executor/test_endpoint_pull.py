"""The endpoint action's reader-driven exchanges (:mod:`ficc_core.executor.engine_pull`):
a request that goes whole onto an idle kept-alive connection is read by its reader, with
no task of its own, and keeps every guarantee the task gives."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import h11
import pytest
import trio
import trio.testing

from ficc_core import (
    BodyChunk,
    EndOfStream,
    EndpointContract,
    EndpointStreams,
    Fence,
    ResponseHead,
    StreamFailed,
)


def _fence() -> Fence:
    return Fence(attempt_id="a-1", generation=1, plan_digest="sha256:" + "ab" * 32)


class _DigestEngine:
    """A kept-alive HTTP/1.1 engine answering each request with the sha256 of its body
    and the number of its connection; it holds an answer while ``hold`` is set."""

    def __init__(self) -> None:
        self.connections = 0
        self.hold: trio.Event | None = None
        self.holding = trio.Event()
        #: Close the connection on the next request instead of answering it (an idle
        #: timeout that struck as the request arrived).
        self.drop_next = False

    async def __call__(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        number = self.connections
        conn = h11.Connection(h11.SERVER)
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    if self.drop_next:
                        self.drop_next = False
                        return
                    if self.hold is not None:
                        self.holding.set()
                        await self.hold.wait()
                    answer = f"{number} {hashlib.sha256(body).hexdigest()}".encode()
                    body = b""
                    await stream.send_all(
                        conn.send(
                            h11.Response(
                                status_code=200, headers=[("content-length", str(len(answer)))]
                            )
                        )
                        + conn.send(h11.Data(data=answer))
                        + conn.send(h11.EndOfMessage())
                    )
                    conn.start_next_cycle()
                elif not isinstance(event, h11.Request):
                    return
        except (trio.BrokenResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()


@asynccontextmanager
async def _serving(engine: _DigestEngine) -> AsyncIterator[tuple[EndpointStreams, Fence]]:
    directory = Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))
    path = str(directory / "engine.sock")
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(path)
    listener.listen()
    streams, fence = EndpointStreams(), _fence()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, engine, [trio.SocketListener(listener)])
            await nursery.start(streams.run)
            streams.attach(
                fence, EndpointContract.unix(["/digest"]), partial(trio.open_unix_socket, path)
            )
            yield streams, fence
            streams.detach(fence.attempt_id)
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _answer(streams: EndpointStreams, fence: Fence, stream_id: str, body: bytes) -> str:
    await streams.open(fence, stream_id, "POST", "/digest", {}, body)
    head = await streams.read(fence, stream_id)
    assert isinstance(head, ResponseHead) and head.status == 200, head
    answer = b""
    while not isinstance(event := await streams.read(fence, stream_id), EndOfStream):
        assert isinstance(event, BodyChunk), event
        answer += event.data
    return answer.decode()


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class _Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


@pytest.mark.deadline(30)
async def test_a_request_on_an_idle_connection_is_read_by_its_reader_with_no_task() -> None:
    engine = _DigestEngine()
    with trio.fail_after(20):
        async with _serving(engine) as (streams, fence):
            assert await _answer(streams, fence, "s0", b"first") == f"1 {_digest(b'first')}"
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                for index in range(1, 4):
                    body = b"n" * index
                    answer = await _answer(streams, fence, f"s{index}", body)
                    assert answer == f"1 {_digest(body)}"
            finally:
                trio.lowlevel.remove_instrument(spawns)
    # The first request dialled (a task sent it); the next three reused its connection
    # and started no task at all.
    assert engine.connections == 1
    assert spawns.names == []


@pytest.mark.deadline(40)
async def test_a_request_larger_than_the_socket_buffer_on_a_reused_connection_arrives_whole():
    # The kernel takes part of it at once; a task sends the rest on the same connection.
    engine = _DigestEngine()
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB
    with trio.fail_after(30):
        async with _serving(engine) as (streams, fence):
            await _answer(streams, fence, "warm", b"")
            assert await _answer(streams, fence, "big", body) == f"1 {_digest(body)}"
            assert await _answer(streams, fence, "after", b"x") == f"1 {_digest(b'x')}"
    assert engine.connections == 1


@pytest.mark.deadline(30)
async def test_a_reader_cancelled_while_the_engine_thinks_leaves_the_answer_for_the_next_read():
    engine = _DigestEngine()
    with trio.fail_after(20):
        async with _serving(engine) as (streams, fence):
            await _answer(streams, fence, "warm", b"")
            engine.hold = trio.Event()
            await streams.open(fence, "s", "POST", "/digest", {}, b"late")
            with trio.move_on_after(0.05) as waited:
                await streams.read(fence, "s")
            assert waited.cancelled_caught  # nothing came: the engine holds its answer
            engine.hold.set()
            head = await streams.read(fence, "s")
            chunk = await streams.read(fence, "s")
            assert isinstance(head, ResponseHead) and isinstance(chunk, BodyChunk)
            assert chunk.data.decode() == f"1 {_digest(b'late')}"
            assert isinstance(await streams.read(fence, "s"), EndOfStream)
            engine.hold = None
            # The connection went back to the pool and serves the next request.
            assert await _answer(streams, fence, "next", b"y") == f"1 {_digest(b'y')}"
    assert engine.connections == 1


@pytest.mark.deadline(30)
async def test_cancelling_a_stream_wakes_its_waiting_reader_and_drops_the_connection():
    engine = _DigestEngine()
    with trio.fail_after(20):
        async with _serving(engine) as (streams, fence):
            await _answer(streams, fence, "warm", b"")
            engine.hold = trio.Event()
            await streams.open(fence, "cut", "POST", "/digest", {}, b"never")
            got: list[object] = []

            async def reader() -> None:
                got.append(await streams.read(fence, "cut"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await engine.holding.wait()
                await trio.testing.wait_all_tasks_blocked()
                await streams.cancel(fence, "cut")
            engine.hold.set()
            engine.hold = None
            assert len(got) == 1 and isinstance(got[0], StreamFailed)
            assert got[0].code == "cancelled"
            # The cut connection is not reused: the next request dials a new one.
            assert await _answer(streams, fence, "next", b"z") == f"2 {_digest(b'z')}"


@pytest.mark.deadline(30)
async def test_a_reused_connection_closed_as_the_request_arrived_is_replaced_and_it_sent_again():
    engine = _DigestEngine()
    with trio.fail_after(20):
        async with _serving(engine) as (streams, fence):
            await _answer(streams, fence, "warm", b"")
            engine.drop_next = True
            # The kernel took the request on connection 1; its reader finds it closed
            # before any answer, so the request goes again on a new connection, once.
            assert await _answer(streams, fence, "s", b"again") == f"2 {_digest(b'again')}"
            assert await _answer(streams, fence, "next", b"k") == f"2 {_digest(b'k')}"
    assert engine.connections == 2
