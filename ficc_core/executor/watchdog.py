"""The provider's side of the lease watchdog (see ``watchdog_helper.py``).

An engine runs in a session of its own, so it survives its agent's death; its
lease must not. Each launched attempt gets a watchdog process holding the read end
of a pipe whose write end only this (the agent's) process holds. Every lease grant
and renewal writes the lease's deadline into the pipe (one non-blocking write, no
I/O wait on the renewal path); when the attempt ends the provider writes ``end``.
Should the agent die, the kernel closes the pipe, and the watchdog stops the
engine on the node once the last deadline passes, without the agent.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from .watchdog_helper import process_start_time

__all__ = ["Watchdog", "end_leftover_watchdog"]

HELPER = Path(__file__).with_name("watchdog_helper.py")
log = logging.getLogger("ficc.executor")


class Watchdog:
    """One attempt's watchdog process and the pipe that tells it the lease.

    Start it with :meth:`start`; :meth:`hold` passes each lease deadline on and
    :meth:`end` dismisses it once the provider concluded the attempt itself.
    """

    def __init__(self, process: trio.Process, pipe: int) -> None:
        self.process = process
        self._pipe: int | None = pipe

    @classmethod
    async def start(cls, spec: Mapping[str, Any], until: float | None = None) -> Watchdog:
        """Start a watchdog for ``spec`` (see the helper's module docs).

        :param until: a lease deadline already granted (``time.monotonic()``).
        :raises OSError: when the helper cannot be started.
        """
        read_end, write_end = os.pipe()
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-I", str(HELPER), json.dumps(dict(spec))],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                # What a container command needs (PATH, HOME, XDG_RUNTIME_DIR), not the
                # agent's own settings and credential.
                env={k: v for k, v in os.environ.items() if not k.startswith("FICC_")},
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        watchdog = cls(process, write_end)
        if until is not None:
            watchdog._send(f"until {until:.3f}")
        return watchdog

    @property
    def record(self) -> dict[str, Any]:
        """What the attempt record keeps, so a restarted provider can end a leftover."""
        return {"pid": self.process.pid, "start_time": process_start_time(self.process.pid)}

    def hold(self, until: float) -> None:
        """The lease now runs until ``until`` (``time.monotonic()``); never blocks."""
        self._send(f"until {until:.3f}")

    async def end(self) -> None:
        """Dismiss the watchdog (the attempt ended under the provider) and reap it."""
        self._send("end")
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        with trio.move_on_after(5):
            await self.process.wait()
            return
        self.process.kill()
        await self.process.wait()

    def _send(self, line: str) -> None:
        if self._pipe is None:
            return
        try:
            os.write(self._pipe, line.encode() + b"\n")
        except BlockingIOError:
            # A stalled watchdog misses this deadline; the next renewal sends another.
            log.warning("the lease watchdog (pid %s) is not reading", self.process.pid)
        except OSError:
            pass  # it already exited


def end_leftover_watchdog(record: Mapping[str, Any]) -> None:
    """Kill the watchdog an earlier run left beside an attempt (blocking; use a thread)."""
    watchdog = record.get("watchdog") or {}
    pid, start = watchdog.get("pid"), watchdog.get("start_time")
    if pid and start and process_start_time(pid) == start:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
