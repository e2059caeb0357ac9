"""Quotas benchmark: the gateway's CPU per request with limits, budgets and accounting on.

Run from the repository root (about 4 minutes on 2 cores; ``--quick`` about 2)::

    .venv/bin/python bench/quotas_bench.py             # 3 rounds, rewrites the doc
    .venv/bin/python bench/quotas_bench.py --no-write  # print only

Two ``ficc serve`` configurations in front of the same stand-in engine
(``bench/standin.py``), set up as ``bench/gateway_bench.py`` does (embedded agent,
process executor, the unchanged ``llama_cpp`` adapter, a service-bound invoke token,
``ficc serve`` pinned to core 1 and the load generator on core 0):

* **off**: ``default_rpm = 0``, ``default_tpm = 0``, no prices and no budgets: the
  quota gate finds nothing to hold a request to;
* **on**: every request held to a rate limit and a token limit (its credential's,
  set through the API as every bench's setup does), priced (``default_price``)
  and checked against a monthly budget of its project, with usage written to the
  store as always (batched off the request path). The limits are far above what the
  bench sends, so every request is admitted and all of them pay for the checks.

Each round starts both (in alternating order, so neither always runs on a warmer
machine), warms each up, then measures a fixed-concurrency load of non-streamed
chat completions. The figure is the target process's CPU time (``utime + stime``
from ``/proc``) per request served; the ratio on/off is taken within a round, and
the median of the rounds is reported. The table is printed and written into
docs/performance.md between the ``quotas`` markers.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import gateway_bench as gb
import httpx
from doc_section import write_section

HUGE_BUDGET = 10**9
CONFIGS: dict[str, dict[str, str]] = {
    "off": {"FICC_DEFAULT_RPM": "0", "FICC_DEFAULT_TPM": "0"},
    "on": {"FICC_DEFAULT_PRICE": "1:2"},
}


def hold_to_budget(ficc: gb.Ficc) -> None:
    """Give the invoke credential's project a monthly budget (the bench's setup already
    gave the credential explicit limits)."""
    http = httpx.Client(
        base_url=f"{ficc.url}/api/v1",
        headers={"Authorization": f"Bearer {ficc.admin_token()}"},
        timeout=30,
    )
    try:
        project = http.get("/whoami").raise_for_status().json()["project"]["id"]
        http.put(
            f"/projects/{project}/limits", json={"budget": HUGE_BUDGET, "period": "month"}
        ).raise_for_status()
    finally:
        http.close()


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start ``ficc serve`` in configuration ``name``; CPU per request under load."""
    work = Path(tempfile.mkdtemp(prefix=f"qb-{name}-"))
    (work / "logs").mkdir()
    procs = gb.Procs(work / "logs")
    ficc = None
    try:
        standin = gb.write_standin_executable(work)
        ficc = gb.Ficc(procs, work, standin, None, env=CONFIGS[name], limits=name == "on")
        target = ficc.setup()["standin"]["target"]
        if name == "on":
            hold_to_budget(ficc)
        job = {"job": "load", "target": target, "concurrency": args.concurrency}
        gb.loadgen({**job, "seconds": 2, "warmup": 0.3, "pids": [ficc.pid]})
        got = gb.loadgen({**job, "seconds": args.seconds, "warmup": 0.5, "pids": [ficc.pid]})
        if got["errors"]:
            raise SystemExit(f"{name}: {got['errors']} requests failed")
        return {"cpu_ms": 1e3 * got["cpu"] / got["ok"], "rps": got["ok"] / got["elapsed"]}
    finally:
        procs.stop_all()
        if ficc is not None:
            ficc.reap_engines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="One round, shorter loads.")
    parser.add_argument("--rounds", type=int, default=None, help="Rounds (default 3).")
    parser.add_argument("--seconds", type=float, default=None, help="Measured seconds.")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-write", action="store_true", help="Print only.")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.seconds = args.seconds or (3.0 if args.quick else 6.0)
    rounds: list[dict[str, dict[str, Any]]] = []
    for index in range(args.rounds):
        order = ("off", "on") if index % 2 == 0 else ("on", "off")
        got = {name: measure(name, args) for name in order}
        rounds.append(got)
        print(
            f"round {index + 1}: "
            + ", ".join(
                f"{n} {got[n]['cpu_ms']:.3f} ms/request {got[n]['rps']:,.0f} rps" for n in order
            )
            + f"; on/off {got['on']['cpu_ms'] / got['off']['cpu_ms']:.3f}",
            flush=True,
        )
    ratio = statistics.median(r["on"]["cpu_ms"] / r["off"]["cpu_ms"] for r in rounds)
    lines = [
        "| Round | CPU per request, off | CPU per request, on | on / off | Requests/s off, on |",
        "|---|---|---|---|---|",
    ]
    for index, r in enumerate(rounds, 1):
        lines.append(
            f"| {index} | {r['off']['cpu_ms']:.3f} ms | {r['on']['cpu_ms']:.3f} ms "
            f"| {r['on']['cpu_ms'] / r['off']['cpu_ms']:.3f} "
            f"| {r['off']['rps']:,.0f}, {r['on']['rps']:,.0f} |"
        )
    verdict = "met" if ratio <= 1.15 else "MISSED"
    lines += [
        "",
        f"Median on/off over {len(rounds)} rounds: **{ratio:.3f}** (goal: at most 1.15, "
        f"{verdict}); {args.concurrency} concurrent non-streamed requests, "
        f"{args.seconds:g} s measured per configuration and round.",
    ]
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        write_section("quotas", "Quotas: limits, budgets and accounting on the request path", table)


if __name__ == "__main__":
    main()
