"""The bounded queue of one endpoint stream's events, between whoever fills and reads it.

A provider's stream (:class:`~ficc_core.executor.EndpointStreams`) and a stream
relayed from a node (:class:`~ficc_core.nodelink.relay_controller.RelayEndpoint`)
each hold their events in one: the head, body chunks, then one terminal event
(:class:`EndOfStream` or :class:`StreamFailed`), after which nothing more is
taken. :meth:`EventQueue.put` waits while ``bound`` events are unread, which is
how an unread stream stops its producer; :meth:`EventQueue.get` waits for the
next one. Nothing here blocks the producer of :meth:`EventQueue.push` (a receive
loop must never wait).
"""

from __future__ import annotations

import math
from collections import deque

import trio

from .types import ReadEvent, StreamFailed, is_terminal

__all__ = ["EventQueue"]


class EventQueue:
    """At most ``bound`` unread events of one stream, and who waits on them.

    :ivar last_read: when (trio clock) a reader last took an event, ``math.inf``
        while one waits: a stream is idle when this is old.
    :ivar ended: a terminal event is queued (or was read); later events are dropped.
    """

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.events: deque[ReadEvent] = deque()
        self.ended = False
        self.last_read = trio.current_time()
        self._readers = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self.events)

    @property
    def full(self) -> bool:
        """Whether ``bound`` events are unread."""
        return len(self.events) >= self.bound

    def push(self, event: ReadEvent) -> None:
        """Queue ``event`` now, whatever the bound (dropped once the stream ended)."""
        if self.ended:
            return
        self.events.append(event)
        self.ended = is_terminal(event)
        self._readers.unpark_all()

    async def put(self, event: ReadEvent) -> None:
        """Queue ``event`` once there is room for it."""
        await self.wait_room()
        self.push(event)

    async def wait_room(self) -> None:
        """Wait until fewer than ``bound`` events are unread."""
        while self.full:
            await self._room.park()

    def end(self, failure: StreamFailed) -> None:
        """End the stream now: drop what is unread, queue ``failure``, free a waiting producer."""
        self.events.clear()
        self.ended = False
        self.push(failure)
        self._room.unpark_all()

    async def get(self) -> ReadEvent:
        """The next event, once there is one."""
        self.last_read = math.inf  # a waiting reader is not idle
        try:
            while not self.events:
                await self._readers.park()
        finally:
            self.last_read = trio.current_time()
        event = self.events.popleft()
        self._room.unpark_all()
        return event
