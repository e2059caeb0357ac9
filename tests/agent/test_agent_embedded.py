"""`ficc serve` runs a local agent: the node appears in /contributors with measured resources."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import pluggy
import pytest
import trio

from ficc_core.agent.embedded import run_embedded_agent
from ficc_core.config import load_config
from ficc_core.contributors.errors import NodeCredentialRevoked
from ficc_core.controller.service import open_service
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import lease_carried
from ..support.serve_support import ServeProcess


@pytest.fixture
def agent_dir():
    path = tempfile.mkdtemp(prefix="fe-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _contributors(url: str, token: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.get(
            "/api/v1/contributors", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 200, response.text
        return response.json()["contributors"]


@pytest.mark.deadline(70)
async def test_serve_lists_its_embedded_node_with_measured_resources(tmp_path, agent_dir):
    server = ServeProcess(tmp_path / "data", "--agent-dir", agent_dir)
    try:
        url = await server.wait_ready()
        token = await server.admin_token()
        with trio.fail_after(30):
            (node,) = await _contributors(url, token)
        assert (node["id"], node["state"]) == ("local", "connected")
        resources = node["snapshot"]["resources"]
        assert resources["cpus"] == len(os.sched_getaffinity(0))
        assert resources["memory_bytes"] > 0 and resources["disk_free_bytes"] > 0
        assert [p["name"] for p in node["snapshot"]["providers"]] == ["process"]
        server.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(server.proc.wait) == 0
    finally:
        server.kill()


@pytest.mark.deadline(40)
async def test_serve_without_the_embedded_agent_lists_no_node(tmp_path):
    server = ServeProcess(tmp_path / "data", "--no-embedded-agent")
    try:
        url = await server.wait_ready()
        token = await server.admin_token()
        with trio.fail_after(30):
            assert await _contributors(url, token) == []
    finally:
        server.kill()


@pytest.mark.deadline(50)
async def test_the_embedded_agent_reports_its_attempts_and_renews_their_leases(tmp_path, agent_dir):
    config = load_config(
        overrides={
            "data_dir": str(tmp_path / "data"),
            "agent_dir": agent_dir,
            "heartbeat_interval": "100ms",
            "lease_duration": "1s",
        },
        environ={},
    )
    fence = new_fence()
    with trio.fail_after(40):
        async with open_service(config, background=True) as service:
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(run_embedded_agent, service)
                await agent.launch("process", standin_job(), fence)
                await agent.providers["process"].wait_ready(fence)
                # Three lease lengths later it still runs: the controller keeps renewing.
                await lease_carried(agent, fence, 3)
                assert agent.expired == []
                node = await service.contributors.get("local")
                assert node.state == "connected"
                assert [(a.attempt_id, a.state) for a in node.attempts] == [
                    (fence.attempt_id, "ready")
                ]
                nursery.cancel_scope.cancel()
    assert not any((Path(agent_dir) / "process" / "attempts").iterdir())


@pytest.mark.deadline(50)
async def test_revoking_the_embedded_node_during_a_heartbeat_stops_it_not_the_controller(
    tmp_path, agent_dir
):
    """The revocation lands while a heartbeat is being written: the write finds the
    credential revoked after the connection was cancelled, with no checkpoint between
    (a store write in a thread cannot be interrupted). The embedded node stops; the
    controller goes on (it crashed with NodeCredentialRevoked, seen in CI)."""
    config = load_config(
        overrides={
            "data_dir": str(tmp_path / "data"),
            "agent_dir": agent_dir,
            "heartbeat_interval": "50ms",
        },
        environ={},
    )
    with trio.fail_after(40):
        async with open_service(config, background=True) as service:
            registry = service.contributors
            heartbeat, revoked = registry.heartbeat, trio.Event()

            async def revoked_while_writing(node_id, *args, **kwargs):
                if not revoked.is_set():
                    return await heartbeat(node_id, *args, **kwargs)
                await registry.revoke_node(node_id)
                raise NodeCredentialRevoked(node_id)

            registry.heartbeat = revoked_while_writing
            async with trio.open_nursery() as nursery:
                await nursery.start(run_embedded_agent, service)
                revoked.set()
            # The agent's task ended by itself; the controller still answers.
            node = await registry.get("local")
            assert node.state == "revoked"
            assert registry.live.link("local") is None
            assert (await service.auth.bootstrap())["token"]


@pytest.mark.deadline(50)
async def test_the_controller_and_its_embedded_agent_load_one_plugin_set(
    tmp_path, agent_dir, monkeypatch
):
    built = []

    class CountedPluginManager(pluggy.PluginManager):
        def __init__(self, project_name: str) -> None:
            built.append(project_name)
            super().__init__(project_name)

    monkeypatch.setattr(pluggy, "PluginManager", CountedPluginManager)
    config = load_config(
        overrides={"data_dir": str(tmp_path / "data"), "agent_dir": agent_dir}, environ={}
    )
    with trio.fail_after(40):
        async with open_service(config, background=True) as service:
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(run_embedded_agent, service)
                # What a submission checks its engine against, and what the agent runs.
                assert "llama_cpp" in service.inference.adapters
                assert isinstance(agent.providers["process"], service.plugins.executors["process"])
                nursery.cancel_scope.cancel()
    assert built == ["ficc"]
