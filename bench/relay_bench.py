"""Relay benchmark: the endpoint action over a node's connection, beside the local one.

Run from the repository root (about a minute on 2 cores)::

    .venv/bin/python bench/relay_bench.py             # 64 MiB stream, 3 runs, median
    .venv/bin/python bench/relay_bench.py --size-mib 16 --runs 1 --no-write

One controller is served in this process on loopback (the test suite's
``open_controller``) and one remote agent dials it over its WebSocket, with the
process provider running the test suite's stand-in engine. The same engine is
read two ways in the same run: through the agent's own endpoint (the baseline:
no relay) and through the controller's relayed endpoint (frames over the node's
connection, credit-based backpressure). Figures: the throughput of one streamed
body, and the time of a small request from open to end. Ratios are taken within
a run, then their median. The table is printed and written into
docs/performance.md between the ``relay`` markers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from doc_section import write_section  # noqa: E402

from ficc_core.agent.remote import RemoteAgent  # noqa: E402
from ficc_core.executor.types import BodyChunk, EndOfStream  # noqa: E402
from ficc_core.testing.executor_kit import new_fence, standin_job  # noqa: E402
from tests.support.agent_support import open_controller, process_agent_maker, wait_connected  # noqa: E402

MiB = 1 << 20
#: The relayed stream's floor: below it a replica's tokens would queue on the relay.
GOAL_RELAY_MIB_S = 5.0
ROUNDS = 50


async def stream_mib_s(endpoint: Any, fence: Any, stream_id: str, size: int) -> float:
    """Read ``size`` bytes of the stand-in's endless /stream; return MiB/s."""
    await endpoint.open(fence, stream_id, "GET", "/stream", {}, b"")
    await endpoint.read(fence, stream_id)  # the head
    total, begin = 0, time.perf_counter()
    while total < size:
        event = await endpoint.read(fence, stream_id)
        if not isinstance(event, BodyChunk):
            raise RuntimeError(f"the stream ended early: {event!r}")
        total += len(event.data)
    elapsed = time.perf_counter() - begin
    await endpoint.cancel(fence, stream_id)
    return total / elapsed / MiB


async def request_ms(endpoint: Any, fence: Any, name: str) -> float:
    """The mean time of a GET /health, open to end of stream, over ``ROUNDS`` requests."""
    begin = time.perf_counter()
    for index in range(ROUNDS):
        stream_id = f"health-{name}-{index}"
        await endpoint.open(fence, stream_id, "GET", "/health", {}, b"")
        while not isinstance(await endpoint.read(fence, stream_id), EndOfStream):
            pass
    return (time.perf_counter() - begin) / ROUNDS * 1000


async def one_run(work: Path, size: int) -> dict[str, float]:
    agent_dir = Path(tempfile.mkdtemp(prefix="fb-", dir="/tmp"))  # short: socket paths
    try:
        async with open_controller(work) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                fence = new_fence()
                await service.contributors.launch("gpu-1", "process", standin_job(), fence)
                await agent.providers["process"].wait_ready(fence)
                figures = {}
                endpoints = {
                    "local": agent.providers["process"],
                    "relay": service.contributors.endpoint("gpu-1"),
                }
                for name, endpoint in endpoints.items():
                    figures[f"{name}_mib_s"] = await stream_mib_s(
                        endpoint, fence, f"bulk-{name}", size
                    )
                    figures[f"{name}_request_ms"] = await request_ms(endpoint, fence, name)
                nursery.cancel_scope.cancel()
        return figures
    finally:
        shutil.rmtree(agent_dir, ignore_errors=True)


def render(size: int, runs: list[dict[str, float]]) -> tuple[str, bool]:
    med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    throughput = statistics.median(run["relay_mib_s"] / run["local_mib_s"] for run in runs)
    added = statistics.median(run["relay_request_ms"] - run["local_request_ms"] for run in runs)
    met = med["relay_mib_s"] >= GOAL_RELAY_MIB_S
    lines = [
        f"Stream: {size // MiB} MiB of the stand-in's /stream; requests: {ROUNDS} GET /health "
        f"in a row; median of {len(runs)} run(s); machine: {os.cpu_count()} cores.",
        "",
        "| Figure | Relayed | Local endpoint (baseline) | Ratio or difference |",
        "|---|---|---|---|",
        f"| Streamed body | {med['relay_mib_s']:.1f} MiB/s | {med['local_mib_s']:.1f} MiB/s | "
        f"{throughput:.2f} of local |",
        f"| Small request, open to end | {med['relay_request_ms']:.2f} ms | "
        f"{med['local_request_ms']:.2f} ms | +{added:.2f} ms |",
        "",
        f"Goal: a relayed stream of at least {GOAL_RELAY_MIB_S:.0f} MiB/s: "
        + ("**met**." if met else "**not met**."),
        "",
    ]
    return "\n".join(lines), met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs alone.")
    args = parser.parse_args()
    size = args.size_mib * MiB
    runs = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="ficc-bench-") as work:
            figures = trio.run(one_run, Path(work), size)
        print(
            f"run {index + 1}: " + ", ".join(f"{k}={v:.2f}" for k, v in figures.items()),
            file=sys.stderr,
        )
        runs.append(figures)
    table, met = render(size, runs)
    print(table)
    if not args.no_write:
        write_section("relay", "Relayed endpoint", table)
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
