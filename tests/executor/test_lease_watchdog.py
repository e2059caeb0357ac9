"""The lease watchdog helper on its own: what it does when its pipe says end, or closes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import trio

from ficc_core.executor import process_start_time
from ficc_core.executor.watchdog import HELPER

from ..support.waiting import eventually


def _engine(script: str = "exec sleep 60") -> subprocess.Popen:
    """A stand-in for an engine: a shell leading a session of its own."""
    return subprocess.Popen(["sh", "-c", script], start_new_session=True)


def _watchdog(engine: subprocess.Popen, **spec) -> tuple[subprocess.Popen, int]:
    spec = {
        "pid": engine.pid,
        "start_time": process_start_time(engine.pid),
        "group": engine.pid,
        "grace": 1.0,
        **spec,
    }
    read_end, write_end = os.pipe()
    watchdog = subprocess.Popen(
        [sys.executable, "-I", str(HELPER), json.dumps(spec)], stdin=read_end
    )
    os.close(read_end)
    return watchdog, write_end


async def _exited(process: subprocess.Popen, seconds: float) -> int | None:
    with trio.move_on_after(seconds):
        await eventually(lambda: process.poll() is not None, None, every=0.02)
    return process.poll()


@pytest.mark.deadline(60)
async def test_end_dismisses_the_watchdog_and_leaves_the_engine_running():
    engine = _engine()
    try:
        watchdog, pipe = _watchdog(engine)
        os.write(pipe, f"until {time.monotonic() + 0.2:.3f}\nend\n".encode())
        os.close(pipe)
        assert await _exited(watchdog, 10) == 0
        assert engine.poll() is None
    finally:
        engine.kill()
        engine.wait()


@pytest.mark.deadline(60)
async def test_a_closed_pipe_stops_the_engine_once_the_last_deadline_passes():
    engine = _engine()
    try:
        watchdog, pipe = _watchdog(engine)
        os.write(pipe, f"until {time.monotonic() + 0.3:.3f}\n".encode())
        os.write(pipe, f"until {time.monotonic() + 1.5:.3f}\n".encode())  # a renewal
        os.close(pipe)  # what the kernel does when the agent's process dies
        closed = trio.current_time()
        assert await _exited(engine, 1.0) is None, "stopped before its lease passed"
        assert await _exited(engine, 10) == -signal.SIGTERM
        assert trio.current_time() - closed >= 1.4
        assert await _exited(watchdog, 10) == 0
    finally:
        engine.kill()
        engine.wait()


@pytest.mark.deadline(60)
async def test_an_engine_never_told_a_lease_is_stopped_at_once_and_sigkill_follows_the_grace():
    engine = _engine("trap '' TERM; while :; do sleep 0.1; done")
    try:
        watchdog, pipe = _watchdog(engine)
        os.close(pipe)
        assert await _exited(engine, 10) == -signal.SIGKILL
        assert await _exited(watchdog, 10) == 0
    finally:
        engine.kill()
        engine.wait()
