"""SIGTERM to ``ficc serve`` while a remote agent is connected: the controller ends the
agent's connection itself once nothing is in flight, telling the agent it is going
away (``goodbye``), instead of hypercorn waiting the whole shutdown grace for the
agent's WebSocket; the connection it ended is no trouble of the node's worth an event,
and neither is the node's silence while the controller was away.

A real ``ficc serve`` process (its embedded node ``local``) and a real remote agent
dialling it (``node-2``, in this test's process, as tests/support/ops_support.py runs one), a
service with a ready replica on each.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.events import repository as events_repository
from ficc_core.inference import repository as inference_repository

from ..agent.test_agent_processes import _add_node
from ..inference.test_inference_directory_models import register_tiny_hf, vllm_spec, write_fake_vllm
from ..support.inference_support import Controller
from ..support.ops_support import _node_factory
from ..support.serve_support import ServeProcess
from ..support.waiting import eventually

#: Far longer than the shutdown takes, so waiting it out cannot pass for a prompt exit.
GRACE = 120
#: What "at once" means for a shutdown with nothing in flight (a tenth of the grace).
PROMPT = 12


def _config(tmp_path: Path, folder: Path, agent_settings: Path, extra: str = "") -> Path:
    config = tmp_path / "ficc.toml"
    # Short agent directories: an engine's socket path must fit in 107 bytes.
    config.write_text(
        f'agent_config = "{agent_settings}"\nagent_dir = "{folder / "local"}"\n'
        f'shutdown_grace = "{GRACE}s"\nheartbeat_interval = "200ms"\nlog_level = "warning"\n'
        + extra
    )
    return config


def _remote_node_2(url: str, data: Path, folder: Path, agent_settings: Path) -> RemoteAgent:
    """node-2 added (``ficc admin add-node`` on ``data``), its remote agent dialling ``url``
    again quickly; not started."""
    credential = _add_node(data, "node-2")
    return RemoteAgent(
        url,
        credential,
        _node_factory(folder / "node-2", agent_settings),
        backoff_initial=0.1,
        backoff_max=0.5,
    )


async def _running_on_both(controller: Controller, files: Path, engine: Path) -> str:
    """Wait for both nodes; create and start a service with a replica on each."""
    node = await controller.wait_node("node-2")
    while not node["snapshot"] or not node["snapshot"]["runtimes"]:
        await trio.sleep(0.05)
        node = await controller.node("node-2")
    await controller.wait_node("local")
    model = await register_tiny_hf(controller, files)
    spec = await vllm_spec(controller, model["id"], engine)
    limits = {**spec["placements"][0]["limits"], "cpus": 0.25}
    spec["placements"] = [{"node_id": node_id, "limits": limits} for node_id in ("local", "node-2")]
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    service_id = created["id"]
    started = await controller.control(service_id, "start")
    assert started.status_code == 200, started.text
    await controller.wait_service(service_id, lambda v: v["state"] == "ready")
    return service_id


async def _stop(server: ServeProcess) -> float:
    """SIGTERM; wait for the exit (status 0); return how long it took."""
    began = trio.current_time()
    server.proc.send_signal(signal.SIGTERM)
    code = await trio.to_thread.run_sync(server.proc.wait, abandon_on_cancel=True)
    assert code == 0, server.read_rest()
    return trio.current_time() - began


@pytest.mark.deadline(70)
async def test_sigterm_ends_a_remote_agents_connection_at_once_and_records_no_trouble(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="ficc.agent")
    engine, agent_settings, files = write_fake_vllm(tmp_path)
    data = tmp_path / "data"
    folder = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    server = ServeProcess(data, config=_config(tmp_path, folder, agent_settings))
    try:
        with trio.fail_after(GRACE / 2):
            url = await server.wait_ready()
            admin = await server.admin_token()
            remote = _remote_node_2(url, data, folder, agent_settings)
            async with (
                trio.open_nursery() as nursery,
                httpx.AsyncClient(base_url=url, timeout=30) as http,
            ):
                nursery.start_soon(remote.run)
                controller = Controller(None, url, admin, http)
                service_id = await _running_on_both(controller, files, engine)

                # node-2's replica's live log, relayed over its connection, is open too.
                logs = f"/api/v1/inference/{service_id}/replicas/1/logs"
                ticket = (await controller.ok("POST", logs + "/ticket"))["ticket"]
                # This client's idle keep-alive connection would hold hypercorn's shutdown
                # too (whatever else is open): only node-2's and the log stream's stay.
                await http.aclose()
                async with (
                    httpx.AsyncClient(base_url=url, timeout=30) as follower,
                    follower.stream(
                        "GET", logs + "/stream", params={"ticket": ticket, "tail": 1}
                    ) as stream,
                ):
                    assert stream.status_code == 200
                    began = trio.current_time()
                    server.proc.send_signal(signal.SIGTERM)
                    raw = b"".join([chunk async for chunk in stream.aiter_raw()])
                *_, last = [block for block in raw.decode().split("\n\n") if block]
                assert last.startswith("event: error\ndata: "), last
                assert '"code":"server_shutting_down"' in last.replace(" ", ""), last
                # Ended once nothing was in flight, not at the grace's end: it says so.
                assert "no request is in flight any more" in last, last
                assert '"idle":true' in last.replace(" ", ""), last
                # It waited the whole grace for node-2's WebSocket.
                code = await trio.to_thread.run_sync(server.proc.wait, abandon_on_cancel=True)
                assert trio.current_time() - began < PROMPT
                # The agent was told the controller is going away: no lost connection.
                [link] = remote.links
                await eventually(lambda: not link.connected, None, every=0.02)
                assert link.goodbyes == 1
                nursery.cancel_scope.cancel()
            assert code == 0, server.read_rest()
            said = [r for r in caplog.records if r.name == "ficc.agent"]
            assert any("is shutting down" in r.getMessage() for r in said)
            assert not [r.getMessage() for r in said if r.levelno >= logging.WARNING]

            async with open_service(
                load_config(overrides={"data_dir": str(data)}, environ={})
            ) as stopped:
                events = await stopped.store.read(
                    lambda tx: events_repository.for_service(tx, service_id, limit=1000)
                )
            troubles = [e for e in events if "cannot be reached" in (e.message or "")]
            assert troubles == [], [e.message for e in troubles]
            # The service's last recorded state is still the one it served in.
            *_, last_state = [e for e in events if e.kind == "service.state"]
            assert last_state.message.endswith("→ ready"), last_state.message
    finally:
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_node_silent_only_while_the_controller_was_stopped_is_not_unreachable_or_lost(
    tmp_path,
):
    # The restarted controller's first sweep judged node-2's silence from its last
    # heartbeat, taken before the stop: past lost_after, node-2 was lost at once (its
    # replica unknown, then stopped and started again when node-2 reconnected).
    engine, agent_settings, files = write_fake_vllm(tmp_path)
    data = tmp_path / "data"
    folder = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    # Short enough to pass while the controller is stopped, long enough for its restart.
    timings = 'unreachable_after = "6s"\nlost_after = "7s"\n'
    config = _config(tmp_path, folder, agent_settings, timings)
    server = ServeProcess(data, config=config)
    try:
        with trio.fail_after(GRACE):
            url = await server.wait_ready()
            admin = await server.admin_token()
            remote = _remote_node_2(url, data, folder, agent_settings)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(remote.run)
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    controller = Controller(None, url, admin, http)
                    service_id = await _running_on_both(controller, files, engine)
                    before = await controller.ok("GET", f"/api/v1/inference/{service_id}")
                assert await _stop(server) < PROMPT
                stopped_at = trio.current_time()
                # Down for longer than lost_after: the agent keeps dialling meanwhile.
                await trio.sleep(8)
                assert trio.current_time() - stopped_at > 7
                port = str(urlsplit(url).port)
                server = ServeProcess(data, "--port", port, config=config)
                assert await server.wait_ready() == url
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    controller = Controller(None, url, admin, http)
                    node = await controller.wait_node("node-2")
                    view = await controller.wait_service(
                        service_id, lambda v: v["state"] == "ready"
                    )
                assert await _stop(server) < PROMPT
                nursery.cancel_scope.cancel()
            async with open_service(
                load_config(overrides={"data_dir": str(data)}, environ={})
            ) as ended:
                events = await ended.store.read(
                    lambda tx: events_repository.for_node(tx, "node-2", limit=1000)
                )
                attempts = await ended.store.read(
                    lambda tx: inference_repository.attempts(tx, service_id)
                )
                history = await ended.store.read(
                    lambda tx: events_repository.for_service(tx, service_id, limit=1000)
                )
            changes = [
                (e.reason, e.message)
                for e in events
                if e.kind == "node.state" and e.reason in ("no_heartbeat", "node_lost")
            ]
            assert changes == [], changes
            assert node["state"] == "connected"
            # The same engine serves on node-2: adopted, not stopped and started again.
            assert view["replicas"][1]["attempt_id"] == before["replicas"][1]["attempt_id"]
            assert not [a for a in attempts if a.node_id == "node-2" and a.state == "unknown"]
            # Until each node is back (when the reconciler looks before it is), its replica
            # waits for it; the history then names the controller's restart, not a node
            # that dropped out.
            waits = [e.message for e in history if "cannot be reached" in (e.message or "")]
            assert not [m for m in waits if "is not connected to this controller" in m], waits
    finally:
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)
