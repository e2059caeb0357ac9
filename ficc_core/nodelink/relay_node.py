"""The node's end of relayed streams: run them on the agent, within the controller's credit.

The wire and its rules are :mod:`~ficc_core.nodelink.relay_controller`'s docs. Here a
stream reads from its source only while it holds credit, so an unread stream on the
controller leaves the provider's queue full and the engine's writes blocked. A
stream's source is the agent's endpoint action, or (``source: "logs"``) an attempt's
log followed on the agent: its lines are the stream's chunks, one line each, and
the follow ends on the agent when the stream is cancelled or the connection ends.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from ..base.errors import FiccError
from ..executor.protocol import EndpointAction
from ..executor.types import BodyChunk, EndOfStream, ReadEvent, StreamFailed, is_terminal
from ..schema import Fence, structure
from .wire import (
    KIND_BODY,
    MAX_BODY,
    MAX_CHANNELS,
    WINDOW,
    Send,
    error_to_wire,
    event_to_wire,
    log_line,
    relay_message,
    unframe,
)


class RelaySource(EndpointAction, Protocol):
    """What relayed streams run on: the agent's endpoint action and its log follows."""

    def follow_logs(self, fence: Fence, tail: int | None = None) -> AsyncGenerator[str, None]:
        """The attempt's log lines (the last ``tail``, then new ones) until it ends.

        Refuses an unknown attempt or a stale fence before it returns.
        """
        ...


@attrs.define(eq=False)
class _Relayed:
    id: int
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    credit: int = WINDOW
    more: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    body: bytearray = attrs.field(factory=bytearray)
    started: bool = False


#: An open stream's source: read its next event; close it (before it ended).
_Stream = tuple[Callable[[], Awaitable[ReadEvent]], Callable[[], Awaitable[None]]]


class RelayServer:
    """Run relayed endpoint streams on an agent for one connection.

    :meth:`deliver` and :meth:`deliver_binary` take what the receive loop got and
    never block; streams run as tasks in :meth:`run`'s nursery and their events
    leave through one sender task. When :meth:`run` is cancelled (the connection
    ended), every open stream is cancelled on the agent.

    :param agent: what streams run on (the node's agent).
    :param send: sends one message on the connection.
    """

    def __init__(self, agent: RelaySource, send: Send) -> None:
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
        self._outbox_in.send_nowait(relay_message(channel, **fields))

    def deliver_binary(self, data: bytes) -> None:
        """A piece of a request body, kept until its ``open`` arrives (bounded)."""
        parsed = unframe(data)
        if parsed is None or parsed[0] != KIND_BODY:
            return
        _kind, number, payload = parsed
        channel = self._channels.get(number)
        if channel is None:
            if len(self._channels) >= MAX_CHANNELS:
                return  # the open that follows is refused
            channel = self._channels[number] = _Relayed(number)
        if channel.started or len(channel.body) + len(payload) > MAX_BODY:
            channel.body = bytearray()
            channel.started = True  # poisoned: the open is refused below
            return
        channel.body += payload

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

    async def _open_endpoint(self, channel: _Relayed, message: dict[str, Any]) -> _Stream:
        fence = structure(message.get("fence"), Fence, what="fence")
        stream_id = str(message.get("stream_id"))
        body = bytes(channel.body)
        channel.body = bytearray()
        if len(body) != int(message.get("body_length", 0)):
            raise FiccError("the relayed request body is incomplete", code="relay_refused")
        await self.agent.open(
            fence,
            stream_id,
            str(message.get("method")),
            str(message.get("path")),
            [(str(k), str(v)) for k, v in message.get("headers", ())],
            body,
            input_id=message.get("input_id"),
        )
        return (
            lambda: self.agent.read(fence, stream_id),
            lambda: self.agent.cancel(fence, stream_id),
        )

    async def _open_logs(self, channel: _Relayed, message: dict[str, Any]) -> _Stream:
        fence = structure(message.get("fence"), Fence, what="fence")
        tail = message.get("tail")
        if not (tail is None or (isinstance(tail, int) and tail >= 0)):
            raise FiccError("tail must be a whole number or null", code="relay_refused")
        lines = self.agent.follow_logs(fence, tail)

        async def next_line() -> ReadEvent:
            try:
                return BodyChunk(log_line(await anext(lines)))
            except StopAsyncIteration:
                return EndOfStream()

        return next_line, lines.aclose

    async def _pump(self, channel: _Relayed, message: dict[str, Any]) -> None:
        stream: _Stream | None = None
        finished = False
        opener = self._open_logs if message.get("source") == "logs" else self._open_endpoint
        try:
            with channel.scope:
                try:
                    stream = await opener(channel, message)
                except FiccError as exc:
                    self._post(channel.id, event="refused", error=error_to_wire(exc))
                    return
                read, _close = stream
                self._post(channel.id, event="opened")
                while True:
                    while channel.credit <= 0:
                        channel.more = trio.Event()
                        await channel.more.wait()
                    try:
                        event = await read()
                    except FiccError as exc:
                        event = StreamFailed(code=exc.code, message=exc.message)
                    channel.credit -= 1
                    self._outbox_in.send_nowait(event_to_wire(channel.id, event))
                    if is_terminal(event):
                        finished = True
                        return
        finally:
            if stream is not None and not finished:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    try:
                        await stream[1]()
                    except FiccError:
                        pass  # it already ended
            self._channels.pop(channel.id, None)
            channel.done.set()
