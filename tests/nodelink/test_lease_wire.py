"""The term on the wire and who may command a node (docs/operations.md, "Several controllers").

A real node registry on the real store; the node's end of the connection is a memory
channel the test reads and writes, the true edge of the controller.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import trio

from ficc_core.base.errors import NotLeader
from ficc_core.contributors import ConnectionFenced, NodeRegistry
from ficc_core.contributors.connection import serve_node_connection
from ficc_core.nodelink.links import LocalNodeLink
from ficc_core.schema import ExecutorSnapshot, Fence, NodeResources, ProviderInfo, unstructure

from ..support.waiting import eventually

DIGEST = "sha256:" + "ab" * 32
FENCE = Fence(attempt_id="svc_x.r0.g1.a1.abcdef", generation=1, plan_digest=DIGEST)


@attrs.define
class Leadership:
    """A lease's answers, set by the test."""

    leading: bool
    term: int

    @property
    def renewing(self) -> bool:
        return self.leading

    def require_leader(self, action: str) -> None:
        if not self.leading:
            raise NotLeader(action, leader_id="other", leader_url="http://other", term=self.term)


def snapshot(node_id: str) -> ExecutorSnapshot:
    return ExecutorSnapshot(
        node_id=node_id,
        providers=[ProviderInfo(name="process", package_digest=DIGEST)],
        resources=NodeResources(cpus=4, memory_bytes=8 << 30, disk_free_bytes=100 << 30),
        endpoint_version=1,
    )


class NodeEnd:
    """Both directions of one connection: what the controller sends, what it receives."""

    def __init__(self) -> None:
        self.to_node, self.from_controller = trio.open_memory_channel[str | bytes](64)
        self.to_controller, self.from_node = trio.open_memory_channel[str | bytes](64)

    # The controller's side (a MessageChannel).
    async def send(self, data: str | bytes) -> None:
        await self.to_node.send(data)

    async def receive(self) -> str | bytes:
        return await self.from_node.receive()

    # The node's side.
    async def next(self) -> dict[str, Any]:
        return json.loads(await self.from_controller.receive())

    async def say(self, message: dict[str, Any]) -> None:
        await self.to_controller.send(json.dumps(message))


class RecordingAgent:
    """The embedded agent's command target, recording what it is told."""

    stop_grace = 1.0

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def status(self, fence: Fence) -> Any:
        raise NotImplementedError


def registry(service: Any, leadership: Leadership, controller_id: str = "ctl") -> NodeRegistry:
    return NodeRegistry(service.store, leadership=leadership, controller_id=controller_id)


async def served(
    nursery: trio.Nursery, nodes: NodeRegistry, node_id: str, lease_duration: float = 0.3
) -> NodeEnd:
    end = NodeEnd()
    nursery.start_soon(
        lambda: serve_node_connection(
            nodes, node_id, end, heartbeat_interval=0.1, lease_duration=lease_duration
        )
    )
    return end


async def test_the_welcome_says_role_and_term(service) -> None:
    for leading, role in ((True, "leader"), (False, "standby")):
        nodes = registry(service, Leadership(leading, 4))
        await nodes.add_node(f"gpu-{role}")
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                end = await served(nursery, nodes, f"gpu-{role}")
                welcome = await end.next()
                assert welcome["type"] == "welcome"
                assert (welcome["role"], welcome["term"]) == (role, 4)
                nursery.cancel_scope.cancel()


async def test_only_the_leader_renews_and_its_renewals_carry_its_term(service) -> None:
    leadership = Leadership(False, 1)
    nodes = registry(service, leadership)
    await nodes.add_node("gpu-1")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            end = await served(nursery, nodes, "gpu-1")
            assert (await end.next())["type"] == "welcome"
            await end.say({"type": "heartbeat", "snapshot": unstructure(snapshot("gpu-1"))})
            while (await nodes.get("gpu-1")).last_heartbeat is None:  # noqa: ASYNC110
                await trio.sleep(0.02)
            # It takes the lease (a higher term): the renewals start, with that term, and
            # none came before (messages arrive in order).
            leadership.leading, leadership.term = True, 2
            renewal = await end.next()
            assert renewal == {"type": "renew", "duration": 0.3, "term": 2}
            nursery.cancel_scope.cancel()


