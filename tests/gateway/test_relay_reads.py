"""The relay's reads of an engine stream: queued events, bounds, endpoints with and without
``held`` (the built-in ones say how many events are queued; a third party's may not)."""

from __future__ import annotations

import pytest
import trio

from ficc_core.executor.errors import UnknownStream
from ficc_core.executor.types import BodyChunk, EndOfStream, ResponseHead, StreamFailed
from ficc_core.gateway.errors import EngineTimeout
from ficc_core.gateway.relay import Relay, Timeouts
from ficc_core.routing.live import LiveReplica, LiveService
from ficc_core.testing.executor_kit import new_fence

from ..support.gateway_support import routing_request


class _Endpoint:
    """A node's endpoint action at the edge: events come when the test pushes them."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.arrived = trio.lowlevel.ParkingLot()
        self.reads = 0
        self.gone = False

    def push(self, *events: object) -> None:
        self.events.extend(events)
        self.arrived.unpark_all()

    async def open(self, fence, stream_id, method, path, headers, body):
        pass

    async def read(self, fence, stream_id):
        self.reads += 1
        if self.gone:
            raise UnknownStream("the stream expired", details={"stream_id": stream_id})
        while not self.events:
            await self.arrived.park()
        return self.events.pop(0)

    async def cancel(self, fence, stream_id):
        pass


class _Held(_Endpoint):
    def held(self, fence, stream_id):
        if self.gone:
            raise UnknownStream("the stream expired", details={"stream_id": stream_id})
        return len(self.events)


class _Nodes:
    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint_action = endpoint

    def endpoint(self, node_id: str) -> _Endpoint:
        return self.endpoint_action


class _NoProblem:
    def problem(self, request):
        return None


def _relay(endpoint: _Endpoint) -> Relay:
    return Relay(
        _Nodes(endpoint),  # type: ignore[arg-type]
        _NoProblem(),  # type: ignore[arg-type]
        settle=lambda request, outcome: None,
        recheck_interval=0.25,
        send_grace=1.0,
        timeouts=Timeouts(generation=30.0),
    )


def _request():
    replica = LiveReplica(index=0, node_id="n", fence=new_fence(1))
    view = LiveService(
        id="svc",
        project_id="p",
        alias="chat",
        generation=1,
        admission="serving",
        concurrency=4,
        replicas=(replica,),
    )
    request = routing_request(view)
    request.replica = replica
    return request


@pytest.mark.parametrize("endpoint_class", [_Held, _Endpoint], ids=["held", "no-held"])
async def test_queued_events_come_in_order_and_a_wait_still_meets_its_bound(
    endpoint_class, autojump_clock
):
    endpoint = endpoint_class()
    relay, request = _relay(endpoint), _request()
    head = ResponseHead(status=200, headers=())
    endpoint.push(head, BodyChunk(data=b"{}"), EndOfStream())
    with trio.fail_after(5):
        assert await relay.open(request, "POST", [], b"{}") is head
        assert await relay.next_event(request) == BodyChunk(data=b"{}")
        assert isinstance(await relay.next_event(request), EndOfStream)
    assert request.ended

    # An answer that stops coming: the wait re-checks every 0.25 s and ends at the
    # generation bound, whichever path the first events took.
    request = _request()
    endpoint.push(head)
    started = trio.current_time()
    assert await relay.open(request, "POST", [], b"{}") is head
    timeout = await relay.next_event(request)
    assert isinstance(timeout, EngineTimeout) and timeout.bound == "timeout_generation"
    assert trio.current_time() - started == pytest.approx(30.0)
    assert endpoint.reads > 3 + 1 + 100  # woke to re-check about 120 times


@pytest.mark.parametrize("endpoint_class", [_Held, _Endpoint], ids=["held", "no-held"])
async def test_a_stream_the_endpoint_forgot_ends_with_its_code(endpoint_class, autojump_clock):
    endpoint = endpoint_class()
    relay, request = _relay(endpoint), _request()
    endpoint.push(ResponseHead(status=200, headers=()))
    with trio.fail_after(5):
        await relay.open(request, "POST", [], b"{}")
        endpoint.gone = True
        failed = await relay.next_event(request)
    assert isinstance(failed, StreamFailed) and failed.code == "unknown_stream"
    assert request.ended
