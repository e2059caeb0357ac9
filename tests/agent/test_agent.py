"""The node agent: snapshot, runtimes, fenced attempts and leases (real process provider)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from ficc_executor_process.provider import ProcessProvider

from ficc_core.agent import Agent, AgentSettings, DeclaredRuntime
from ficc_core.base.digests import file_digest
from ficc_core.base.errors import ConfigError
from ficc_core.executor import BodyChunk, EndOfStream, ResponseHead, UnknownAttempt, UnknownStream
from ficc_core.schema import GpuDevice
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import lease_carried
from ..support.waiting import eventually


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fa-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _no_gpus() -> tuple[GpuDevice, ...]:
    return ()


def _agent(state_dir: Path, **options) -> Agent:
    provider = ProcessProvider(state_dir=state_dir / "p", default_grace=1.0)
    return Agent(
        node_id="node-a",
        providers={"process": provider},
        state_dir=state_dir,
        gpu_query=options.pop("gpu_query", _no_gpus),
        stop_grace=1.0,
        **options,
    )


@pytest.fixture
async def running(state_dir: Path) -> AsyncIterator[Agent]:
    agent = _agent(state_dir, lease_duration=3.0)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(agent.run)
        yield agent
        nursery.cancel_scope.cancel()


# -- snapshot -----------------------------------------------------------------------------


async def test_snapshot_reports_providers_measured_resources_and_endpoint_version(running):
    with trio.fail_after(10):
        snapshot = await running.snapshot()
    assert snapshot.node_id == "node-a"
    assert [p.name for p in snapshot.providers] == ["process"]
    assert snapshot.providers[0].package_digest.startswith("sha256:")
    assert snapshot.endpoint_version == 1
    assert snapshot.resources.cpus >= 1
    assert snapshot.resources.memory_bytes > 0
    assert snapshot.resources.disk_free_bytes > 0
    assert snapshot.resources.gpus == ()


@pytest.mark.deadline(40)
async def test_snapshot_carries_the_gpus_the_node_reports(state_dir):
    async def two_gpus():
        return tuple(
            GpuDevice(index=i, name="NVIDIA H200", memory_bytes=143771 << 20) for i in (0, 1)
        )

    agent = _agent(state_dir, gpu_query=two_gpus)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(agent.run)
            snapshot = await agent.snapshot()
        nursery.cancel_scope.cancel()
    assert [gpu.index for gpu in snapshot.resources.gpus] == [0, 1]


@pytest.mark.deadline(40)
async def test_declared_runtimes_are_listed_with_the_digest_the_agent_computed(state_dir):
    executable = state_dir / "llama-server"
    executable.write_bytes(b"#!/bin/sh\necho engine\n")
    right = file_digest(executable)
    settings = AgentSettings(
        labels={"zone": "lab"},
        runtimes=(
            DeclaredRuntime(
                name="llama_server", provider="process", image_digest=right, executable=executable
            ),
            DeclaredRuntime(
                name="tampered",
                provider="process",
                image_digest="sha256:" + "0" * 64,
                executable=executable,
            ),
            DeclaredRuntime(
                name="elsewhere",
                provider="container",
                image_digest="sha256:" + "1" * 64,
            ),
        ),
    )
    agent = _agent(state_dir, settings=settings)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(agent.run)
            snapshot = await agent.snapshot()
        nursery.cancel_scope.cancel()
    (installed,) = snapshot.runtimes
    assert (installed.name, installed.image_digest) == ("llama_server", right)
    assert installed.package_digest == snapshot.providers[0].package_digest
    assert snapshot.labels["zone"] == "lab"
    assert "not the declared" in agent.runtime_problems["tampered"]
    assert "not loaded" in agent.runtime_problems["elsewhere"]
    assert snapshot.labels["runtime/tampered"].startswith("refused:")


def test_agent_settings_refuse_malformed_runtime_declarations():
    with pytest.raises(ConfigError, match="image_digest"):
        AgentSettings.from_document(
            {"runtimes": [{"name": "x", "provider": "process", "image_digest": "md5:1"}]}, "t"
        )
    with pytest.raises(ConfigError, match="unknown key"):
        AgentSettings.from_document({"runtime": []}, "t")


def test_agent_settings_load_from_toml(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(
        '[labels]\nzone = "a"\n[[runtimes]]\nname = "llama_server"\nprovider = "process"\n'
        f'image_digest = "sha256:{"a" * 64}"\nexecutable = "{sys.executable}"\n'
    )
    settings = AgentSettings.load(path)
    assert settings.labels == {"zone": "a"}
    assert settings.runtimes[0].executable == Path(sys.executable)


# -- attempts and leases -------------------------------------------------------------------


@pytest.mark.deadline(40)
async def test_an_attempt_whose_lease_is_renewed_keeps_running(running):
    fence = new_fence()
    with trio.fail_after(30):
        # Four seconds on a one-second lease, renewed every half second (the controller's
        # pace, driven here).
        await running.launch("process", standin_job(), fence, lease=1.0)
        for _ in range(8):
            await trio.sleep(0.5)
            assert running.renew([fence.attempt_id], duration=1.0) == [fence.attempt_id]
        assert running.expired == []
        assert (await running.status(fence)).running
        await running.stop(fence, grace=1.0)
    assert running.leases() == []


@pytest.mark.deadline(40)
async def test_an_attempt_whose_lease_expires_is_stopped_by_the_agent(running):
    fence = new_fence()
    with trio.fail_after(30):
        await running.launch("process", standin_job(), fence, lease=1.0)
        provider = running.providers["process"]
        await eventually(lambda: fence.attempt_id in running.expired, None, every=0.1)
        status = await provider.status(fence)
    assert status.state == "stopped"
    assert running.leases() == []
    with pytest.raises(UnknownAttempt):
        await running.status(fence)


@pytest.mark.deadline(40)
async def test_leases_keep_renewing_while_an_endpoint_read_is_held_open(running):
    """A stalled reader of an engine's response never blocks lease renewal."""
    fence = new_fence()
    with trio.fail_after(30):
        await running.launch("process", standin_job(), fence, lease=1.0)
        await running.providers["process"].wait_ready(fence)
        await running.open(fence, "s1", "GET", "/stream", {}, b"")
        assert isinstance(await running.read(fence, "s1"), ResponseHead)

        async def renew_from_its_own_task():
            while True:
                running.renew(duration=1.0)
                await trio.sleep(0.2)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(renew_from_its_own_task)
            # The reader takes one chunk and then stalls for three lease lengths.
            assert isinstance(await running.read(fence, "s1"), (BodyChunk, ResponseHead))
            await lease_carried(running, fence, 3)
            assert running.expired == []
            assert (await running.status(fence)).running
            nursery.cancel_scope.cancel()
        await running.cancel(fence, "s1")
        await running.stop(fence, grace=1.0)


