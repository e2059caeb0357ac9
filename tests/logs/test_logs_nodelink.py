"""Attempt logs through the node link: the ``logs`` command and relayed log follows, on a
remote agent and the embedded one; a stalled reader holds the node back, bounded."""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import aclosing
from pathlib import Path

import pytest
import trio

from ficc_core.agent.embedded import run_embedded_agent
from ficc_core.agent.remote import RemoteAgent
from ficc_core.base.errors import FiccError
from ficc_core.executor import BoundedLog
from ficc_core.executor.types import EndOfStream
from ficc_core.nodelink.wire import MAX_LOG_LINE, MAX_LOG_REPLY, WINDOW, log_lines
from ficc_core.schema import Fence
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import heartbeats, open_controller, process_agent_maker, wait_connected
from ..support.waiting import eventually


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _print_lines(endpoint, fence: Fence, count: int) -> None:
    """Have the stand-in engine print ``count`` numbered lines to its log."""
    stream_id = f"log-{count}-{trio.current_time()}"
    body = json.dumps({"lines": count}).encode()
    await endpoint.open(fence, stream_id, "POST", "/log", {}, body)
    while not isinstance(await endpoint.read(fence, stream_id), EndOfStream):
        pass


async def _until_in_log(registry, node: str, fence: Fence, text: str) -> list[str]:
    """Wait until the log holds ``text`` and ends with the stand-in's access line for its
    last ``/log`` request (written after the lines it printed); return its last lines."""
    with trio.fail_after(10):
        while True:
            lines = await registry.logs(node, fence, 1000)
            if any(text in line for line in lines) and '"POST /log HTTP/1.1" 200' in lines[-1]:
                return lines
            await trio.sleep(0.05)


async def test_a_bounded_log_follow_starts_with_its_last_lines_across_rotation(tmp_path):
    log = BoundedLog(tmp_path, max_bytes=200)
    for number in range(12):
        await log.write(f"line {number:02}\n".encode())  # 8 bytes each: rotates at 100
    await log.write(b"partial")
    assert (tmp_path / "log.1").exists()
    seen: list[str] = []
    with trio.fail_after(10):
        async with aclosing(log.follow(tail=5)) as follow:
            async for line in follow:
                seen.append(line)
                if len(seen) == 5:
                    await log.write(b" end\nline 12\n")
                    log.close()
    assert seen == ["line 07", "line 08", "line 09", "line 10", "line 11", "partial end", "line 12"]
    again = BoundedLog(tmp_path)
    again.close()
    assert [line async for line in again.follow(tail=0)] == []
    assert [line async for line in again.follow(tail=1)] == ["line 12"]


def test_a_logs_reply_keeps_the_newest_lines_that_fit_each_cut():
    long = "x" * (MAX_LOG_LINE * 2)
    kept = log_lines([long] * 200 + ["last"])
    assert kept[-1] == "last"
    assert all(len(line) <= MAX_LOG_LINE for line in kept)
    assert sum(len(line) + 1 for line in kept) <= MAX_LOG_REPLY
    assert 0 < len(kept) < 201


