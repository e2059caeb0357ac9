"""Kill -9 the real llama.cpp engine of a `ficc serve`: its replica's status says so.

A plain `ficc serve` with its embedded node, the real SmolLM2 GGUF, one replica;
everything is read through the `ficc` executable, as an operator does: `ficc
inference show` before and after the engine is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
import trio

from ..support.models_support import smollm2_path
from ..support.serve_support import ServeProcess, ficc_command

pytestmark = pytest.mark.slow


@pytest.mark.deadline(610)
async def test_a_killed_engine_shows_its_exit_restart_new_pid_and_health(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("FICC_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    ficc = ficc_command(env)

    async def status() -> dict:
        return json.loads(await ficc("inference", "show", "smollm2", "--json"))["status"]

    async def replica_when(predicate) -> dict:
        while True:
            (replica,) = (await status())["replicas"]
            if predicate(replica):
                return replica
            await trio.sleep(0.2)

    data = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    serve = ServeProcess(data)
    try:
        with trio.fail_after(600):
            await serve.log_in_admin(ficc)
            await ficc("models", "add", str(smollm2_path()))
            await ficc(
                "inference", "create", "--model", "smollm2", "--engine", "llama_cpp",
                "--replicas", "1", "--yes", "--wait",
            )  # fmt: skip
            first = await replica_when(lambda r: r["health"] == "200")
            assert (first["state"], first["restarts"], first["last_exit"]) == ("ready", 0, None)
            assert first["serving"] and first["node"]["state"] == "connected"
            assert first["started_at"] <= first["ready_at"]
            # The PID is the engine's own: llama.cpp's server runs as it.
            cmdline = Path(f"/proc/{first['pid']}/cmdline")
            comm = (await trio.to_thread.run_sync(cmdline.read_bytes)).split(b"\0")
            assert any(b"llama" in part for part in comm), comm

            os.kill(first["pid"], signal.SIGKILL)
            second = await replica_when(lambda r: r["restarts"] == 1 and r["health"] == "200")
            exit_ = second["last_exit"]
            assert exit_["attempt_id"] == first["attempt_id"]
            assert (exit_["signal"], exit_["exit_code"], exit_["memory_limit"]) == (9, None, False)
            assert exit_["reason"] == "killed" and "signal 9" in exit_["message"]
            assert second["pid"] not in (None, first["pid"])
            assert second["attempt"] == first["attempt"] + 1
            assert second["state"] == "ready"

            shown = await ficc("inference", "show", "smollm2")
            assert re.search(
                rf"^0\s+ready\s+local\s+2\s+{second['pid']}\s+1\s+signal 9\s+200\s+0\s+killed$",
                shown,
                re.M,
            ), shown
            answer = await ficc(
                "inference", "chat", "smollm2", "--message", "Say hello.", "--max-tokens", "8"
            )
            assert answer.strip()
    finally:
        serve.proc.terminate()
        serve.kill()
        shutil.rmtree(data, ignore_errors=True)