@pytest.mark.deadline(40)
async def test_a_fence_of_another_generation_is_refused(running):
    fence = new_fence()
    with trio.fail_after(30):
        await running.launch("process", standin_job(), fence)
        stale = type(fence)(
            attempt_id=fence.attempt_id, generation=2, plan_digest=fence.plan_digest
        )
        from ficc_core.executor import StaleFence

        with pytest.raises(StaleFence):
            await running.stop(stale)
        # The count of a stream's queued events (the gateway reads those without a
        # cancel scope) is fenced like the reads themselves.
        await running.providers["process"].wait_ready(fence)
        await running.open(fence, "s1", "GET", "/health", {}, b"")
        with pytest.raises(StaleFence):
            running.held(stale, "s1")
        assert isinstance(await running.read(fence, "s1"), ResponseHead)
        while not isinstance(await running.read(fence, "s1"), EndOfStream):
            pass
        with pytest.raises(UnknownStream):
            running.held(fence, "s1")  # read to its end: forgotten
        await running.stop(fence, grace=1.0)


@pytest.mark.deadline(40)
async def test_cancelling_the_agent_leaves_no_engine_running(state_dir):
    agent = _agent(state_dir)
    fence = new_fence()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            await agent.launch("process", standin_job(), fence)
            status = await agent.providers["process"].wait_ready(fence)
            assert status.state == "ready"
            nursery.cancel_scope.cancel()
    assert not any((state_dir / "p" / "attempts").iterdir())
