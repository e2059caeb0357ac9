"""Blob staging with several controllers: the launch's controller first, then the others."""

from __future__ import annotations

import logging
import socket

import pytest
import trio

from ficc_core.agent.runtimes import AgentSettings
from ficc_core.agent.staging import Stager, StagingError, stager_from_settings

from ..support.models_support import random_bytes
from .test_staging import _assigned_model, setup  # noqa: F401 (the fixture)

MiB = 1 << 20


def _dead_url() -> str:
    """The URL of a loopback port nothing listens on (bound by the OS, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.deadline(40)
async def test_an_unreachable_controller_is_skipped_for_the_next_in_order(setup, tmp_path, caplog):  # noqa: F811
    service, url, admin, node = setup
    caplog.set_level(logging.WARNING, logger="ficc_core.agent.staging")
    with trio.fail_after(30):
        content = random_bytes(MiB + 5, seed=21)
        digest = await _assigned_model(service, url, admin, content)
        dead = _dead_url()
        stager = Stager(tmp_path / "cache", dead, node, other_controllers=[url])
        path = await stager.stage(digest, len(content))
        assert path.read_bytes() == content
        assert stager.asked == [dead, url]
        assert any("asking the next controller" in r.getMessage() for r in caplog.records)


@pytest.mark.deadline(40)
async def test_the_controller_that_sent_the_launch_is_asked_first(setup, tmp_path):  # noqa: F811
    service, url, admin, node = setup
    with trio.fail_after(30):
        content = random_bytes(MiB, seed=22)
        digest = await _assigned_model(service, url, admin, content)
        dead = _dead_url()
        stager = Stager(tmp_path / "cache", dead, node, other_controllers=[url])
        await stager.stage(digest, len(content), source=url)
        assert stager.asked == [url]


@pytest.mark.deadline(40)
async def test_a_refusal_is_an_answer_and_is_not_asked_of_the_others(setup, tmp_path):  # noqa: F811
    _, url, _, node = setup
    with trio.fail_after(30):
        dead = _dead_url()
        stager = Stager(tmp_path / "cache", url, node, other_controllers=[dead])
        with pytest.raises(StagingError) as refused:
            await stager.stage("ab" * 32, 10)  # no such blob referenced: 404
        assert refused.value.code == "download_refused"
        assert stager.asked == [url]


@pytest.mark.deadline(40)
async def test_every_controller_unreachable_fails_with_the_last_ones_error(tmp_path):
    with trio.fail_after(30):
        first, second = _dead_url(), _dead_url()
        stager = Stager(tmp_path / "cache", first, "ficcnode_x", other_controllers=[second])
        with pytest.raises(StagingError) as failed:
            await stager.stage("cd" * 32, 10)
        assert failed.value.code == "download_failed"
        assert second in failed.value.message
        assert stager.asked == [first, second]


def test_the_executors_stager_lists_every_controller_in_order(tmp_path):
    urls = ["https://a.example/", "https://b.example", "https://a.example"]
    stager = stager_from_settings(tmp_path, urls, "ficcnode_x", AgentSettings())
    assert stager.controller_urls == ("https://a.example", "https://b.example")
    assert stager.sources("https://b.example/") == ("https://b.example", "https://a.example")
    one = stager_from_settings(tmp_path, "https://a.example", "ficcnode_x", AgentSettings())
    assert one.controller_urls == ("https://a.example",)


@pytest.mark.deadline(70)
async def test_a_remote_launch_stages_from_the_controller_that_sent_it(setup, tmp_path):  # noqa: F811
    from ficc_executor_process.testing import running_process_provider, short_state_dir

    from ficc_core.agent import Agent
    from ficc_core.agent.remote import RemoteAgent
    from ficc_core.schema import JobInput
    from ficc_core.testing.executor_kit import new_fence, standin_job

    from ..support.agent_support import wait_connected
    from .test_staging import _verified_model

    service, url, admin, node = setup
    with trio.fail_after(60):
        content = random_bytes(MiB + 1, seed=23)
        digest = await _verified_model(url, admin, content)
        dead = _dead_url()  # listed first: a controller that is down
        stagers: list[Stager] = []
        with short_state_dir("fg-") as agent_dir:
            async with running_process_provider(agent_dir / "p") as provider:

                def make(node_id: str) -> Agent:
                    agent = Agent(
                        node_id=node_id, providers={"process": provider}, state_dir=agent_dir
                    )
                    agent.stager = stager_from_settings(
                        agent_dir, [dead, url], node, AgentSettings()
                    )
                    stagers.append(agent.stager)
                    return agent

                async with trio.open_nursery() as nursery:
                    await nursery.start(RemoteAgent([dead, url], node, make).run)
                    await wait_connected(service, "gpu-1")
                    job = standin_job(
                        inputs=(
                            JobInput(id="model", path="/nowhere.gguf", digest=f"sha256:{digest}"),
                        )
                    )
                    fence = new_fence()
                    await service.contributors.launch(
                        "gpu-1", "process", job, fence, blobs={digest: len(content)}
                    )
                    assert stagers[0].asked == [url]
                    assert (agent_dir / "blobs" / "sha256" / digest).read_bytes() == content
                    await service.contributors.stop("gpu-1", fence, grace=1.0)
                    nursery.cancel_scope.cancel()
