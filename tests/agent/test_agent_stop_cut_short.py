"""A stop whose leader is lost in the middle: the node keeps the attempt until its engine ended.

The soak bench (#46) found a node running one engine more than its placements for
a few seconds after a controller was SIGKILLed: the dropped link cancelled the
stop the old leader had ordered, the agent forgot the attempt at once although its
engine had not ended, the new leader found it unknown and launched the replacement
beside it. Here the engine ignores SIGTERM (it ends at the grace's SIGKILL), so the
stop is still in flight when the leader's link drops. The controllers are
:class:`~tests.support.failover_support.WirePeer` (the node wire on loopback); the
agent and its engines are real.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.executor.errors import UnknownAttempt
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import process_agent_maker
from ..support.failover_support import CREDENTIAL, WirePeer
from ..support.pg_support import pid_alive

#: Seconds between the stop's SIGTERM (ignored) and its SIGKILL.
GRACE = 3.0


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _sigterm_reached(agent, fence) -> None:
    for _ in range(400):
        if any("ignoring SIGTERM" in line for line in await agent.logs(fence, 20)):
            return
        await trio.sleep(0.05)
    raise AssertionError("the engine never got the stop's SIGTERM")


@pytest.mark.deadline(60)
async def test_a_stop_cut_short_by_the_leaders_loss_holds_the_attempt_until_its_engine_ended(
    agent_dir,
):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            old = await nursery.start(WirePeer(role="leader", term=1).run)
            new = await nursery.start(WirePeer(role="standby", term=1).run)
            remote = RemoteAgent([old.url, new.url], CREDENTIAL, process_agent_maker(agent_dir))
            agent = await nursery.start(remote.run)
            await new.connected()
            fence = new_fence()
            await old.launch(standin_job(ignore_sigterm=True), fence, term=1)
            provider = agent.providers["process"]
            assert (await provider.wait_ready(fence)).state == "ready"
            pid = (await provider.status(fence)).pid
            assert pid is not None and pid_alive(pid)

            async def stop_of_the_old_leader() -> None:
                with contextlib.suppress(Exception):  # its link drops meanwhile
                    await old.command("stop", fence, term=1, grace=GRACE)

            nursery.start_soon(stop_of_the_old_leader)
            await _sigterm_reached(agent, fence)
            old.go_away()  # the leader's process is gone, its stop in flight
            while remote.links[0].connected:  # noqa: ASYNC110
                await trio.sleep(0.02)

            # The engine still runs, and the node still says so to the new leader: the
            # attempt is held and reported, its status answered (not unknown).
            assert pid_alive(pid)
            assert [lease.fence for lease in agent.leases()] == [fence]
            assert [a["attempt_id"] for a in await agent.report()] == [fence.attempt_id]
            answered = await new.command("status", fence, term=2)
            assert answered["status"]["attempt_id"] == fence.attempt_id
            # Renewals do not revive it: it is being stopped.
            await new.renew(term=2)
            await new.wait_heartbeats(2)
            assert pid_alive(pid)

            # The new leader's stop waits for that same end: once it answers, the
            # engine is gone (killed at the first stop's grace), and so is the attempt.
            began = trio.current_time()
            stopped = await new.command("stop", fence, term=2, grace=30)
            assert stopped["status"]["state"] == "stopped", stopped
            assert trio.current_time() - began < GRACE + 5
            assert not pid_alive(pid)
            assert agent.leases() == []
            with pytest.raises(UnknownAttempt):
                await new.command("status", fence, term=2)
            nursery.cancel_scope.cancel()