async def test_commands_carry_the_term_and_a_standby_never_launches_or_stops(service) -> None:
    leadership = Leadership(True, 3)
    nodes = registry(service, leadership)
    await nodes.add_node("gpu-1")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            end = await served(nursery, nodes, "gpu-1")
            assert (await end.next())["type"] == "welcome"

            async def node() -> None:
                while True:
                    message = await end.next()
                    if message["type"] == "command":
                        seen.append(message)
                        status = {
                            "attempt_id": FENCE.attempt_id,
                            "generation": 1,
                            "state": "ready",
                        }
                        await end.say(
                            {
                                "type": "reply",
                                "request_id": message["request_id"],
                                "ok": True,
                                "status": status,
                            }
                        )

            seen: list[dict[str, Any]] = []
            nursery.start_soon(node)
            await eventually(lambda: nodes.connected_here("gpu-1"), None, every=0.02)
            await nodes.status("gpu-1", FENCE)
            await nodes.stop("gpu-1", FENCE, grace=1)
            assert [(m["op"], m["term"]) for m in seen] == [("status", 3), ("stop", 3)]
            leadership.leading, leadership.term = False, 4
            with pytest.raises(NotLeader):
                await nodes.stop("gpu-1", FENCE)
            # A standby still asks where an attempt stands, with the newest term it saw.
            await nodes.status("gpu-1", FENCE)
            assert [(m["op"], m["term"]) for m in seen][-1] == ("status", 4)
            assert [m["op"] for m in seen].count("stop") == 1
            nursery.cancel_scope.cancel()


async def test_a_local_link_passes_the_term_to_the_embedded_agent(service) -> None:
    """The embedded agent gets its commands through LocalNodeLink: stamped the same way."""
    received: list[dict[str, Any]] = []

    class Link(LocalNodeLink):
        async def call(self, message: dict[str, Any]) -> dict[str, Any]:
            received.append(message)
            return await super().call(message)

    nodes = registry(service, Leadership(True, 7))
    await nodes.add_node("local-1")
    link = Link(RecordingAgent())  # type: ignore[arg-type]
    await nodes.connect("local-1", trio.CancelScope(), link)
    with pytest.raises(NotImplementedError):
        await nodes.status("local-1", FENCE)
    assert received[0]["term"] == 7


async def test_a_node_keeps_one_connection_to_each_controller(service) -> None:
    """Connections are fenced per controller: a node connected to two controllers
    heartbeats through both; a newer connection to one fences out only its older one."""
    a = registry(service, Leadership(True, 1), "ctl-a")
    b = registry(service, Leadership(False, 1), "ctl-b")
    await a.add_node("gpu-1")
    on_a = await a.connect("gpu-1")
    on_b = await b.connect("gpu-1")
    await a.heartbeat("gpu-1", on_a, snapshot("gpu-1"))
    await b.heartbeat("gpu-1", on_b, snapshot("gpu-1"))
    again_on_a = await a.connect("gpu-1")
    with pytest.raises(ConnectionFenced):
        await a.heartbeat("gpu-1", on_a, snapshot("gpu-1"))
    await a.heartbeat("gpu-1", again_on_a, snapshot("gpu-1"))
    await b.heartbeat("gpu-1", on_b, snapshot("gpu-1"))


async def test_a_controller_that_takes_the_lease_renews_at_once(service) -> None:
    """Not a third of an attempt lease later: the node's leases went unrenewed for the
    whole takeover already."""
    leadership = Leadership(False, 1)
    nodes = registry(service, leadership)
    await nodes.add_node("gpu-1")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            end = await served(nursery, nodes, "gpu-1", lease_duration=30)
            assert (await end.next())["type"] == "welcome"
            leadership.leading, leadership.term = True, 2
            with trio.fail_after(2):
                assert (await end.next())["term"] == 2
            nursery.cancel_scope.cancel()
