"""Acceptance: kill -9 a real llama.cpp engine under a real `ficc serve`; the events say
what happened (the attempt's failure with its reason, the replica's restart) and the
server's log has the INFO line.

A plain `ficc serve` (embedded node, the installed llama-server runtime), the real
SmolLM2 GGUF added with `ficc models add`, a one-replica service from the
suggestion, every command its own `ficc` process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import httpx
import pytest
import trio

from ..agent.test_agent_processes import _engine_pids, agent_dir  # noqa: F401
from ..support.models_support import smollm2_path
from ..support.serve_support import FICC, ServeProcess
from ..support.waiting import eventually

pytestmark = pytest.mark.slow


def _drain(pipe, lines: list[str]) -> threading.Thread:
    """Read the server's stderr (its log) as it comes, so the pipe never fills."""

    def read() -> None:
        for line in pipe:
            lines.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.deadline(610)
async def test_a_killed_engine_is_an_event_with_its_reason_a_restart_and_an_info_line(tmp_path):
    # Short: the engine's socket path lives under it (at most 107 bytes).
    data = Path(tempfile.mkdtemp(prefix="fe-", dir="/tmp"))
    serve = ServeProcess(data)
    log: list[str] = []
    try:
        with trio.fail_after(600):
            url = await serve.wait_ready()
            token = await serve.admin_token()
            _drain(serve.proc.stderr, log)
            env = {k: v for k, v in os.environ.items() if not k.startswith("FICC_")}
            env |= {"FICC_URL": url, "FICC_TOKEN": token, "XDG_CONFIG_HOME": str(tmp_path)}

            async def ficc(*args: str) -> str:
                done = await trio.run_process(
                    [*FICC, *args], capture_stdout=True, capture_stderr=True, env=env, check=False
                )
                out = done.stdout.decode() + done.stderr.decode()
                assert done.returncode == 0, (args, out)
                return out

            await ficc("models", "add", str(smollm2_path()))
            await ficc(
                "inference", "create", "--model", "smollm2", "--engine", "llama_cpp",
                "--alias", "smol", "--yes", "--wait",
            )  # fmt: skip
            service = json.loads(await ficc("inference", "show", "smol", "--json"))
            assert service["state"] == "ready"
            service_id = service["id"]
            [first] = service["replicas"]

            [pid] = _engine_pids(data / "agent")
            os.kill(pid, signal.SIGKILL)

            async with httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ) as http:

                async def events() -> list[dict]:
                    response = await http.get(
                        f"/api/v1/inference/{service_id}/events", params={"limit": 500}
                    )
                    assert response.status_code == 200, response.text
                    return response.json()["events"]

                while True:
                    found = await events()
                    restarted = [e for e in found if e["kind"] == "replica.restarted"]
                    if restarted:
                        break
                    await trio.sleep(0.2)
                view = json.loads(await ficc("inference", "show", "smol", "--json"))

            # The attempt that ran the killed engine failed, and says why.
            [failed] = [
                e
                for e in found
                if e["kind"] == "attempt.state"
                and e["details"]["state"]["to"] == "failed"
                and e["details"]["number"] == first["attempt"]
            ]
            assert failed["reason"] in ("killed", "exited")
            assert failed["replica"] == 0 and failed["node_id"] == "local"
            if failed["reason"] == "killed":
                assert "signal 9" in failed["message"]
            # The replica was launched again as the next attempt, naming that end.
            [restart] = restarted
            assert restart["details"]["number"] == first["attempt"] + 1
            assert restart["details"]["previous"]["attempt_id"] == failed["attempt_id"]
            assert restart["details"]["previous"]["reason"] == failed["reason"]
            assert restart["reason"] == failed["reason"]
            assert view["replicas"][0]["attempt"] >= first["attempt"] + 1

            # The human listing names them too.
            listed = await ficc("inference", "events", "smol", "--limit", "50")
            assert "replica.restarted" in listed and failed["reason"] in listed

            # The server's log has the INFO lines, as the events say them.
            def logged() -> list[str]:
                return [line for line in list(log) if " INFO ficc.events: " in line]

            await eventually(
                lambda: any("replica.restarted" in line for line in logged()), None, every=0.05
            )
            ended = f"attempt.state attempt {failed['attempt_id']} ({failed['reason']}): "
            [line] = [x for x in logged() if ended in x and "→ failed" in x]
            assert failed["message"] in line
            assert any(
                f"replica.restarted replica {service_id}/0 ({failed['reason']})" in x
                for x in logged()
            )
    finally:
        serve.proc.terminate()
        try:
            serve.proc.wait(timeout=30)
        except Exception:
            pass
        serve.kill()
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.deadline(190)
async def test_a_lost_remote_node_and_its_unknown_attempt_are_in_the_service_s_events(
    tmp_path,
    agent_dir,  # noqa: F811
    caplog,
):
    from ..agent.test_agent_processes import ExecutorProcess
    from ..inference.test_inference_faults import FAST_NODES, _lose_and_stop
    from ..support.inference_support import open_inference_controller, write_agent_settings

    caplog.set_level(logging.INFO, logger="ficc.events")
    settings_file = write_agent_settings(tmp_path)
    executor = None
    try:
        with trio.fail_after(180):
            async with open_inference_controller(
                tmp_path, embedded=False, **FAST_NODES
            ) as controller:
                lost = await _lose_and_stop(controller, agent_dir, settings_file)
                service_id, lost_attempt = lost["service_id"], lost["lost_attempt"]
                executor = ExecutorProcess(
                    controller.url,
                    lost["credential"],
                    agent_dir,
                    "--agent-config",
                    str(settings_file),
                )
                await executor.wait_connected()
                await controller.wait_node("gpu-1")
                for _ in range(5):  # the node's reconciliation may move the revision
                    response = await controller.control(
                        service_id, "start", acknowledge_unknown=True
                    )
                    if response.status_code != 409 or "stale_revision" not in response.text:
                        break
                assert response.status_code == 200, response.text
                page = await controller.ok(
                    "GET", f"/api/v1/inference/{service_id}/events", params={"limit": 500}
                )
    finally:
        if executor is not None:
            executor.kill()

    found = page["events"]
    nodes = [
        (e["details"]["state"]["from"], e["details"]["state"]["to"], e["reason"])
        for e in found
        if e["kind"] == "node.state"
    ]
    # Connected before the service was created; then silent, lost, back (a busy
    # machine may have made it unreachable for a moment before: that is an event too).
    lost_at = nodes.index(("unreachable", "lost", "node_lost"))
    assert nodes[lost_at - 1 : lost_at + 2] == [
        ("connected", "unreachable", "no_heartbeat"),
        ("unreachable", "lost", "node_lost"),
        ("lost", "connected", "heartbeat"),
    ]
    mine = [e for e in found if e["kind"] == "attempt.state" and e["attempt_id"] == lost_attempt]
    moves = [(e["details"]["state"]["to"], e["reason"], e["details"]["released"]) for e in mine]
    assert ("unknown", "node_lost", False) in moves
    # Released either by the start that acknowledged it, or before that by the node's
    # reconnection (it no longer runs the attempt): both are events.
    assert moves[-1] in {
        ("unknown", "acknowledged_unknown", True),
        ("stopped", "not_running_after_reconnect", True),
    }
    # The node's events sit between the service's in the order they happened.
    ids = [e["id"] for e in found]
    assert ids == sorted(ids)
    lines = [r.getMessage() for r in caplog.records if r.name == "ficc.events"]
    assert any(line.startswith("node.state node gpu-1 (node_lost): ") for line in lines)
