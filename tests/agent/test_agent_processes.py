"""Two real processes on loopback: `ficc serve --no-embedded-agent` and `ficc executor`."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from ..support.serve_support import FICC, ServeProcess
from ..support.waiting import eventually


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fx-", dir="/tmp"))
    yield path
    # A test that SIGKILLs its executor last leaves engines only a restarted agent
    # would clean up: end them here, by their attempt records, before the records go.
    for pid in _engine_pids(path):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    shutil.rmtree(path, ignore_errors=True)


def _add_node(data_dir: Path, name: str) -> str:
    env = {**os.environ, "FICC_DATA_DIR": str(data_dir)}
    env.pop("FICC_CONFIG", None)
    result = subprocess.run(
        [*FICC, "admin", "add-node", name], capture_output=True, text=True, env=env, check=True
    )
    return result.stdout.rsplit("node credential (shown once): ", 1)[1].strip()


class ExecutorProcess:
    def __init__(self, url: str, token: str, agent_dir: Path, *extra: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "FICC_NODE_CREDENTIAL": token}
        env.pop("FICC_CONFIG", None)
        self.proc = subprocess.Popen(
            [*FICC, "executor", "--controller", url, "--agent-dir", str(agent_dir), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    async def wait_connected(self) -> str:
        def read() -> str:
            for line in self.proc.stdout:
                if "connected to" in line:
                    return line
            raise AssertionError("ficc executor exited: " + self.proc.stderr.read())

        with trio.fail_after(60):
            return await trio.to_thread.run_sync(read, abandon_on_cancel=True)

    def kill(self) -> None:
        """Stop the executor: SIGTERM (it stops its engines), SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


