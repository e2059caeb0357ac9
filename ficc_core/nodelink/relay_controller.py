"""The controller's end of relayed streams: a remote node's endpoint action, multiplexed.

:class:`RelayEndpoint` offers the same ``open`` / ``read`` / ``cancel`` as a local
provider (:class:`~ficc_core.executor.protocol.EndpointAction`); the node's end
(:class:`~ficc_core.nodelink.relay_node.RelayServer`) runs them on its agent. Each
stream is a numbered *channel* on the node's one WebSocket. Control messages are
JSON text (``{"type": "relay", "ch": N, ...}``); bytes travel in binary frames
(:mod:`~ficc_core.nodelink.wire`):

- controller → agent: kind 2 (a piece of a request body), then ``op: "open"``
  with the fence, stream ID, method, path, headers and ``body_length`` (or, to
  follow an attempt's log, ``source: "logs"`` with the fence, stream ID and
  ``tail``: each log line is then one body chunk, cut at 8 KiB);
  ``op: "credit"`` (``n``: events the controller has read and may take again);
  ``op: "cancel"``;
- agent → controller: ``event: "opened"`` or ``"refused"`` (with ``error``), then
  ``"head"``, kind 1 frames (body chunks), then ``"end"`` or ``"failed"``;
  ``"cancelled"`` acknowledges a cancel.

**Backpressure.** The agent reads from its provider only while it holds credit:
:data:`~ficc_core.nodelink.wire.WINDOW` events per channel, one more for each
event the controller's reader took. A controller that does not read leaves the
agent not reading, the provider's four-event queue full and the engine's writes
blocked; each side holds at most ``WINDOW`` events per stream. Nothing here waits
on the receive loops, which only append and wake, so heartbeats and lease
renewals on the same connection never wait behind a stream.

**Peer loss.** When the connection ends, every open stream reads
:class:`StreamFailed` (``peer_lost``) after what it had already received, and
nothing is replayed; on the agent every relayed stream is cancelled, which closes
the engine connection.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..base.errors import FiccError
from ..executor import errors as executor_errors
from ..executor.engine_http import CHUNK_SIZE
from ..executor.event_queue import EventQueue
from ..executor.types import (
    BodyChunk,
    EndOfStream,
    ReadEvent,
    ResponseHead,
    StreamFailed,
    is_terminal,
)
from ..schema import Fence, unstructure
from .wire import (
    KIND_BODY,
    KIND_CHUNK,
    MAX_BODY,
    MAX_CHANNELS,
    WINDOW,
    NodeGone,
    NodeTimeout,
    Send,
    error_from_wire,
    frame,
    relay_message,
    unframe,
)

if TYPE_CHECKING:
    from ..executor.protocol import Headers


@attrs.define(eq=False)
class _Channel:
    id: int
    fence: Fence
    stream_id: str
    queue: EventQueue = attrs.field(factory=lambda: EventQueue(WINDOW))
    opened: trio.Event = attrs.field(factory=trio.Event)
    refused: FiccError | None = None
    acknowledged: trio.Event = attrs.field(factory=trio.Event)


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
        self,
        send: Send,
        *,
        open_timeout: float = 60.0,
        idle_timeout: float = 60.0,
        node: str | None = None,
    ) -> None:
        self._send = send
        self._node = node
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
                if channel.opened.is_set() and channel.queue.last_read < deadline:
                    self._forget(channel)
                    self._control(channel, op="cancel")

    def _post(self, message: str | bytes) -> None:
        if not self._closed:
            self._outbox_in.send_nowait(message)

    def _control(self, channel: _Channel, **fields: Any) -> None:
        self._post(relay_message(channel.id, **fields))

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
        return len(self._channel(fence, stream_id).queue)

    def _new_channel(self, fence: Fence, stream_id: str) -> _Channel:
        if self._closed:
            raise NodeGone("its connection closed", node=self._node)
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
        self._next += 1
        channel = _Channel(self._next, fence, stream_id)
        self._channels[channel.id] = channel
        self._streams[(fence.attempt_id, stream_id)] = channel
        return channel

    async def _opened(self, channel: _Channel) -> None:
        """Wait for the node's answer to the open just sent; raise its refusal."""
        done = False
        try:
            with trio.move_on_after(self.open_timeout):
                await channel.opened.wait()
            if not channel.opened.is_set():
                raise NodeTimeout("open", self.open_timeout, node=self._node)
            if channel.refused is not None:
                raise channel.refused
            done = True
        finally:
            if not done:
                self._forget(channel)
                if channel.refused is None and not self._closed:
                    self._control(channel, op="cancel")

    async def open(
        self,
        fence: Fence,
        stream_id: str,
        method: str,
        path: str,
        headers: Headers,
        body: bytes = b"",
        *,
        input_id: str | None = None,
    ) -> None:
        """Open a stream on the node's engine; raise the node's refusal as its own class."""
        if len(body) > MAX_BODY:
            raise executor_errors.PayloadTooLarge(
                f"the request body has {len(body)} bytes; at most {MAX_BODY} are admitted"
            )
        channel = self._new_channel(fence, stream_id)
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        data = bytes(body)
        for start in range(0, len(data), CHUNK_SIZE):
            self._post(frame(KIND_BODY, channel.id, data[start : start + CHUNK_SIZE]))
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
        await self._opened(channel)

    async def follow_logs(
        self, fence: Fence, tail: int | None = None, *, stream_id: str | None = None
    ) -> AsyncGenerator[str, None]:
        """Follow the attempt's log on the node: the last ``tail`` lines, then new ones.

        A relayed stream like an endpoint one (``source: "logs"``, named ``stream_id``
        or a random one), within the same window: a caller that stops reading stops
        the node reading the log. It ends when the attempt's log closes; closing the
        iterator (or cancelling it) ends the follow on the node. The node's refusal
        is raised as its own class.
        """
        stream_id = stream_id or "logs-" + secrets.token_hex(8)
        channel = self._new_channel(fence, stream_id)
        self._control(
            channel,
            op="open",
            source="logs",
            fence=unstructure(fence),
            stream_id=stream_id,
            tail=tail,
            window=WINDOW,
        )
        await self._opened(channel)
        ended = False
        try:
            while True:
                event = await self.read(fence, stream_id)
                if isinstance(event, BodyChunk):
                    yield event.data.decode("utf-8", "replace")
                elif isinstance(event, StreamFailed):
                    ended = True
                    raise error_from_wire({"code": event.code, "message": event.message})
                elif isinstance(event, EndOfStream):
                    ended = True
                    return
        finally:
            if not ended and not self._closed:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    try:
                        await self.cancel(fence, stream_id)
                    except executor_errors.UnknownStream:
                        pass  # it ended or expired meanwhile

    async def read(self, fence: Fence, stream_id: str) -> ReadEvent:
        """Return the stream's next event, as a provider's ``read`` does."""
        channel = self._channel(fence, stream_id)
        event = await channel.queue.get()
        if is_terminal(event):
            self._forget(channel)
        else:
            self._control(channel, op="credit", n=1)
        return event

    async def cancel(self, fence: Fence, stream_id: str) -> None:
        """Close the stream; return once the node closed its engine connection (or is gone)."""
        channel = self._channel(fence, stream_id)
        self._forget(channel)
        channel.queue.push(StreamFailed(code="cancelled", message="the stream was cancelled"))
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
        parsed = unframe(data)
        if parsed is None:
            return
        kind, number, payload = parsed
        channel = self._channels.get(number)
        if kind == KIND_CHUNK and channel is not None:
            if len(payload) > CHUNK_SIZE:
                self._fail(channel, "relay_violation", "the node sent a chunk over 64 KiB")
                return
            self._event(channel, BodyChunk(payload))

    def _event(self, channel: _Channel, event: ReadEvent) -> None:
        if self._streams.get((channel.fence.attempt_id, channel.stream_id)) is not channel:
            return  # cancelled: waiting only for the acknowledgement
        if channel.queue.full:
            self._fail(channel, "relay_violation", "the node sent more than its window")
            return
        channel.queue.push(event)

    def _fail(self, channel: _Channel, code: str, message: str) -> None:
        channel.queue.end(StreamFailed(code=code, message=message))
        self._control(channel, op="cancel")

    def close(self) -> None:
        """Peer loss: end every open stream with ``peer_lost``, replaying nothing."""
        if self._closed:
            return
        self._closed = True
        self._outbox_in.close()
        for channel in list(self._channels.values()):
            channel.queue.push(
                StreamFailed(code="peer_lost", message="the node's connection closed")
            )
            channel.refused = channel.refused or NodeGone("its connection closed", node=self._node)
            channel.opened.set()
            channel.acknowledged.set()
