"""`ficc executor` with several controllers: the list, and which one leads, in its output."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import trio

from ..support.failover_support import CREDENTIAL, WirePeer
from ..support.serve_support import FICC


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _output_until(process: trio.Process, connected: int) -> str:
    """Read the executor's output until ``connected`` lines say 'connected to' and one
    names the leader."""
    seen: list[str] = []
    buffer = b""
    while sum("connected to" in line for line in seen) < connected or not any(
        "the leader is" in line for line in seen
    ):
        data = await process.stdout.receive_some()
        assert data, "ficc executor exited: " + "\n".join(seen)
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        seen.extend(line.decode() for line in complete)
    return "\n".join(seen)


@pytest.mark.parametrize("form", ["repeated", "environment"])
@pytest.mark.deadline(70)
async def test_the_executor_links_to_every_controller_and_says_which_leads(form, agent_dir):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            standby = await nursery.start(WirePeer(role="standby", term=3).run)
            leader = await nursery.start(WirePeer(role="leader", term=3).run)
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "FICC_NODE_CREDENTIAL": CREDENTIAL}
            env.pop("FICC_CONFIG", None)
            args = [*FICC, "executor", "--agent-dir", str(agent_dir)]
            if form == "repeated":
                args += ["--controller", standby.url, "--controller", leader.url]
            else:
                env["FICC_CONTROLLER"] = f"{standby.url}, {leader.url}"
            process = await trio.lowlevel.open_process(
                args,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                output = await _output_until(process, 2)
                await standby.wait_heartbeats(1)
                await leader.wait_heartbeats(1)
            finally:
                process.send_signal(signal.SIGTERM)
                await process.wait()
            assert f"connected to {standby.url} as node gpu-1 (standby, term 3)" in output
            assert f"connected to {leader.url} as node gpu-1 (leader, term 3)" in output
            assert f"ficc executor: the leader is {leader.url} (term 3)" in output
            nursery.cancel_scope.cancel()
