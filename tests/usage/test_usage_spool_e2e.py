"""A SIGKILLed controller loses no usage: what it answered is in the usage API after a
restart on the same data directory (docs/usage.md, "Accounting").

A real ``ficc serve`` subprocess, its embedded agent and a managed llama_cpp service whose
runtime is the stand-in engine (as tests/controller/test_shutdown_streams.py runs it). The usage
writer writes every 30 s, so the records of the requests answered are certainly only in
its buffer (and its spool) when the controller is killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from ..agent.test_agent_processes import _engine_pids
from ..controller.test_shutdown_streams import _fake_llama_server, _ready_service
from ..support.serve_support import ServeProcess

N = 7


def _serve(tmp_path: Path, agent_dir: Path) -> ServeProcess:
    config = tmp_path / "ficc.toml"
    config.write_text('usage_flush_interval = "30s"\n')
    return ServeProcess(
        tmp_path / "data",
        "--agent-dir",
        str(agent_dir),
        "--agent-config",
        str(_fake_llama_server(tmp_path)),
        config=config,
    )


@pytest.mark.deadline(130)
async def test_the_usage_of_requests_a_sigkilled_controller_answered_is_there_after_restart(
    tmp_path,
):
    agent_dir = Path(tempfile.mkdtemp(prefix="fu-", dir="/tmp"))
    spool = tmp_path / "data" / "usage-spool"
    first = _serve(tmp_path, agent_dir)
    second = None
    try:
        with trio.fail_after(120):
            url = await first.wait_ready()
            token = await first.admin_token()
            auth = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=url, headers=auth, timeout=30) as http:
                service_id = await _ready_service(http)
                path = f"/api/v1/inference/{service_id}/v1/chat/completions"
                body = {"model": "standin", "messages": [{"role": "user", "content": "hi"}]}
                for _ in range(N):
                    answered = await http.post(path, json={**body, "standin_deltas": 3})
                    assert answered.status_code == 200, answered.text
            first.proc.send_signal(signal.SIGKILL)  # well within the 30 s flush interval
            first.proc.wait()
            first.kill()

            second = _serve(tmp_path, agent_dir)
            url = await second.wait_ready()
            async with httpx.AsyncClient(base_url=url, headers=auth, timeout=30) as http:
                report = await http.get(
                    "/api/v1/usage", params={"service": service_id, "group_by": "key"}
                )
            assert report.status_code == 200, report.text
            groups = report.json()["groups"]
            assert [group["requests"] for group in groups] == [N]  # not [] as before the spool
            assert groups[0]["errors"] == 0 and groups[0]["completion_tokens"] == 3 * N
            # The killed run's spool is replayed and gone; a clean stop leaves none.
            second.proc.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(second.proc.wait, 30)
            assert sorted(p.name for p in spool.iterdir()) == []
    finally:
        for server in (first, second):
            if server is not None:
                server.kill()
        for pid in _engine_pids(agent_dir):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(agent_dir, ignore_errors=True)
