"""Acceptance: a replica's log on a remote node, followed with a ticket through real
`ficc serve --no-embedded-agent` and `ficc executor` processes, and by `ficc inference logs`."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import time
from contextlib import aclosing
from pathlib import Path

import httpx
import pytest
import trio

from ..agent.test_agent_processes import ExecutorProcess, _add_node, agent_dir  # noqa: F401
from ..support.inference_support import Controller
from ..support.logs_support import STARTUP_LINES, logging_engine, settled_log, sse_items, tiny_model
from ..support.serve_support import FICC, ServeProcess


async def _read_until(pipe, pattern: str, seconds: float = 30) -> str:
    """Read ``pipe`` (a process's output) up to a line matching ``pattern``."""

    def read() -> str:
        for line in pipe:
            if re.search(pattern, line):
                return line
        raise AssertionError(f"the process ended without printing {pattern!r}")

    with trio.fail_after(seconds):
        return await trio.to_thread.run_sync(read, abandon_on_cancel=True)


def _cli(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*FICC, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _expire_tickets(data_dir: Path) -> None:
    """Move every unused ticket's expiry into the past, as 60 s passing would."""
    with sqlite3.connect(data_dir / "ficc.sqlite3", timeout=10) as db:
        db.execute(
            "UPDATE stream_tickets SET expires_at = ? WHERE used_at IS NULL", (time.time() - 1,)
        )


async def _ready_service(controller: Controller, engine: Path) -> dict:
    with trio.fail_after(60):
        node = await controller.wait_node("gpu-1")
        while node["snapshot"] is None:
            await trio.sleep(0.1)
            node = await controller.node("gpu-1")
    [runtime] = [
        r for r in node["snapshot"]["runtimes"] if r["image_digest"].endswith(_digest(engine))
    ]
    spec = {
        "alias": "smol",
        "model_id": await tiny_model(controller),
        "engine": "llama_cpp",
        "runtime": {
            "executor_provider": runtime["executor_provider"],
            "package_digest": runtime["package_digest"],
            "image_digest": runtime["image_digest"],
            "isolation": "process",
            "network": "none",
        },
        "image_executable": str(engine),
        "context": 512,
        "concurrency": 2,
        "placements": [{"node_id": "gpu-1", "limits": {"cpus": 1, "memory_bytes": 1024**3}}],
    }
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    assert (await controller.control(created["id"], "start")).status_code == 200
    with trio.fail_after(60):
        view = await controller.wait_service(created["id"], lambda v: v["state"] == "ready")
    await settled_log(controller, created["id"])
    return view


def _digest(engine: Path) -> str:
    import hashlib

    return hashlib.sha256(engine.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_remote_replica_s_log_is_followed_with_a_ticket_and_ends_on_the_node(
    tmp_path,
    agent_dir,  # noqa: F811
):
    config = tmp_path / "ficc.toml"
    config.write_text('heartbeat_interval = "200ms"\nlog_keepalive = "300ms"\n')
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir, "--no-embedded-agent", config=config)
    executor = None
    try:
        url = await server.wait_ready()
        admin = await server.admin_token()
        engine, settings = logging_engine(tmp_path)
        token = _add_node(data_dir, "gpu-1")
        executor = ExecutorProcess(url, token, agent_dir, "--agent-config", str(settings))
        await executor.wait_connected()
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            controller = Controller(None, url, admin, http)
            view = await _ready_service(controller, engine)
            service_id, attempt_id = view["id"], view["replicas"][0]["attempt_id"]
            following = f"following the log of attempt {attempt_id}"
            stopped = f"stopped following the log of attempt {attempt_id}"
            base = f"/api/v1/inference/{service_id}/replicas/0/logs"

            snapshot = await controller.ok("GET", base, params={"tail": 1000})
            assert snapshot["node_id"] == "gpu-1" and snapshot["attempt_id"] == attempt_id
            assert snapshot["lines"][:STARTUP_LINES] == [
                f"fake llama-server line {n}" for n in range(STARTUP_LINES)
            ]

            # Follow it with a ticket: the last lines, then keepalives while it is quiet.
            ticket = (await controller.ok("POST", base + "/ticket"))["ticket"]
            params = {"ticket": ticket, "tail": 4}
            async with http.stream("GET", base + "/stream", params=params) as opened:
                assert opened.status_code == 200
                seen = []
                async with aclosing(sse_items(opened)) as items:
                    with trio.fail_after(30):
                        async for item in items:
                            seen.append(item)
                            if sum(kind == "comment" for kind, _ in seen) == 3:
                                break
                await _read_until(executor.proc.stderr, following)
                assert [value for kind, value in seen if kind == "data"] == snapshot["lines"][-4:]
                assert ("comment", "keepalive") in seen

                # A reused ticket and an expired one are 401.
                reused = await http.get(base + "/stream", params=params)
                assert reused.status_code == 401
                assert reused.json()["error"]["details"]["reason"] == "used"
                expired = (await controller.ok("POST", base + "/ticket"))["ticket"]
                await trio.to_thread.run_sync(_expire_tickets, data_dir)
                refused = await http.get(base + "/stream", params={"ticket": expired})
                assert refused.status_code == 401
                assert refused.json()["error"]["code"] == "ticket_invalid"
                assert refused.json()["error"]["details"]["reason"] == "expired"
            # The client closed its stream: the follow ends on the node.
            line = await _read_until(executor.proc.stderr, stopped)
            assert "the follow was closed; 0 follows open" in line

            # The CLI prints the last lines, and follows until Ctrl-C ends it on the node.
            env = {**os.environ, "FICC_URL": url, "FICC_TOKEN": admin, "PYTHONUNBUFFERED": "1"}
            env.pop("FICC_CONFIG", None)
            with trio.fail_after(60):
                printed = await trio.run_process(
                    [*FICC, "inference", "logs", "smol", "--tail", "2"],
                    capture_stdout=True,
                    capture_stderr=True,
                    env=env,
                )
            assert printed.stdout.decode().splitlines() == snapshot["lines"][-2:]
            assert f"attempt {attempt_id} (ready) on node gpu-1" in printed.stderr.decode()
            follower = _cli(env, "inference", "logs", "smol", "-f", "--tail", "1")
            try:
                first = await _read_until(follower.stdout, ".")
                assert first.rstrip("\n") == snapshot["lines"][-1]
                await _read_until(executor.proc.stderr, following)
                follower.send_signal(signal.SIGINT)
                with trio.fail_after(30):
                    assert await trio.to_thread.run_sync(follower.wait) == 130
            finally:
                if follower.poll() is None:
                    follower.kill()
                    follower.wait()
                follower.stdout.close()
                follower.stderr.close()
            line = await _read_until(executor.proc.stderr, stopped)
            assert "0 follows open" in line
    finally:
        if executor is not None:
            executor.kill()
        server.kill()


@pytest.mark.slow
@pytest.mark.deadline(100)
async def test_the_log_of_an_attempt_that_ended_before_the_agent_restarted_is_served_after(
    tmp_path,
    agent_dir,  # noqa: F811
):
    config = tmp_path / "ficc.toml"
    config.write_text('heartbeat_interval = "200ms"\n')
    data_dir = tmp_path / "data"
    server = ServeProcess(data_dir, "--no-embedded-agent", config=config)
    executors: list[ExecutorProcess] = []
    try:
        url = await server.wait_ready()
        admin = await server.admin_token()
        engine, settings = logging_engine(tmp_path)
        token = _add_node(data_dir, "gpu-1")
        executors.append(ExecutorProcess(url, token, agent_dir, "--agent-config", str(settings)))
        await executors[-1].wait_connected()
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            controller = Controller(None, url, admin, http)
            view = await _ready_service(controller, engine)
            service_id, attempt_id = view["id"], view["replicas"][0]["attempt_id"]
            base = f"/api/v1/inference/{service_id}/replicas/0/logs"
            before = await controller.ok("GET", base, params={"tail": 1000})

            # The attempt ends (the service is stopped), then the agent restarts.
            assert (await controller.control(service_id, "stop")).status_code == 200
            with trio.fail_after(60):
                await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            executors[-1].kill()
            executors.append(
                ExecutorProcess(url, token, agent_dir, "--agent-config", str(settings))
            )
            await executors[-1].wait_connected()

            after = await controller.ok("GET", base, params={"tail": 1000})
            assert after["attempt_id"] == attempt_id and after["node_id"] == "gpu-1"
            assert after["attempt_state"] != "ready"
            assert after["lines"][:STARTUP_LINES] == before["lines"][:STARTUP_LINES]
            assert after["lines"][:STARTUP_LINES] == [
                f"fake llama-server line {n}" for n in range(STARTUP_LINES)
            ]
            # A follow of it gives its lines and ends: the attempt is over.
            ticket = (await controller.ok("POST", base + "/ticket"))["ticket"]
            params = {"ticket": ticket, "tail": 3}
            async with http.stream("GET", base + "/stream", params=params) as opened:
                assert opened.status_code == 200
                with trio.fail_after(30):
                    items = [item async for item in sse_items(opened)]
            assert [value for kind, value in items if kind == "data"] == after["lines"][-3:]
            # It was kept on the node's disk, beside the provider's attempts.
            assert list(agent_dir.glob("*/logs/*/kept.json"))
    finally:
        for executor in executors:
            executor.kill()
        server.kill()
