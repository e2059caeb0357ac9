"""The node protocol: a node's refusals arrive as their own classes, the relay's bounds hold."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attrs
import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.executor import (
    EndpointStreams,
    PathNotAdmitted,
    PayloadTooLarge,
    StaleFence,
    UnknownAttempt,
)
from ficc_core.executor.event_queue import EventQueue
from ficc_core.executor.types import BodyChunk, EndOfStream, ResponseHead, StreamFailed
from ficc_core.nodelink.links import LocalNodeLink
from ficc_core.nodelink.relay_controller import RelayEndpoint
from ficc_core.nodelink.wire import KIND_CHUNK, MAX_BODY, WINDOW, frame
from ficc_core.schema import EndpointContract, unstructure
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import open_controller, process_agent_maker


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fn-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.deadline(40)
async def test_a_remote_nodes_fence_refusals_arrive_as_their_own_classes(tmp_path, agent_dir):
    with trio.fail_after(30):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
            async with trio.open_nursery() as nursery:
                await nursery.start(remote.run)
                while (await service.contributors.get("gpu-1")).state != "connected":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                missing = new_fence()
                with pytest.raises(UnknownAttempt) as unknown:
                    await service.contributors.status("gpu-1", missing)
                assert (unknown.value.code, unknown.value.status) == ("unknown_attempt", 404)
                # The node's own details travel with a command's refusal.
                assert unknown.value.details == {
                    "node_error": True,
                    "attempt_id": missing.attempt_id,
                }

                fence = new_fence()
                await service.contributors.launch("gpu-1", "process", standin_job(), fence)
                stale = attrs.evolve(fence, generation=fence.generation + 1)
                with pytest.raises(StaleFence) as refused:
                    await service.contributors.stop("gpu-1", stale, grace=1.0)
                assert (refused.value.code, refused.value.status) == ("stale_fence", 409)
                assert (
                    await service.contributors.stop("gpu-1", fence, grace=1.0)
                ).state == "stopped"
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(30)
async def test_the_embedded_agents_refusals_arrive_as_the_same_classes(agent_dir):
    agent = process_agent_maker(agent_dir)("local")
    link = LocalNodeLink(agent)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            fence = new_fence()
            with pytest.raises(UnknownAttempt):
                await link.call({"op": "status", "fence": unstructure(fence)})
            await agent.launch("process", standin_job(), fence)
            stale = attrs.evolve(fence, generation=2)
            with pytest.raises(StaleFence):
                await link.call({"op": "status", "fence": unstructure(stale)})
            nursery.cancel_scope.cancel()


class _Wire:
    """The controller's end of a connection, with the node's end played by the test."""

    def __init__(self) -> None:
        self.sent: list[str | bytes] = []
        self.arrived = trio.Event()

    async def send(self, message: str | bytes) -> None:
        self.sent.append(message)
        self.arrived.set()

    def controls(self) -> list[dict]:
        return [json.loads(m) for m in self.sent if isinstance(m, str)]

    async def wait_for(self, op: str) -> dict:
        while True:
            found = [m for m in self.controls() if m.get("op") == op]
            if found:
                return found[-1]
            self.arrived = trio.Event()
            await self.arrived.wait()


async def test_an_oversized_body_is_payload_too_large_locally_relayed_and_from_the_node():
    fence = new_fence()
    wire = _Wire()
    relay = RelayEndpoint(wire.send, open_timeout=5)
    streams = EndpointStreams(max_body=8)
    streams.attach(fence, EndpointContract.unix(["/v1/x"]), connect=None)  # type: ignore[arg-type]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            await nursery.start(streams.run)
            with pytest.raises(PayloadTooLarge) as local:
                await streams.open(fence, "s0", "POST", "/v1/x", {}, b"x" * 9)
            with pytest.raises(PayloadTooLarge) as relayed:
                await relay.open(fence, "s1", "POST", "/v1/x", {}, b"x" * (MAX_BODY + 1))
            for refused in (local.value, relayed.value):
                assert (refused.code, refused.status) == ("payload_too_large", 413)
                assert isinstance(refused, PathNotAdmitted)  # still a refused request

            async def node_refuses() -> None:
                opened = await wire.wait_for("open")
                error = {"code": "payload_too_large", "message": "too big", "status": 413}
                relay.deliver(
                    {"type": "relay", "ch": opened["ch"], "event": "refused", "error": error}
                )

            nursery.start_soon(node_refuses)
            with pytest.raises(PayloadTooLarge):
                await relay.open(fence, "s2", "POST", "/v1/x", {}, b"{}")
            nursery.cancel_scope.cancel()


async def test_a_node_overstepping_its_window_after_the_end_fails_the_stream_not_the_reader():
    fence = new_fence()
    wire = _Wire()
    relay = RelayEndpoint(wire.send, open_timeout=5)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)

            async def node_answers() -> None:
                channel = (await wire.wait_for("open"))["ch"]
                relay.deliver({"type": "relay", "ch": channel, "event": "opened"})
                relay.deliver(
                    {"type": "relay", "ch": channel, "event": "head", "status": 200, "headers": []}
                )
                for _ in range(WINDOW - 2):
                    relay.deliver_binary(frame(KIND_CHUNK, channel, b"data"))
                relay.deliver({"type": "relay", "ch": channel, "event": "end"})
                # The window is full and the end is queued: one more frame oversteps it.
                relay.deliver_binary(frame(KIND_CHUNK, channel, b"more"))

            nursery.start_soon(node_answers)
            await relay.open(fence, "s", "GET", "/v1/x", {})
            event = await relay.read(fence, "s")
            assert event == StreamFailed(
                code="relay_violation", message="the node sent more than its window"
            )
            assert (await wire.wait_for("cancel"))["ch"] == 1
            nursery.cancel_scope.cancel()


async def test_an_event_queue_holds_its_producer_at_the_bound_and_ending_frees_it():
    queue = EventQueue(2)
    put: list[object] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def produce() -> None:
                for event in (
                    ResponseHead(status=200, headers=()),
                    BodyChunk(b"a"),
                    BodyChunk(b"b"),
                ):
                    await queue.put(event)
                    put.append(event)

            nursery.start_soon(produce)
            await trio.testing.wait_all_tasks_blocked()
            assert len(put) == 2 and queue.full  # the third waits for room
            assert await queue.get() == ResponseHead(status=200, headers=())
            await trio.testing.wait_all_tasks_blocked()
            assert len(put) == 3
            queue.end(StreamFailed(code="cancelled", message="gone"))
            queue.push(EndOfStream())  # after the end, nothing more is taken
            assert list(queue.events) == [StreamFailed(code="cancelled", message="gone")]


def test_the_node_side_loads_no_controller_package():
    node_side = [
        "ficc_core.agent.agent",
        "ficc_core.agent.remote",
        "ficc_core.agent.staging",
        "ficc_core.executor",
        "ficc_core.nodelink.commands",
        "ficc_core.nodelink.relay_node",
        "ficc_core.nodelink.wire",
    ]
    controller = ("contributors", "inference", "gateway", "api", "controller", "auth", "models")
    script = (
        "import importlib, json, sys\n"
        f"for name in {node_side!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", script], check=True, capture_output=True, text=True
        ).stdout
    )
    assert [n for n in loaded if n.startswith("ficc_core.") and n.split(".")[1] in controller] == []
