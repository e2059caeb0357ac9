"""The lease watchdog: stops an engine on its node once its agent is gone and its lease ran out.

A provider runs ``python -I watchdog_helper.py SPEC_JSON`` beside each engine, in a
session of its own, with the read end of a pipe as standard input; only the
agent's process holds the write end. Using only the standard library (it never
imports ficc_core, so it starts in milliseconds), the helper:

1. reads lines from the pipe while the agent lives: ``until T`` (``T`` on
   ``CLOCK_MONOTONIC``, the lease's current deadline) and ``end`` (the provider
   concluded the attempt itself: exit at once);
2. at end-of-file — the agent's process died, so the kernel closed its end — waits
   until the last deadline it was told (none told: it acts at once), polling
   whether the engine already ended;
3. then stops the engine without the agent: runs the spec's ``commands`` (the
   container provider's ``rm -f``), SIGTERMs the process ``group``, waits up to
   ``grace`` seconds, SIGKILLs the group and every process left in the ``procs``
   files (cgroup membership lists), and exits.

The spec is a JSON object: ``pid`` and ``start_time`` (the engine process to watch,
guarded against PID reuse), ``group``, ``procs``, ``commands``, ``grace``; every
key is optional. What the engine left on disk stays for the next agent to remove.
"""

import json
import os
import signal
import subprocess
import sys
import time

#: Seconds between checks whether the engine ended, once the agent is gone.
POLL = 0.2


def process_start_time(pid):
    """The process's start time in clock ticks since boot, or None if gone (or a zombie).

    Comparing it with the one recorded at launch guards against PID reuse.
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _engine_gone(spec):
    pid = spec.get("pid")
    return pid is not None and process_start_time(pid) != spec.get("start_time")


def _read_until_orphaned(stream):
    """Follow the agent's lease lines; return the last deadline, or None after ``end``."""
    deadline = 0.0
    pending = b""
    while True:
        data = os.read(stream, 4096)
        if not data:
            return deadline
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            word, _, value = line.decode("ascii", "replace").partition(" ")
            if word == "end":
                return None
            if word == "until":
                try:
                    deadline = float(value)
                except ValueError:
                    pass


def _signal_group(group, signum):
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_listed(procs):
    for path in procs:
        try:
            with open(path) as handle:
                pids = [int(line) for line in handle.read().split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def stop_engine(spec):
    """Stop what the spec names: commands, then SIGTERM, grace, SIGKILL of the group."""
    grace = float(spec.get("grace", 5.0))
    for command in spec.get("commands", ()):
        try:
            subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=grace + 30,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            pass
    group = spec.get("group")
    if group is not None and not _engine_gone(spec):
        _signal_group(group, signal.SIGTERM)
        ends = time.monotonic() + grace
        while not _engine_gone(spec) and time.monotonic() < ends:
            time.sleep(POLL)
        _signal_group(group, signal.SIGKILL)
    _kill_listed(spec.get("procs", ()))


def main(argv):
    spec = json.loads(argv[1])
    deadline = _read_until_orphaned(sys.stdin.fileno())
    if deadline is None:
        return 0
    # The agent is gone: the engine may run out its lease, no longer.
    while not _engine_gone(spec):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(left, POLL))
    stop_engine(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
