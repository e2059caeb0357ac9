"""SIGTERM to ``ficc serve`` while a remote agent is connected: the controller ends the
agent's connection itself once nothing is in flight, instead of hypercorn waiting the
whole shutdown grace for the agent's WebSocket, and the connection it ended is no
trouble of the node's worth an event.

A real ``ficc serve`` process (its embedded node ``local``) and a real remote agent
dialling it (``node-2``, in this test's process, as tests/ops_support.py runs one), a
service with a ready replica on each.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.events import repository as events_repository

from .inference_support import Controller
from .ops_support import _node_factory
from .serve_support import ServeProcess
from .test_agent_processes import _add_node
from .test_inference_directory_models import register_tiny_hf, vllm_spec, write_fake_vllm

#: Far longer than the shutdown takes, so waiting it out cannot pass for a prompt exit.
GRACE = 120


async def test_sigterm_ends_a_remote_agents_connection_at_once_and_records_no_trouble(tmp_path):
    engine, agent_settings, files = write_fake_vllm(tmp_path)
    data = tmp_path / "data"
    # Short agent directories: an engine's socket path must fit in 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    config = tmp_path / "ficc.toml"
    config.write_text(
        f'agent_config = "{agent_settings}"\nagent_dir = "{folder / "local"}"\n'
        f'shutdown_grace = "{GRACE}s"\nheartbeat_interval = "200ms"\nlog_level = "warning"\n'
    )
    server = ServeProcess(data, config=config)
    try:
        with trio.fail_after(GRACE / 2):
            url = await server.wait_ready()
            admin = await server.admin_token()
            credential = _add_node(data, "node-2")
            remote = RemoteAgent(
                url,
                credential,
                _node_factory(folder / "node-2", agent_settings),
                backoff_initial=0.1,
                backoff_max=0.5,
            )
            async with (
                trio.open_nursery() as nursery,
                httpx.AsyncClient(base_url=url, timeout=30) as http,
            ):
                nursery.start_soon(remote.run)
                controller = Controller(None, url, admin, http)
                node = await controller.wait_node("node-2")
                while not node["snapshot"] or not node["snapshot"]["runtimes"]:
                    await trio.sleep(0.05)
                    node = await controller.node("node-2")
                await controller.wait_node("local")
                model = await register_tiny_hf(controller, files)
                spec = await vllm_spec(controller, model["id"], engine)
                limits = {**spec["placements"][0]["limits"], "cpus": 0.25}
                spec["placements"] = [
                    {"node_id": node_id, "limits": limits} for node_id in ("local", "node-2")
                ]
                created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
                service_id = created["id"]
                started = await controller.control(service_id, "start")
                assert started.status_code == 200, started.text
                await controller.wait_service(service_id, lambda v: v["state"] == "ready")

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
                    server.proc.send_signal(signal.SIGTERM)
                    raw = b"".join([chunk async for chunk in stream.aiter_raw()])
                *_, last = [block for block in raw.decode().split("\n\n") if block]
                assert last.startswith("event: error\ndata: "), last
                assert '"code":"server_shutting_down"' in last.replace(" ", ""), last
                # Ended once nothing was in flight, not at the grace's end: it says so.
                assert "no request is in flight any more" in last, last
                assert '"idle":true' in last.replace(" ", ""), last
                # It waited the whole grace for node-2's WebSocket; the hang guard above
                # is half the grace.
                code = await trio.to_thread.run_sync(server.proc.wait, abandon_on_cancel=True)
                nursery.cancel_scope.cancel()
            assert code == 0, server.read_rest()

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
