"""An agent the controller cannot reach is one friendly refusal: 502 "agent on node gpu-1 is
unreachable", naming the node, ``reason: agent_unreachable`` and the raw cause, whether the
node is not connected at all or its connection closed under a command or a relayed stream.

A real remote agent dials a real controller over a loopback WebSocket, then goes away.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.nodelink.links import ConnectionLink
from ficc_core.nodelink.wire import NodeGone, NodeTimeout
from ficc_core.schema import unstructure
from ficc_core.testing.executor_kit import new_fence

from ..support.agent_support import open_controller, process_agent_maker, wait_connected
from ..support.waiting import eventually


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fu-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _unreachable(refused: pytest.ExceptionInfo[NodeGone], cause: str) -> None:
    error = refused.value
    assert (error.status, error.code) == (502, "node_unavailable")
    assert error.message == "agent on node gpu-1 is unreachable"
    assert error.details == {"node": "gpu-1", "reason": "agent_unreachable", "raw_error": cause}
    assert error.envelope()["error"]["message"] == "agent on node gpu-1 is unreachable"


@pytest.mark.deadline(70)
async def test_a_node_whose_agent_went_away_is_a_502_naming_it(tmp_path, agent_dir):
    with trio.fail_after(60):
        async with open_controller(tmp_path) as (service, url):
            registry = service.contributors
            _, token = await registry.add_node("gpu-1")
            fence = new_fence()
            async with trio.open_nursery() as nursery:
                await nursery.start(RemoteAgent(url, token, process_agent_maker(agent_dir)).run)
                await wait_connected(service, "gpu-1")
                # Reached: the node's own refusal (it runs no such attempt), not a 502.
                with pytest.raises(Exception) as known:
                    await registry.status("gpu-1", fence)
                assert getattr(known.value, "code", None) == "unknown_attempt"
                link = registry.live.link("gpu-1")
                endpoint = registry.endpoint("gpu-1")
                nursery.cancel_scope.cancel()  # the agent goes away
            await eventually(lambda: not registry.connected_here("gpu-1"), None, every=0.02)

            # Not connected here: every command says its agent is unreachable.
            with pytest.raises(NodeGone) as refused:
                await registry.status("gpu-1", fence)
            _unreachable(refused, "not connected to this controller")
            with pytest.raises(NodeGone) as refused:
                await registry.stop("gpu-1", fence, grace=1.0)
            _unreachable(refused, "not connected to this controller")

            # What a caller held from before: the link and the relayed endpoint say the same.
            with pytest.raises(NodeGone) as refused:
                await link.call({"op": "status", "fence": unstructure(fence)})
            _unreachable(refused, "its connection closed")
            with pytest.raises(NodeGone) as refused:
                await endpoint.open(fence, "s", "GET", "/health", {}, b"")
            _unreachable(refused, "its connection closed")


def test_the_refusal_names_the_action_when_the_caller_gives_it():
    error = NodeGone("its connection closed", node="cpu-1", action="restart")
    assert error.details["action"] == "restart"
    assert error.message == "agent on node cpu-1 is unreachable"


class _SilentNode:
    """A node connection that takes every message and never answers (a hung agent)."""

    def __init__(self) -> None:
        self.sent: list[str | bytes] = []

    async def send(self, data: str | bytes) -> None:
        self.sent.append(data)

    async def receive(self) -> str | bytes:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_an_agent_that_does_not_answer_is_a_504_naming_the_node_and_the_command(
    autojump_clock,
):
    node = _SilentNode()
    link = ConnectionLink(node, timeout=5.0, node="gpu-1")
    with pytest.raises(NodeTimeout) as refused:
        await link.call({"op": "status", "fence": unstructure(new_fence())})
    assert len(node.sent) == 1  # the command went out; no answer came
    error = refused.value
    assert (error.status, error.code) == (504, "node_timeout")
    assert error.message == "agent on node gpu-1 did not answer 'status' within 5 s"
    assert error.details == {
        "node": "gpu-1",
        "reason": "agent_timeout",
        "operation": "status",
        "timeout": 5.0,
    }
    # The relayed endpoint action's open is bounded the same way, naming the node.
    with pytest.raises(NodeTimeout) as opening:
        await link.endpoint.open(new_fence(), "s1", "GET", "/health", [], b"")
    assert opening.value.details["node"] == "gpu-1"
    assert opening.value.details["operation"] == "open"