async def _node(url: str, token: str, node_id: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        response = await http.get(
            f"/api/v1/contributors/{node_id}", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 200, response.text
        return response.json()


async def _wait_state(url: str, token: str, node_id: str, state: str, seconds: float) -> dict:
    with trio.fail_after(seconds):
        while True:
            node = await _node(url, token, node_id)
            if node["state"] == state:
                return node
            await trio.sleep(0.1)


@pytest.mark.deadline(60)
async def test_an_executor_process_joins_a_serve_process_and_is_listed_with_its_resources(
    tmp_path, agent_dir
):
    config = tmp_path / "ficc.toml"
    config.write_text('unreachable_after = "1s"\nlost_after = "3s"\nheartbeat_interval = "200ms"\n')
    server = ServeProcess(tmp_path / "data", "--no-embedded-agent", config=config)
    executor = None
    try:
        url = await server.wait_ready()
        admin = await server.admin_token()
        token = _add_node(tmp_path / "data", "gpu-1")
        engine = tmp_path / "llama-server"
        engine.write_text("#!/bin/sh\nexec true\n")
        digest = "sha256:" + hashlib.sha256(engine.read_bytes()).hexdigest()
        agent_config = tmp_path / "agent.toml"
        agent_config.write_text(
            '[labels]\nzone = "lab"\n[[runtimes]]\nname = "llama_server"\n'
            f'provider = "process"\nexecutable = "{engine}"\nimage_digest = "{digest}"\n'
        )
        executor = ExecutorProcess(url, token, agent_dir, "--agent-config", str(agent_config))
        assert "as node gpu-1" in await executor.wait_connected()
        node = await _wait_state(url, admin, "gpu-1", "connected", 30)
        while node["snapshot"] is None:
            await trio.sleep(0.1)
            node = await _node(url, admin, "gpu-1")
        resources = node["snapshot"]["resources"]
        assert resources["cpus"] == len(os.sched_getaffinity(0))
        assert resources["memory_bytes"] > 0 and resources["disk_free_bytes"] > 0
        assert node["snapshot"]["endpoint_version"] == 1
        (runtime,) = node["snapshot"]["runtimes"]
        assert (runtime["name"], runtime["image_digest"]) == ("llama_server", digest)
        assert node["snapshot"]["labels"]["zone"] == "lab"

        # SIGKILL the agent: unreachable after 1 s of silence, lost after 3 s.
        executor.proc.send_signal(signal.SIGKILL)
        executor.proc.wait()
        started = trio.current_time()
        await _wait_state(url, admin, "gpu-1", "unreachable", 10)
        assert trio.current_time() - started < 3
        await _wait_state(url, admin, "gpu-1", "lost", 10)
        assert trio.current_time() - started >= 2.5

        # Restarted with the same credential, it connects again.
        executor = ExecutorProcess(url, token, agent_dir)
        await executor.wait_connected()
        await _wait_state(url, admin, "gpu-1", "connected", 30)
    finally:
        if executor is not None:
            executor.kill()
        server.kill()


@pytest.mark.deadline(40)
async def test_an_executor_with_a_project_credential_is_refused_and_exits(tmp_path, agent_dir):
    server = ServeProcess(tmp_path / "data", "--no-embedded-agent")
    try:
        url = await server.wait_ready()
        admin = await server.admin_token()
        executor = ExecutorProcess(url, admin, agent_dir)
        with trio.fail_after(30):
            code = await trio.to_thread.run_sync(executor.proc.wait)
        assert code != 0
        stderr = executor.proc.stderr.read()
        assert "refused the node credential" in stderr
        # One line, the command's error: no traceback of the nursery that carried it.
        assert "Traceback" not in stderr, stderr
        assert stderr.strip().splitlines()[-1].startswith("Error: "), stderr
    finally:
        server.kill()


def test_executor_help_names_its_options():
    result = subprocess.run(
        [sys.executable, "-m", "ficc_core", "executor", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for flag in ("--controller", "--credential", "FICC_NODE_CREDENTIAL", "--agent-dir"):
        assert flag in result.stdout


def _engine_pids(agent_dir: Path) -> list[int]:
    import json

    pids = []
    for record in agent_dir.glob("*/attempts/*/attempt.json"):
        pid = json.loads(record.read_text()).get("pid")
        if pid:
            pids.append(pid)
    return pids


def _watchdog_pids(agent_dir: Path) -> list[int]:
    import json

    records = [json.loads(r.read_text()) for r in agent_dir.glob("*/attempts/*/attempt.json")]
    return [record["watchdog"]["pid"] for record in records if "watchdog" in record]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not running an engine.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.deadline(70)
async def test_a_killed_executor_goes_unreachable_then_lost_and_a_restart_leaves_nothing_behind(
    tmp_path, agent_dir
):
    from ficc_core.testing.executor_kit import new_fence, standin_job

    from ..support.agent_support import open_controller

    settings = {"unreachable_after": "1s", "lost_after": "3s", "heartbeat_interval": "200ms"}
    executor = None
    try:
        with trio.fail_after(60):
            async with open_controller(tmp_path, **settings) as (service, url):
                _, token = await service.contributors.add_node("gpu-1")
                executor = ExecutorProcess(url, token, agent_dir)
                await executor.wait_connected()
                while (await service.contributors.get("gpu-1")).state != "connected":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                fence = new_fence()
                await service.contributors.launch("gpu-1", "process", standin_job(), fence)
                while not (await service.contributors.get("gpu-1")).attempts:  # noqa: ASYNC110
                    await trio.sleep(0.05)
                (engine,) = _engine_pids(agent_dir)
                (watchdog,) = _watchdog_pids(agent_dir)
                assert _alive(engine) and _alive(watchdog)

                executor.proc.send_signal(signal.SIGKILL)
                executor.proc.wait()
                started = trio.current_time()
                while (await service.contributors.get("gpu-1")).state != "unreachable":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                assert 0.5 < trio.current_time() - started < 3
                while (node := await service.contributors.get("gpu-1")).state != "lost":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                assert trio.current_time() - started >= 2.5
                assert [a.state for a in node.attempts] == ["unknown"]

                # Restarted, it removes what it left behind and reports a clean node.
                executor = ExecutorProcess(url, token, agent_dir)
                await executor.wait_connected()
                while (node := await service.contributors.get("gpu-1")).state != "connected":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                assert node.attempts == ()
                assert not _alive(engine)
                # Restarted within the lease, the agent also ends the old watchdog.
                assert not _alive(watchdog)
                assert _engine_pids(agent_dir) == []

                # SIGTERM stops the agent and its engines with it.
                await service.contributors.launch("gpu-1", "process", standin_job(), new_fence())
                (engine,) = _engine_pids(agent_dir)
                executor.proc.send_signal(signal.SIGTERM)
                assert await trio.to_thread.run_sync(executor.proc.wait) == 0
                assert not _alive(engine)
    finally:
        if executor is not None:
            executor.kill()


@pytest.mark.deadline(70)
async def test_a_frozen_controller_lets_the_leases_run_out_and_the_agent_stops_its_attempts(
    tmp_path, agent_dir
):
    from ficc_core.agent.remote import RemoteAgent
    from ficc_core.testing.executor_kit import new_fence, standin_job

    from ..support.agent_support import lease_carried, process_agent_maker

    config = tmp_path / "ficc.toml"
    config.write_text('lease_duration = "1s"\nheartbeat_interval = "200ms"\n')
    server = ServeProcess(tmp_path / "data", "--no-embedded-agent", config=config)
    try:
        url = await server.wait_ready()
        admin = await server.admin_token()
        token = _add_node(tmp_path / "data", "gpu-1")
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
                agent = await nursery.start(remote.run)
                fence = new_fence()
                await agent.launch("process", standin_job(), fence)
                await agent.providers["process"].wait_ready(fence)
                await lease_carried(agent, fence, 2)  # renewals arrive: it keeps running
                assert agent.expired == []

                server.proc.send_signal(signal.SIGSTOP)
                try:
                    await eventually(lambda: fence.attempt_id in agent.expired, None, every=0.05)
                    status = await agent.providers["process"].status(fence)
                    assert status.state == "stopped"
                finally:
                    server.proc.send_signal(signal.SIGCONT)
                # Resumed, the controller renews nothing stale: once it has taken five more
                # heartbeats (200 ms apart: a lease length, three renewal periods), no
                # engine runs for that fence.
                seen = (await _node(url, admin, "gpu-1"))["last_heartbeat"]
                for _ in range(5):
                    while (latest := await _node(url, admin, "gpu-1"))["last_heartbeat"] == seen:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                    seen = latest["last_heartbeat"]
                assert agent.leases() == []
                assert not any(_alive(pid) for pid in _engine_pids(agent_dir))
                nursery.cancel_scope.cancel()
    finally:
        server.kill()


def _engines_by_attempt(agent_dir: Path) -> dict[str, int]:
    import json

    found = {}
    for record in agent_dir.glob("*/attempts/*/attempt.json"):
        try:
            document = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if document.get("pid"):
            found[document["attempt_id"]] = document["pid"]
    return found


@pytest.mark.deadline(100)
async def test_a_reconnecting_executor_keeps_wanted_engines_and_stops_given_up_ones(
    tmp_path, agent_dir
):
    from ficc_core.testing.executor_kit import new_fence, standin_job

    from ..support.agent_support import open_controller

    async def reconnected(service, previous: str):
        while True:
            result = service.contributors.reconciled.get("gpu-1")
            if result is not None and result.connection_id != previous:
                return result
            await trio.sleep(0.05)

    async def ready(service, attempt_id: str) -> None:
        while True:
            node = await service.contributors.get("gpu-1")
            states = {a.attempt_id: a.state for a in node.attempts}
            if states.get(attempt_id) == "ready":
                return
            await trio.sleep(0.05)

    executor = None
    try:
        with trio.fail_after(90):
            async with open_controller(tmp_path, heartbeat_interval="200ms") as (service, url):
                registry = service.contributors
                _, token = await registry.add_node("gpu-1")
                executor = ExecutorProcess(url, token, agent_dir)
                await executor.wait_connected()
                first = await reconnected(service, "")
                kept = new_fence()
                await registry.launch("gpu-1", "process", standin_job(), kept)
                await ready(service, kept.attempt_id)
                engine = _engines_by_attempt(agent_dir)[kept.attempt_id]

                # The connection drops; the agent reconnects and its engine is adopted.
                registry.drop_connection("gpu-1")
                second = await reconnected(service, first.connection_id)
                assert second.adopted == (kept.attempt_id,) and second.stop == ()
                assert _engines_by_attempt(agent_dir) == {kept.attempt_id: engine}
                assert _alive(engine)

                # While it is cut off, the controller gives one attempt up.
                dropped = new_fence()
                await registry.launch("gpu-1", "process", standin_job(), dropped)
                await ready(service, dropped.attempt_id)
                dropped_engine = _engines_by_attempt(agent_dir)[dropped.attempt_id]
                executor.proc.send_signal(signal.SIGSTOP)
                try:
                    registry.drop_connection("gpu-1")
                    await eventually(lambda: not registry.connected_here("gpu-1"), None, every=0.05)
                    assert await registry.give_up("gpu-1", dropped.attempt_id)
                finally:
                    executor.proc.send_signal(signal.SIGCONT)
                third = await reconnected(service, second.connection_id)
                assert third.adopted == (kept.attempt_id,)
                assert [fence.attempt_id for fence in third.stop] == [dropped.attempt_id]
                await eventually(lambda: not _alive(dropped_engine), None, every=0.05)
                # Only the adopted engine runs (a stopped attempt keeps its record and log).
                running = [pid for pid in _engines_by_attempt(agent_dir).values() if _alive(pid)]
                assert running == [engine]
                node = await registry.get("gpu-1")
                while [a.attempt_id for a in node.attempts] != [kept.attempt_id]:
                    await trio.sleep(0.05)
                    node = await registry.get("gpu-1")
    finally:
        if executor is not None:
            executor.kill()


@pytest.mark.deadline(70)
async def test_an_engine_is_stopped_on_its_node_once_its_killed_agent_s_lease_passes(
    tmp_path, agent_dir
):
    from ficc_core.testing.executor_kit import new_fence, standin_job

    from ..support.agent_support import open_controller

    lease = 3.0
    settings = {"lease_duration": f"{lease}s", "heartbeat_interval": "200ms"}
    executor = None
    try:
        with trio.fail_after(60):
            async with open_controller(tmp_path, **settings) as (service, url):
                _, token = await service.contributors.add_node("gpu-1")
                executor = ExecutorProcess(url, token, agent_dir)
                await executor.wait_connected()
                while (await service.contributors.get("gpu-1")).state != "connected":  # noqa: ASYNC110
                    await trio.sleep(0.05)
                await service.contributors.launch("gpu-1", "process", standin_job(), new_fence())
                while not (await service.contributors.get("gpu-1")).attempts:  # noqa: ASYNC110
                    await trio.sleep(0.05)
                (engine,) = _engine_pids(agent_dir)
                watchdogs = _watchdog_pids(agent_dir)

                # Renewed, it runs past its first lease.
                launched = trio.current_time()
                while trio.current_time() < launched + 2 * lease:
                    assert _alive(engine)
                    await trio.sleep(0.1)

                executor.proc.send_signal(signal.SIGKILL)
                executor.proc.wait()
                # Not ended with its agent: the lease it was granted still runs.
                assert _alive(engine)
                # No agent runs on the node now; the engine is stopped there anyway.
                with trio.move_on_after(lease + 5.0):
                    await eventually(lambda: not _alive(engine), None, every=0.05)
                assert not _alive(engine), "the engine outlived its lease"
                assert len(watchdogs) == 1
                await eventually(lambda: not _alive(watchdogs[0]), None, every=0.05)
    finally:
        if executor is not None:
            executor.kill()
