"""Two builds of the gateway, measured at once on one core: which costs less per request.

On a shared machine the CPU per request of one build moves by 10-40% from one run to
the next (docs/performance.md), far more than most changes to the request path. Run
both builds at the same time instead: each ``ficc serve`` on core 1 (as
``gateway_bench.py`` pins it) under its own closed loop of non-streamed requests
(16 at a time, the load generators on core 0). The two processes share the core, so
whatever slows the machine slows both, and the ratio of the requests each completed
in the same seconds is the inverse ratio of their CPU per request.

    python bench/gateway_pair.py /path/to/checkout-a /path/to/checkout-b

Each checkout's own ``bench/gateway_bench.py --hold`` sets its build up (its stand-in
engine, and ``ficc serve`` importing that checkout through ``PYTHONPATH``). Prints
each round and the median ratio B/A of requests completed (above 1: B is cheaper).
Pass the same checkout twice to see the method's own spread.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LOADGEN = Path(__file__).with_name("loadgen.py")


def _hold(checkout: Path, log: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``checkout``'s bench in --hold mode; its FICC target once ready."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [
        sys.executable,
        str(checkout / "bench" / "gateway_bench.py"),
        "--quick",
        "--no-litellm",
        "--no-engine",
        "--no-write",
        "--hold",
    ]
    out = log.open("wb")
    proc = subprocess.Popen(command, cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{checkout}: the bench ended early; see {log}")
        text = log.read_text(errors="replace")
        start = text.find("{\n")
        if start >= 0:
            try:
                return proc, json.loads(text[start:])["ficc"]
            except json.JSONDecodeError:
                pass  # not all written yet
        time.sleep(1)
    proc.terminate()
    raise SystemExit(f"{checkout}: not ready within 300 s; see {log}")


def _load(target: dict[str, Any], seconds: float) -> subprocess.Popen[str]:
    spec = {
        "job": "load",
        "target": target["target"],
        "pids": target["pids"],
        "concurrency": 16,
        "seconds": seconds,
        "warmup": 1.0,
    }
    return subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, str(LOADGEN), json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="checkout A (the baseline)")
    parser.add_argument("b", type=Path, help="checkout B")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    holds = []
    try:
        targets = []
        for name, checkout in (("a", args.a), ("b", args.b)):
            proc, target = _hold(checkout.resolve(), Path(f"/tmp/gateway_pair_{name}.log"))
            holds.append(proc)
            targets.append(target)
        ratios = []
        for index in range(args.rounds):
            loads = [_load(target, args.seconds) for target in targets]
            a, b = (json.loads(load.communicate()[0]) for load in loads)
            ratio = b["ok"] / max(1, a["ok"])
            ratios.append(ratio)
            print(
                f"round {index + 1}: A {a['ok'] / a['elapsed']:5.0f} requests/s "
                f"({1000 * a['cpu'] / max(1, a['ok']):.3f} ms CPU each), "
                f"B {b['ok'] / b['elapsed']:5.0f} requests/s "
                f"({1000 * b['cpu'] / max(1, b['ok']):.3f} ms CPU each), B/A {ratio:.3f}",
                flush=True,
            )
        print(
            f"median B/A {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}, {args.rounds} rounds)"
        )
    finally:
        for proc in holds:
            proc.send_signal(signal.SIGINT)  # the bench's Ctrl-C: it stops what it started
        for proc in holds:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