@pytest.mark.deadline(70)
async def test_a_remote_attempt_s_log_is_read_and_followed_until_it_ends(tmp_path, agent_dir):
    with trio.fail_after(60):
        async with open_controller(tmp_path) as (service, url):
            registry = service.contributors
            _, token = await registry.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(
                    RemoteAgent(url, token, process_agent_maker(agent_dir)).run
                )
                await wait_connected(service, "gpu-1")
                fence = new_fence()
                await registry.launch("gpu-1", "process", standin_job(), fence)
                await agent.providers["process"].wait_ready(fence)
                endpoint = registry.endpoint("gpu-1")
                await _print_lines(endpoint, fence, 5)
                lines = await _until_in_log(registry, "gpu-1", fence, "standin log line 4")
                assert (await registry.logs("gpu-1", fence, 2)) == lines[-2:]

                with pytest.raises(FiccError) as unknown:
                    await registry.logs("gpu-1", new_fence(), 10)
                assert unknown.value.code == "unknown_attempt"

                followed: list[str] = []
                async with aclosing(registry.follow_logs("gpu-1", fence, 2)) as follow:
                    async for line in follow:
                        followed.append(line)
                        if len(followed) == 2:
                            assert followed == lines[-2:]
                            assert agent.open_follows == 1
                            await _print_lines(endpoint, fence, 3)
                        if line == "standin log line 2" and len(followed) > 2:
                            # The attempt ends: its log closes and so does the follow.
                            nursery.start_soon(registry.stop, "gpu-1", fence, 1.0)
                assert followed[2:5] == [f"standin log line {n}" for n in range(3)]
                assert agent.open_follows == 0
                assert endpoint.open_streams == 0
                # The log of the ended attempt stays readable.
                assert "standin log line 2" in " ".join(await registry.logs("gpu-1", fence, 50))
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(100)
async def test_a_stalled_log_reader_holds_the_node_back_within_the_window(tmp_path, agent_dir):
    with trio.fail_after(90):
        async with open_controller(tmp_path) as (service, url):
            registry = service.contributors
            _, token = await registry.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                fence = new_fence()
                await registry.launch("gpu-1", "process", standin_job(), fence)
                provider = agent.providers["process"]
                await provider.wait_ready(fence)
                endpoint = registry.endpoint("gpu-1")
                await _print_lines(endpoint, fence, 3000)
                await _until_in_log(registry, "gpu-1", fence, "standin log line 2999")

                # Count the lines the agent takes from the provider's log.
                pulled: list[str] = []
                original = provider.follow_logs

                async def counting(fence: Fence, tail: int | None = None):
                    async for line in original(fence, tail):
                        pulled.append(line)
                        yield line

                provider.follow_logs = counting
                follow = endpoint.follow_logs(fence, None, stream_id="stalled")
                async with aclosing(follow):
                    for _ in range(10):
                        await anext(follow)
                    # The reader stalls: the node sends its window and stops reading.
                    with trio.fail_after(10):
                        await eventually(
                            lambda: endpoint.held(fence, "stalled") >= WINDOW, None, every=0.01
                        )
                    await heartbeats(service, "gpu-1", 3)
                    assert endpoint.held(fence, "stalled") == WINDOW
                    assert len(pulled) <= 10 + WINDOW + 1
                    assert remote.relay.open_streams == 1
                    assert agent.open_follows == 1
                    # Reading on takes up where it stopped, nothing lost.
                    assert await anext(follow) == pulled[10]
                # Closing the follow ends it on the node.
                with trio.fail_after(10):
                    await eventually(
                        lambda: not agent.open_follows and (not remote.relay.open_streams),
                        None,
                        every=0.01,
                    )
                assert len(pulled) < 100
                nursery.cancel_scope.cancel()


def agent_follows(service) -> int:
    """The embedded agent's open log follows."""
    return service.contributors.live.link("local").agent.open_follows


@pytest.mark.deadline(70)
async def test_the_embedded_agent_s_logs_come_through_the_same_link(tmp_path, agent_dir):
    with trio.fail_after(60):
        settings = {"node_name": "local", "agent_dir": str(agent_dir)}
        async with open_controller(tmp_path, **settings) as (service, _url):
            registry = service.contributors
            async with trio.open_nursery() as nursery:
                await nursery.start(run_embedded_agent, service)
                await wait_connected(service, "local")
                fence = new_fence()
                await registry.launch("local", "process", standin_job(), fence)
                endpoint = registry.endpoint("local")
                with trio.fail_after(20):
                    while True:
                        try:
                            await _print_lines(endpoint, fence, 2)
                            break
                        except FiccError as exc:
                            assert exc.code == "engine_unavailable"  # not ready yet
                            await trio.sleep(0.05)
                last = (await _until_in_log(registry, "local", fence, "standin log line 1"))[-1]
                async with aclosing(registry.follow_logs("local", fence, 1)) as follow:
                    assert await anext(follow) == last
                    await _print_lines(endpoint, fence, 1)
                    assert await anext(follow) == "standin log line 0"
                    assert agent_follows(service) == 1
                assert agent_follows(service) == 0
                with pytest.raises(FiccError) as stale:
                    await registry.logs(
                        "local",
                        Fence(
                            attempt_id=fence.attempt_id,
                            generation=fence.generation + 1,
                            plan_digest=fence.plan_digest,
                        ),
                        5,
                    )
                assert stale.value.code == "stale_fence"
                nursery.cancel_scope.cancel()


async def test_the_logs_command_answers_lines_and_refuses_a_bad_tail():
    from ficc_core.nodelink.commands import run_command
    from ficc_core.schema import unstructure

    class Target:
        stop_grace = 1.0

        async def logs(self, fence: Fence, tail: int = 100) -> list[str]:
            return [f"line {n}" for n in range(10)][-tail:] if tail else []

    fence = unstructure(new_fence())
    reply = await run_command(Target(), {"op": "logs", "fence": fence, "tail": 3})
    assert reply == {"ok": True, "lines": ["line 7", "line 8", "line 9"]}
    for tail in ("3", -1, 2.5, True):
        reply = await run_command(Target(), {"op": "logs", "fence": fence, "tail": tail})
        assert reply["ok"] is False and reply["error"]["code"] == "bad_command", tail
