"""A replica's node that stops heartbeating, or whose connection drops, shows at once.

A real `ficc executor` process runs a service's replica (the stand-in engine as the
llama_server runtime, a tiny GGUF as its model); the controller's sweep is set far
off (unreachable after 30 s), so only the status's own liveness can explain what
the tests see within one heartbeat interval.
"""

from __future__ import annotations

import re
import signal
from contextlib import asynccontextmanager

import pytest
import trio

from ..agent.test_agent_processes import ExecutorProcess, agent_dir  # noqa: F401
from ..cli.test_cli_inference import Cli
from ..support.inference_support import (
    llama_spec,
    open_inference_controller,
    register_gguf,
    standin_engine,
)
from ..support.models_support import tiny_gguf

HEARTBEAT = 0.5
#: Two heartbeat intervals, and at least two seconds more than one (the registry's rule).
STALE_AFTER = max(2 * HEARTBEAT, HEARTBEAT + 2.0)
SLOW_SWEEP = {
    "heartbeat_interval": f"{int(HEARTBEAT * 1000)}ms",
    "unreachable_after": "30s",
    "lost_after": "60s",
}


def _replica(status: dict) -> dict:
    (replica,) = status["replicas"]
    return replica


async def _serving_on_remote_node(controller, folder, tmp_path) -> tuple[ExecutorProcess, str]:
    engine, settings = standin_engine(tmp_path)
    _, credential = await controller.service.contributors.add_node("gpu-1")
    executor = ExecutorProcess(controller.url, credential, folder, "--agent-config", str(settings))
    await executor.wait_connected()
    node = await controller.wait_node("gpu-1")
    while not node["snapshot"] or not node["snapshot"]["runtimes"]:
        node = await controller.node("gpu-1")
    tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
    model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
    spec = await llama_spec(controller, model_id, node_ids=("gpu-1",), memory_bytes=256 << 20)
    spec["image_executable"] = str(engine)
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    assert (await controller.control(created["id"], "start")).status_code == 200
    await controller.wait_service(created["id"], lambda view: view["state"] == "ready")
    return executor, created["id"]


@asynccontextmanager
async def _remote_service(tmp_path, folder):
    """A controller without an embedded node, and a service ready on a remote node run
    by a real executor (killed at the end): (controller, executor, service ID)."""
    executor = None
    try:
        with trio.fail_after(120):
            async with open_inference_controller(
                tmp_path, embedded=False, **SLOW_SWEEP
            ) as controller:
                executor, service_id = await _serving_on_remote_node(controller, folder, tmp_path)
                yield controller, executor, service_id
    finally:
        if executor is not None:
            executor.kill()


@pytest.mark.deadline(60)
async def test_a_silent_then_killed_remote_node_shows_on_its_replica_within_a_heartbeat(
    tmp_path,
    agent_dir,  # noqa: F811
):
    async with _remote_service(tmp_path, agent_dir) as (controller, executor, service_id):
        status = await controller.wait_status(service_id, lambda s: _replica(s)["health"] == "200")
        replica = _replica(status)
        assert replica["serving"] and replica["state"] == "ready"
        assert replica["node"]["id"] == "gpu-1"
        assert replica["node"]["state"] == "connected" and replica["node"]["connected"]
        assert replica["node"]["heartbeat_age"] < STALE_AFTER
        assert replica["pid"] > 0 and replica["started_at"] <= replica["ready_at"]

        # Frozen: the connection stays open, its heartbeats stop.
        executor.proc.send_signal(signal.SIGSTOP)
        frozen = trio.current_time()
        try:
            status = await controller.wait_status(
                service_id, lambda s: _replica(s)["node"]["stale"]
            )
            seen = trio.current_time() - frozen
            # It missed a heartbeat: shown within one interval of the one it missed.
            assert seen < STALE_AFTER + HEARTBEAT, seen
            replica = _replica(status)
            assert replica["node"]["state"] == "stale"
            assert replica["node"]["recorded_state"] == "connected"
            assert not replica["serving"] and replica["state"] == "ready"
            view = await controller.wait_service(service_id, lambda v: v["state"] != "ready")
            assert trio.current_time() - frozen < STALE_AFTER + 2 * HEARTBEAT
            assert view["state"] == "starting"
            assert "missed its heartbeats" in view["reason"]
        finally:
            executor.proc.send_signal(signal.SIGCONT)
        # Heard again, it serves again.
        await controller.wait_service(service_id, lambda v: v["state"] == "ready")
        assert _replica(await controller.wait_status(service_id, bool))["serving"]

        # Killed: its connection drops; the replica shows it at once, long before
        # the node would be unreachable.
        executor.proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(executor.proc.wait)
        killed = trio.current_time()
        status = await controller.wait_status(
            service_id, lambda s: not _replica(s)["node"]["connected"]
        )
        assert trio.current_time() - killed < HEARTBEAT
        replica = _replica(status)
        assert replica["node"]["state"] == "disconnected"
        assert replica["node"]["recorded_state"] == "connected"
        assert "not connected to this controller" in replica["node"]["trouble"]
        assert not replica["serving"]
        view = await controller.wait_service(service_id, lambda v: v["state"] != "ready")
        # The reconciler was woken by the drop, not by its next period.
        assert trio.current_time() - killed < HEARTBEAT
        assert view["state"] == "starting"
        assert "not connected to this controller" in view["reason"]
        node = await controller.node("gpu-1")
        assert node["state"] == "connected"  # the sweep has not acted yet


@pytest.mark.deadline(60)
async def test_list_counts_a_ready_replica_on_a_silent_node_as_not_serving(
    tmp_path,
    agent_dir,  # noqa: F811
):
    """`ficc inference list`'s READY agrees with the service's state and the gateway: a
    replica still ``ready`` on record whose node missed its heartbeats does not count."""
    async with _remote_service(tmp_path, agent_dir) as (controller, executor, service_id):
        run = Cli(controller.url, controller.token)
        row = rf"^{service_id}\s+smol\s+\S+\s+llama_cpp\s+{{}}\s+running\s+{{}}\s"
        listed = (await run.ok("list")).stdout
        assert re.search(row.format("ready", "1/1"), listed, re.M), listed
        [view] = (await run.json("list"))["services"]
        assert view["replicas"][0]["serving"]

        executor.proc.send_signal(signal.SIGSTOP)
        try:
            await controller.wait_service(service_id, lambda v: v["state"] == "starting")
            [view] = (await run.json("list"))["services"]
            assert view["replicas"][0]["state"] == "ready"
            assert not view["replicas"][0]["serving"]
            listed = (await run.ok("list")).stdout
            assert re.search(row.format("starting", "0/1"), listed, re.M), listed
        finally:
            executor.proc.send_signal(signal.SIGCONT)
        await controller.wait_service(service_id, lambda v: v["state"] == "ready")
        listed = (await run.ok("list")).stdout
        assert re.search(row.format("ready", "1/1"), listed, re.M), listed
