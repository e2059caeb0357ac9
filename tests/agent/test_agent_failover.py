"""An agent linked to several controllers: fenced by leader term, one link per controller.

The controllers here are :class:`~tests.support.failover_support.WirePeer`: the controller's
own end of the node wire on loopback, stamping the terms a test chooses. The agents
are real (the process provider, real stand-in engines).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ficc_core.agent.remote import AgentRefused, RemoteAgent, Welcome
from ficc_core.agent.terms import TERM_FILE
from ficc_core.executor.errors import UnknownAttempt
from ficc_core.nodelink.links import LocalNodeLink
from ficc_core.nodelink.wire import StaleTerm
from ficc_core.schema import unstructure
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import process_agent_maker
from ..support.failover_support import CREDENTIAL, WirePeer
from ..support.waiting import eventually
from .test_agent_relay import _stats


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="ff-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _remote(peers, agent_dir: Path, **options) -> RemoteAgent:
    urls = [peer.url for peer in peers]
    return RemoteAgent(urls, CREDENTIAL, process_agent_maker(agent_dir), **options)


@pytest.mark.deadline(40)
async def test_a_launch_of_a_lower_term_is_refused_stale_term_and_runs_nothing(agent_dir):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peer = await nursery.start(WirePeer(role="leader", term=5).run)
            agent = await nursery.start(_remote([peer], agent_dir).run)
            assert agent.term_seen == 5  # the leader's welcome said so
            fence = new_fence()
            with pytest.raises(StaleTerm) as refused:
                await peer.launch(standin_job(), fence, term=3)
            assert (refused.value.code, refused.value.status) == ("stale_term", 409)
            assert refused.value.details == {"term": 3, "current": 5, "node_error": True}
            assert agent.leases() == []
            with pytest.raises(UnknownAttempt):
                await agent.providers["process"].status(fence)
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_a_higher_term_is_accepted_and_later_lower_ones_refused(agent_dir):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            # A controller built before terms: no role, no term in its welcome.
            peer = await nursery.start(WirePeer(role=None).run)
            agent = await nursery.start(_remote([peer], agent_dir).run)
            assert agent.term_seen == 0
            first = new_fence()
            await peer.launch(standin_job(), first, term=2)
            assert agent.term_seen == 2
            with pytest.raises(StaleTerm):
                await peer.launch(standin_job(), new_fence(), term=1)
            # A message without a term is term 0: refused too, once a term was seen.
            with pytest.raises(StaleTerm):
                await peer.command("stop", first, term=0)
            with pytest.raises(StaleTerm):
                await peer.command("stop", first, term=1)
            assert (await agent.status(first)).running
            # status and logs are answered whatever the term.
            reply = await peer.command("status", first, term=0)
            assert reply["status"]["attempt_id"] == first.attempt_id
            assert (await peer.command("logs", first, term=1, tail=5))["ok"]
            await peer.command("stop", first, term=2)
            assert [lease.fence for lease in agent.leases()] == []
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_the_seen_term_survives_an_agent_restart(agent_dir):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peer = await nursery.start(WirePeer(role=None).run)
            async with trio.open_nursery() as first_run:
                agent = await first_run.start(_remote([peer], agent_dir).run)
                await peer.launch(standin_job(), new_fence(), term=4)
                first_run.cancel_scope.cancel()
            recorded = json.loads((agent_dir / TERM_FILE).read_text(encoding="utf-8"))
            assert recorded == {"term_seen": 4}

            # A fresh process on the same state directory: the old leader stays refused.
            restarted = await nursery.start(_remote([peer], agent_dir).run)
            assert restarted is not agent
            assert restarted.term_seen == 4
            with pytest.raises(StaleTerm) as refused:
                await peer.launch(standin_job(), new_fence(), term=3)
            assert refused.value.details["current"] == 4
            assert restarted.leases() == []
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_one_controller_going_away_leaves_the_other_link_working(agent_dir):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            leader = await nursery.start(WirePeer(role="leader", term=1).run)
            standby = await nursery.start(WirePeer(role="standby", term=1).run)
            remote = _remote([leader, standby], agent_dir)
            agent = await nursery.start(remote.run)
            await standby.connected()
            fence = new_fence()
            await leader.launch(standin_job(), fence, term=1)
            assert (await agent.providers["process"].wait_ready(fence)).state == "ready"
            assert remote.leader is remote.links[0]

            leader.go_away()
            await eventually(lambda: not remote.links[0].connected, None, every=0.02)
            # The standby's link carries on: heartbeats, and the endpoint action relayed.
            await standby.wait_heartbeats(3)
            link = await standby.connected()
            assert isinstance(await _stats(link.endpoint, fence), dict)  # a 200, relayed
            assert remote.links[1].connected and remote.leader is None
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_commands_are_answered_on_the_link_they_came_on(agent_dir):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            first = await nursery.start(WirePeer(role="standby", term=1).run)
            second = await nursery.start(WirePeer(role="leader", term=1).run)
            remote = _remote([first, second], agent_dir)
            agent = await nursery.start(remote.run)
            await first.connected()
            await second.connected()
            fence = new_fence()
            await second.launch(standin_job(), fence, term=1)
            # Each controller gets its own reply (a reply on the wrong link would time out).
            for peer in (first, second):
                reply = await peer.command("status", fence, term=1)
                assert reply["status"]["attempt_id"] == fence.attempt_id
            assert agent.leases()[0].fence == fence
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_a_takeover_raises_the_term_and_fences_out_the_old_leader(agent_dir):
    seen: list[Welcome] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            old = await nursery.start(WirePeer(role="leader", term=1).run)
            new = await nursery.start(WirePeer(role="standby", term=1).run)
            remote = _remote([old, new], agent_dir, on_connected=seen.append)
            agent = await nursery.start(remote.run)
            await new.connected()
            fence = new_fence()
            await old.launch(standin_job(), fence, term=1)
            # The standby takes the lease: its first renewal carries term 2.
            await new.renew(term=2)
            await new.command("status", fence, term=2)  # after the renewal, in order
            assert agent.term_seen == 2
            assert remote.leader is remote.links[1]
            assert Welcome(new.url, "gpu-1", "leader", 2) in seen
            # The old leader, not knowing yet, can neither stop nor launch.
            with pytest.raises(StaleTerm):
                await old.command("stop", fence, term=1)
            with pytest.raises(StaleTerm):
                await old.launch(standin_job(), new_fence(), term=1)
            assert (await agent.status(fence)).running
            await new.command("stop", fence, term=2)
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_renewals_of_a_stale_term_do_not_extend_a_lease(agent_dir):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peer = await nursery.start(WirePeer(role="leader", term=3, lease_duration=30).run)
            agent = await nursery.start(_remote([peer], agent_dir).run)
            fence = new_fence()
            await peer.launch(standin_job(), fence, term=3)
            (lease,) = agent.leases()
            granted = lease.deadline

            await peer.renew(term=2, duration=1000)
            await peer.command("status", fence, term=2)  # the renewal was applied before it
            assert lease.deadline == granted

            await peer.renew(term=3, duration=1000)
            await peer.command("status", fence, term=3)
            assert lease.deadline > granted + 900
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_an_attempt_renewed_only_by_a_deposed_leader_expires(agent_dir):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            # Renewals of term 1 every 0.1 s, a lease of 1 s: the old leader keeps trying.
            old = await nursery.start(
                WirePeer(role="leader", term=1, lease_duration=1.0, renew_every=0.1).run
            )
            agent = await nursery.start(_remote([old], agent_dir).run)
            fence = new_fence()
            await old.launch(standin_job(), fence, term=1)
            await agent.see_term(2)  # a newer leader spoke (its own link is not needed here)
            await eventually(lambda: fence.attempt_id in agent.expired, None, every=0.05)
            assert agent.leases() == []
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_a_controller_naming_another_node_is_refused_and_the_other_keeps_working(
    agent_dir, caplog
):
    caplog.set_level(logging.ERROR, logger="ficc.agent")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peers = {
                node: await nursery.start(WirePeer(node_id=node).run) for node in ("gpu-1", "gpu-2")
            }
            agent = await nursery.start(_remote(list(peers.values()), agent_dir).run)
            # The first controller to name the node decides it; the other is refused.
            named = peers[agent.node_id]
            other = peers["gpu-2" if agent.node_id == "gpu-1" else "gpu-1"]
            await eventually(
                lambda: any("node_mismatch" in r.getMessage() for r in caplog.records),
                None,
                every=0.02,
            )
            await named.wait_heartbeats(2)
            assert other.heartbeats == 0
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_every_link_refused_ends_the_agent_with_the_first_refusal(agent_dir):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peers = [await nursery.start(WirePeer().run) for _ in range(2)]
            remote = RemoteAgent(
                [peer.url for peer in peers], "ficcnode_wrong", process_agent_maker(agent_dir)
            )
            with pytest.raises(AgentRefused) as refused:
                await remote.run()
            assert refused.value.code == "credential_refused"
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_one_agent_is_built_for_every_controller(agent_dir):
    built = []
    make = process_agent_maker(agent_dir)

    def counting(node_id):
        built.append(node_id)
        return make(node_id)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peers = [await nursery.start(WirePeer().run) for _ in range(3)]
            remote = RemoteAgent([peer.url for peer in peers], CREDENTIAL, counting)
            agent = await nursery.start(remote.run)
            for peer in peers:
                await peer.wait_heartbeats(1)
            assert built == ["gpu-1"]
            assert remote.sessions == 3
            assert all(link.relay is not None for link in remote.links)
            assert agent is remote.agent
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(40)
async def test_the_embedded_agents_link_goes_through_the_same_term_check(agent_dir):
    with trio.fail_after(30):
        agent = process_agent_maker(agent_dir)("local")
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            link = LocalNodeLink(agent)
            fence = new_fence()
            job = {"op": "launch", "provider": "process", "job": unstructure(standin_job())}
            await link.call({**job, "fence": unstructure(fence), "term": 7})
            with pytest.raises(StaleTerm):
                await link.call({**job, "fence": unstructure(new_fence()), "term": 6})
            assert agent.renew(term=6, duration=1000) == []
            assert agent.renew(term=7) == [fence.attempt_id]
            nursery.cancel_scope.cancel()
        assert json.loads((agent_dir / TERM_FILE).read_text()) == {"term_seen": 7}


@pytest.mark.deadline(40)
async def test_the_embedded_renewals_of_a_deposed_term_extend_nothing(agent_dir):
    from ficc_core.agent.embedded import renew_leases

    with trio.fail_after(30):
        agent = process_agent_maker(agent_dir)("local")
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            agent.lease_duration = 1.0
            fence = new_fence()
            await LocalNodeLink(agent).call(
                {
                    "op": "launch",
                    "provider": "process",
                    "job": unstructure(standin_job()),
                    "fence": unstructure(fence),
                    "term": 2,
                }
            )
            await agent.see_term(3)  # another controller took over
            nursery.start_soon(renew_leases, agent, 1.0, lambda: 2)
            await eventually(lambda: fence.attempt_id in agent.expired, None, every=0.05)
            nursery.cancel_scope.cancel()


async def test_an_unreadable_term_file_starts_from_term_zero(tmp_path, caplog):
    from ficc_core.agent.terms import TermRecord

    (tmp_path / TERM_FILE).write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="ficc.agent"):
        assert await TermRecord(tmp_path).load() == 0
    assert "unreadable" in caplog.text


async def test_a_term_that_cannot_be_written_still_fences_in_memory(tmp_path, caplog):
    from ficc_core.agent.terms import TermRecord

    blocked = tmp_path / "a-file"
    blocked.write_text("", encoding="utf-8")
    record = TermRecord(blocked / "agent")  # its directory cannot be made
    with caplog.at_level(logging.WARNING, logger="ficc.agent"):
        await record.raise_to(9)
    assert record.seen == 9
    assert "could not record leader term 9" in caplog.text
    await record.raise_to(4)
    assert record.seen == 9


class _HeldStager:
    """A stager whose download waits until the test lets it finish (the network's edge)."""

    def __init__(self, cache_dir: Path, content: Path) -> None:
        self.cache_dir = cache_dir
        self.content = content
        self.entered = trio.Event()
        self.release = trio.Event()

    async def stage(self, sha256: str, size: int, *, source: str | None = None) -> Path:
        self.entered.set()
        await self.release.wait()
        return self.content


@pytest.mark.deadline(40)
async def test_a_launch_whose_term_was_superseded_while_staging_starts_nothing(agent_dir, tmp_path):
    from ficc_core.schema import JobInput

    blob = tmp_path / "model.gguf"
    blob.write_bytes(b"weights")
    digest = "sha256:" + "ab" * 32
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            peer = await nursery.start(WirePeer(role="leader", term=1).run)
            agent = await nursery.start(_remote([peer], agent_dir).run)
            agent.stager = stager = _HeldStager(tmp_path / "cache", blob)
            job = standin_job(inputs=(JobInput(id="model", path="/far.gguf", digest=digest),))
            fence = new_fence()
            refusals = []

            async def launch() -> None:
                with pytest.raises(StaleTerm) as refused:
                    await peer.command(
                        "launch",
                        fence,
                        term=1,
                        provider="process",
                        job=unstructure(job),
                        blobs={digest: 7},
                    )
                refusals.append(refused.value)

            nursery.start_soon(launch)
            await stager.entered.wait()
            await peer.renew(term=2)  # a takeover while the blob downloads
            await eventually(lambda: agent.term_seen >= 2, None, every=0.02)
            stager.release.set()
            await eventually(lambda: refusals, None, every=0.02)
            assert refusals[0].details["current"] == 2
            assert agent.leases() == []
            with pytest.raises(UnknownAttempt):
                await agent.providers["process"].status(fence)
            nursery.cancel_scope.cancel()
