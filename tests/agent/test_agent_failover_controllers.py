"""A remote agent linked to two real controllers sharing one store (one data directory)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import heartbeats, open_controller, process_agent_maker, wait_connected
from ..support.waiting import eventually
from .test_agent_relay import _stats

#: A short lease, so the standby takes over within the test's bounds.
TEMPO = {"leader_lease": "2s", "leader_renew_interval": "0.5s"}


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _controller_until(tmp_path: Path, stop: trio.Event, *, task_status):
    """Serve a controller on ``tmp_path``'s data directory until ``stop`` is set."""
    async with open_controller(tmp_path, embedded_agent=False, **TEMPO) as served:
        task_status.started(served)
        await stop.wait()


@pytest.mark.deadline(70)
async def test_one_controller_going_away_leaves_the_others_link_relaying(tmp_path, agent_dir):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            stop_a = trio.Event()
            a, url_a = await nursery.start(_controller_until, tmp_path, stop_a)
            async with open_controller(tmp_path, embedded_agent=False, **TEMPO) as (b, url_b):
                _, token = await a.contributors.add_node("gpu-1")
                remote = RemoteAgent([url_a, url_b], token, process_agent_maker(agent_dir))
                async with trio.open_nursery() as agents:
                    agent = await agents.start(remote.run)
                    fence = new_fence()
                    # Wanted in the shared store, launched on the agent itself.
                    await a.contributors.assign("gpu-1", fence, "process")
                    await agent.launch("process", standin_job(), fence)
                    assert (await agent.providers["process"].wait_ready(fence)).state == "ready"

                    stop_a.set()  # controller A is gone
                    await eventually(lambda: not remote.links[0].connected, None, every=0.02)
                    await wait_connected(b, "gpu-1")
                    await heartbeats(b, "gpu-1", 3)
                    assert b.contributors.connected_here("gpu-1")
                    assert isinstance(await _stats(b.contributors.endpoint("gpu-1"), fence), dict)
                    # A released its lease as it stopped: B leads at its next claim, and
                    # only then may it stop what runs.
                    await eventually(lambda: b.lease.leading, None, every=0.05)
                    await b.contributors.stop("gpu-1", fence, grace=1.0)
                    agents.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_links_to_two_controllers_on_one_store_stay_connected(tmp_path, agent_dir):
    with trio.fail_after(60):
        async with open_controller(tmp_path, embedded_agent=False) as (a, url_a):
            async with open_controller(tmp_path, embedded_agent=False, **TEMPO) as (b, url_b):
                _, token = await a.contributors.add_node("gpu-1")
                remote = RemoteAgent([url_a, url_b], token, process_agent_maker(agent_dir))
                async with trio.open_nursery() as nursery:
                    await nursery.start(remote.run)
                    await wait_connected(a, "gpu-1")
                    await wait_connected(b, "gpu-1")
                    await heartbeats(a, "gpu-1", 20)
                    assert [link.sessions for link in remote.links] == [1, 1]
                    nursery.cancel_scope.cancel()
