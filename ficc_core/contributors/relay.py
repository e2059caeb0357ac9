"""The endpoint action relayed over a node connection: open, read, cancel, multiplexed.

The controller's side (:class:`RelayEndpoint`) offers the same ``open`` / ``read`` /
``cancel`` as a local provider; the agent's side (:class:`RelayServer`) runs them
on its :class:`~ficc_core.agent.Agent`. Each stream is a numbered *channel* on the
node's one WebSocket. Control messages are JSON text (``{"type": "relay", "ch":
N, ...}``); bytes travel in binary frames, ``struct "!BI"`` (kind, channel)
followed by at most 64 KiB of payload:

- controller → agent: kind 2 (a piece of a request body), then ``op: "open"``
  with the fence, stream ID, method, path, headers and ``body_length``;
  ``op: "credit"`` (``n``: events the controller has read and may take again);
  ``op: "cancel"``;
- agent → controller: ``event: "opened"`` or ``"refused"`` (with ``error``), then
  ``"head"``, kind 1 frames (body chunks), then ``"end"`` or ``"failed"``;
  ``"cancelled"`` acknowledges a cancel.

**Backpressure.** The agent reads from its provider only while it holds credit:
:data:`WINDOW` events per channel, one more for each event the controller's
reader took. A controller that does not read leaves the agent not reading, the
provider's four-event queue full and the engine's writes blocked; each side
holds at most ``WINDOW`` events per stream. Nothing here waits on the receive
loops, which only append and wake, so heartbeats and lease renewals on the same
connection never wait behind a stream.

**Peer loss.** When the connection ends, every open stream on the controller
reads :class:`StreamFailed` (``peer_lost``) after what it had already received,
and nothing is replayed; on the agent every relayed stream is cancelled, which
closes the engine connection.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import FiccError
from ..executor import errors as executor_errors
from ..executor.endpoint import CHUNK_SIZE
from ..executor.types import BodyChunk, EndOfStream, ReadEvent, ResponseHead, StreamFailed
from ..schema import Fence, structure, unstructure

if TYPE_CHECKING:
    from ..agent import Agent

log = logging.getLogger("ficc.contributors")

#: Events a stream may have in flight between agent and controller (and queued on each).
WINDOW = 4
#: Relayed streams one connection may have open at once.
MAX_CHANNELS = 256
#: The largest request body relayed (the executor's own bound).
MAX_BODY = 16 * 1024 * 1024
#: Binary frame kinds.
KIND_CHUNK = 1
KIND_BODY = 2
_HEADER = struct.Struct("!BI")
_TERMINAL = (EndOfStream, StreamFailed)

Send = Callable[[str | bytes], Awaitable[None]]


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _HEADER.pack(kind, channel) + payload


def _error_wire(exc: FiccError) -> dict[str, Any]:
    return {"code": exc.code, "message": exc.message, "status": exc.status}


def error_from_wire(error: Mapping[str, Any]) -> FiccError:
    """The executor error a node reported, as its own class when it is one we know."""
    code = str(error.get("code", "node_error"))
    message = str(error.get("message", "the node refused the request"))
    for name in executor_errors.__all__:
        cls = getattr(executor_errors, name)
        if getattr(cls, "code", None) == code:
            return cls(message)
    return FiccError(message, code=code, status=int(error.get("status", 502)))


def _event_to_wire(channel: int, event: ReadEvent) -> str | bytes:
    if isinstance(event, BodyChunk):
        return _frame(KIND_CHUNK, channel, event.data)
    if isinstance(event, ResponseHead):
        body: dict[str, Any] = {
            "event": "head",
            "status": event.status,
            "headers": [list(pair) for pair in event.headers],
        }
    elif isinstance(event, EndOfStream):
        body = {"event": "end"}
    else:
        body = {"event": "failed", "code": event.code, "message": event.message}
    return json.dumps({"type": "relay", "ch": channel, **body})


# -- the controller's side --------------------------------------------------------------------


@attrs.define(eq=False)
class _Channel:
    id: int
    fence: Fence
    stream_id: str
    events: deque[ReadEvent] = attrs.field(factory=deque)
    readers: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    opened: trio.Event = attrs.field(factory=trio.Event)
    refused: FiccError | None = None
    acknowledged: trio.Event = attrs.field(factory=trio.Event)
    ended: bool = False  # a terminal event is queued
    last_read: float = attrs.field(factory=trio.current_time)

    def push(self, event: ReadEvent) -> None:
        if self.ended:
            return
        self.events.append(event)
        self.ended = isinstance(event, _TERMINAL)
        self.readers.unpark_all()


class RelayEndpoint:
    """The endpoint action of one remote node, relayed over its connection.

    ``open``, ``read`` and ``cancel`` behave as a provider's do. Outgoing messages
    go through one sender task (:meth:`run`), so no caller is ever cancelled half
    way through a WebSocket write.

    :param send: sends one message on the connection.
    :param open_timeout: seconds ``open`` waits for the node's answer.
    :param idle_timeout: seconds an open stream may go without a ``read`` before it
        is closed (as a provider closes its own), so an abandoned stream holds
        nothing here.
    """

    def __init__(
        self, send: Send, *, open_timeout: float = 60.0, idle_timeout: float = 60.0
    ) -> None:
        self._send = send
        self.open_timeout = open_timeout
        self.idle_timeout = idle_timeout
        self._outbox_in, self._outbox = trio.open_memory_channel[str | bytes](math.inf)
        self._channels: dict[int, _Channel] = {}
        self._streams: dict[tuple[str, str], _Channel] = {}
        self._next = 0
        self._closed = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send queued messages in order, and close idle streams, until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire_idle)
            task_status.started()
            async for message in self._outbox:
                await self._send(message)
            nursery.cancel_scope.cancel()

    async def _expire_idle(self) -> None:
        while True:
            await trio.sleep(min(max(self.idle_timeout / 4, 0.01), 1.0))
            deadline = trio.current_time() - self.idle_timeout
            for channel in list(self._streams.values()):
                if channel.opened.is_set() and channel.last_read < deadline:
                    self._forget(channel)
                    self._control(channel, op="cancel")

    def _post(self, message: str | bytes) -> None:
        if not self._closed:
            self._outbox_in.send_nowait(message)

    def _control(self, channel: _Channel, **fields: Any) -> None:
        self._post(json.dumps({"type": "relay", "ch": channel.id, **fields}))

    def _forget(self, channel: _Channel) -> None:
        self._channels.pop(channel.id, None)
        if self._streams.get((channel.fence.attempt_id, channel.stream_id)) is channel:
            del self._streams[(channel.fence.attempt_id, channel.stream_id)]

    def _channel(self, fence: Fence, stream_id: str) -> _Channel:
        channel = self._streams.get((fence.attempt_id, stream_id))
        if channel is None:
            raise executor_errors.UnknownStream(
                f"stream {stream_id!r} is not open on attempt {fence.attempt_id!r} "
                "(it ended, was cancelled or expired, or the node's connection closed)",
                details={"stream_id": stream_id},
            )
        if channel.fence != fence:
            raise executor_errors.StaleFence(
                f"the fence for attempt {fence.attempt_id!r} is stale: the stream was opened "
                f"for generation {channel.fence.generation}",
                details={"attempt_id": fence.attempt_id, "generation": fence.generation},
            )
        return channel

    @property
    def open_streams(self) -> int:
        """How many relayed streams are open."""
        return len(self._channels)

    def held(self, fence: Fence, stream_id: str) -> int:
        """How many events the controller holds for the stream (never more than WINDOW)."""
        return len(self._channel(fence, stream_id).events)

    async def open(
        self,
        fence: Fence,
        stream_id: str,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]] | Mapping[str, str],
        body: bytes = b"",
        *,
        input_id: str | None = None,
    ) -> None:
        """Open a stream on the node's engine; raise the node's refusal as it is."""
        if self._closed:
            raise _gone()
        if (fence.attempt_id, stream_id) in self._streams:
            raise executor_errors.StreamExists(
                f"stream {stream_id!r} is already open on attempt {fence.attempt_id!r}",
                details={"stream_id": stream_id},
            )
        if len(self._channels) >= MAX_CHANNELS:
            raise executor_errors.TooManyStreams(
                f"this node already has {MAX_CHANNELS} relayed streams open",
                details={"max_streams": MAX_CHANNELS},
            )
        if len(body) > MAX_BODY:
            raise executor_errors.PathNotAdmitted(
                f"the request body has {len(body)} bytes; at most {MAX_BODY} are admitted",
                code="payload_too_large",
                status=413,
            )
        self._next += 1
        channel = _Channel(self._next, fence, stream_id)
        self._channels[channel.id] = channel
        self._streams[(fence.attempt_id, stream_id)] = channel
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        data = bytes(body)
        for start in range(0, len(data), CHUNK_SIZE):
            self._post(_frame(KIND_BODY, channel.id, data[start : start + CHUNK_SIZE]))
        self._control(
            channel,
            op="open",
            fence=unstructure(fence),
            stream_id=stream_id,
            method=method,
            path=path,
            headers=[[str(name), str(value)] for name, value in pairs],
            body_length=len(data),
            input_id=input_id,
            window=WINDOW,
        )
        done = False
        try:
            with trio.move_on_after(self.open_timeout):
                await channel.opened.wait()
            if not channel.opened.is_set():
                raise FiccError(
                    f"the node did not answer the open within {self.open_timeout:g} s",
                    code="node_timeout",
                    status=504,
                )
            if channel.refused is not None:
                raise channel.refused
            done = True
        finally:
            if not done:
                self._forget(channel)
                if channel.refused is None and not self._closed:
                    self._control(channel, op="cancel")

    async def read(self, fence: Fence, stream_id: str) -> ReadEvent:
        """Return the stream's next event, as a provider's ``read`` does."""
        channel = self._channel(fence, stream_id)
        channel.last_read = math.inf  # a waiting reader is not idle
        try:
            while not channel.events:
                await channel.readers.park()
        finally:
            channel.last_read = trio.current_time()
        event = channel.events.popleft()
        if isinstance(event, _TERMINAL):
            self._forget(channel)
        else:
            self._control(channel, op="credit", n=1)
        return event

    async def cancel(self, fence: Fence, stream_id: str) -> None:
        """Close the stream; return once the node closed its engine connection (or is gone)."""
        channel = self._channel(fence, stream_id)
        self._forget(channel)
        channel.push(StreamFailed(code="cancelled", message="the stream was cancelled"))
        self._control(channel, op="cancel")
        self._channels[channel.id] = channel  # until acknowledged, to match the answer
        try:
            with trio.move_on_after(self.open_timeout):
                await channel.acknowledged.wait()
        finally:
            self._channels.pop(channel.id, None)

    # -- what the connection's receive loop hands over (never blocks) --------------------------

    def deliver(self, message: Mapping[str, Any]) -> None:
        """Take one JSON relay message from the agent."""
        channel = self._channels.get(int(message.get("ch", 0)))
        if channel is None:
            return  # a cancelled or forgotten stream: drop it
        event = message.get("event")
        if event == "opened":
            channel.opened.set()
        elif event == "refused":
            channel.refused = error_from_wire(message.get("error") or {})
            channel.opened.set()
        elif event == "cancelled":
            channel.acknowledged.set()
        elif event == "head":
            self._event(
                channel,
                ResponseHead(
                    status=int(message["status"]),
                    headers=tuple((str(k), str(v)) for k, v in message.get("headers", ())),
                ),
            )
        elif event == "end":
            self._event(channel, EndOfStream())
        elif event == "failed":
            self._event(
                channel,
                StreamFailed(code=str(message.get("code")), message=str(message.get("message"))),
            )

    def deliver_binary(self, data: bytes) -> None:
        """Take one binary frame from the agent (a body chunk)."""
        if len(data) < _HEADER.size:
            return
        kind, number = _HEADER.unpack_from(data)
        channel = self._channels.get(number)
        if kind == KIND_CHUNK and channel is not None:
            payload = data[_HEADER.size :]
            if len(payload) > CHUNK_SIZE:
                self._fail(channel, "relay_violation", "the node sent a chunk over 64 KiB")
                return
            self._event(channel, BodyChunk(payload))

    def _event(self, channel: _Channel, event: ReadEvent) -> None:
        if self._streams.get((channel.fence.attempt_id, channel.stream_id)) is not channel:
            return  # cancelled: waiting only for the acknowledgement
        if len(channel.events) >= WINDOW:
            self._fail(channel, "relay_violation", "the node sent more than its window")
            return
        channel.push(event)

    def _fail(self, channel: _Channel, code: str, message: str) -> None:
        channel.events.clear()
        channel.push(StreamFailed(code=code, message=message))
        self._control(channel, op="cancel")

    def close(self) -> None:
        """Peer loss: end every open stream with ``peer_lost``, replaying nothing."""
        if self._closed:
            return
        self._closed = True
        self._outbox_in.close()
        for channel in list(self._channels.values()):
            channel.push(StreamFailed(code="peer_lost", message="the node's connection closed"))
            channel.refused = channel.refused or _gone()
            channel.opened.set()
            channel.acknowledged.set()


def _gone() -> FiccError:
    return FiccError("the node's connection closed", code="node_unavailable", status=409)


# -- the agent's side ---------------------------------------------------------------------------


@attrs.define(eq=False)
class _Relayed:
    id: int
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    credit: int = WINDOW
    more: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    body: bytearray = attrs.field(factory=bytearray)
    started: bool = False


class RelayServer:
    """Run relayed endpoint streams on an agent for one connection.

    :meth:`deliver` and :meth:`deliver_binary` take what the receive loop got and
    never block; streams run as tasks in :meth:`run`'s nursery and their events
    leave through one sender task. When :meth:`run` is cancelled (the connection
    ended), every open stream is cancelled on the agent.
    """

    def __init__(self, agent: Agent, send: Send) -> None:
        self.agent = agent
        self._send = send
        self._outbox_in, self._outbox = trio.open_memory_channel[str | bytes](math.inf)
        self._channels: dict[int, _Relayed] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def open_streams(self) -> int:
        """How many relayed streams run on this connection."""
        return sum(1 for channel in self._channels.values() if channel.started)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve relayed streams until cancelled; then cancel every one of them."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._sender)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    async def _sender(self) -> None:
        async for message in self._outbox:
            await self._send(message)

    def _post(self, channel: int, **fields: Any) -> None:
        self._outbox_in.send_nowait(json.dumps({"type": "relay", "ch": channel, **fields}))

    def deliver_binary(self, data: bytes) -> None:
        """A piece of a request body, kept until its ``open`` arrives (bounded)."""
        if len(data) < _HEADER.size:
            return
        kind, number = _HEADER.unpack_from(data)
        if kind != KIND_BODY:
            return
        channel = self._channels.get(number)
        if channel is None:
            if len(self._channels) >= MAX_CHANNELS:
                return  # the open that follows is refused
            channel = self._channels[number] = _Relayed(number)
        if channel.started or len(channel.body) + len(data) - _HEADER.size > MAX_BODY:
            channel.body = bytearray()
            channel.started = True  # poisoned: the open is refused below
            return
        channel.body += data[_HEADER.size :]

    def deliver(self, message: Mapping[str, Any]) -> None:
        """One JSON relay message from the controller."""
        number = int(message.get("ch", 0))
        op = message.get("op")
        channel = self._channels.get(number)
        if op == "open":
            if channel is None:
                channel = self._channels[number] = _Relayed(number)
            if channel.started or self._nursery is None:
                self._refuse(number, "relay_refused", "the request could not be relayed")
                return
            if len(self._channels) > MAX_CHANNELS:
                self._refuse(number, "too_many_streams", "too many relayed streams")
                return
            channel.started = True
            self._nursery.start_soon(self._pump, channel, dict(message))
        elif op == "credit" and channel is not None:
            channel.credit += max(0, min(int(message.get("n", 1)), WINDOW))
            channel.more.set()
        elif op == "cancel":
            if channel is None or not channel.started:
                self._channels.pop(number, None)
                self._post(number, event="cancelled")
            elif self._nursery is not None:
                self._nursery.start_soon(self._cancel, channel)

    def _refuse(self, number: int, code: str, message: str) -> None:
        self._channels.pop(number, None)
        self._post(number, event="refused", error={"code": code, "message": message, "status": 503})

    async def _cancel(self, channel: _Relayed) -> None:
        channel.scope.cancel()
        await channel.done.wait()
        self._post(channel.id, event="cancelled")

    async def _pump(self, channel: _Relayed, message: dict[str, Any]) -> None:
        opened = finished = False
        fence: Fence | None = None
        stream_id = str(message.get("stream_id"))
        try:
            with channel.scope:
                try:
                    fence = structure(message.get("fence"), Fence, what="fence")
                    body = bytes(channel.body)
                    channel.body = bytearray()
                    if len(body) != int(message.get("body_length", 0)):
                        raise FiccError(
                            "the relayed request body is incomplete", code="relay_refused"
                        )
                    await self.agent.open(
                        fence,
                        stream_id,
                        str(message.get("method")),
                        str(message.get("path")),
                        [(str(k), str(v)) for k, v in message.get("headers", ())],
                        body,
                        input_id=message.get("input_id"),
                    )
                except FiccError as exc:
                    self._post(channel.id, event="refused", error=_error_wire(exc))
                    return
                opened = True
                self._post(channel.id, event="opened")
                while True:
                    while channel.credit <= 0:
                        channel.more = trio.Event()
                        await channel.more.wait()
                    try:
                        event = await self.agent.read(fence, stream_id)
                    except FiccError as exc:
                        event = StreamFailed(code=exc.code, message=exc.message)
                    channel.credit -= 1
                    self._outbox_in.send_nowait(_event_to_wire(channel.id, event))
                    if isinstance(event, _TERMINAL):
                        finished = True
                        return
        finally:
            if opened and not finished and fence is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    try:
                        await self.agent.cancel(fence, stream_id)
                    except FiccError:
                        pass  # it already ended
            self._channels.pop(channel.id, None)
            channel.done.set()
