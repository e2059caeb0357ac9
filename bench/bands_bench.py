"""Priority bands benchmark: the interactive band's queue wait under a saturating batch load.

Run from the repository root (about 90 seconds; ``--quick`` about 50)::

    .venv/bin/python bench/bands_bench.py             # rewrites the bands section of the doc
    .venv/bin/python bench/bands_bench.py --no-write  # print only

One ``ficc serve`` (embedded agent, process executor) runs the stand-in engine
(``bench/standin.py``) as a managed service of one replica with ``concurrency`` 8,
under the default bands (interactive 100/1.0, standard 50/1.0, batch 10/0.75, a
minimum share of 0.1). Every request streams 5 deltas 10 ms apart, so it holds its
slot about 50 ms. Two invoke credentials of the service: one in band
``interactive``, one in band ``batch``. Three phases of the same length:

* **alone**: two interactive clients, each sending one request after another;
* **loaded**: the same, beside 24 batch clients doing the same (three times the
  slots: the service is saturated and batch's queue never empties);
* **one band**: as loaded, but the interactive clients send ``x-ficc-band: batch``
  (the header lowers them into batch), which is what every request gets without
  bands: first come, first served behind the batch queue.

The clients are ``bench/loadgen.py``'s lean asyncio HTTP/1.1 client (a few tens of
microseconds of CPU per request), so the load on the shared cores is the
gateway's, not the client's. The queue wait of each request is the gateway's own
(``queue_wait`` of its usage record: from the request's admission to its slot),
read from the usage ledger the controller writes (``inference_usage`` in its
SQLite file, per credential). The client's time to first byte is shown beside it.
Nothing is pinned (the machine is shared); the figures are one run's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import gateway_bench as gb
import httpx
import loadgen
from doc_section import write_section

CONCURRENCY = 8
BATCH_CLIENTS = 24
INTERACTIVE_CLIENTS = 2
STEER = "n=5 gap=0.01"  # about 50 ms per request


def prepare(ficc: gb.Ficc) -> dict[str, Any]:
    """The stand-in service with ``CONCURRENCY`` slots and a credential per band."""
    target = ficc.setup()["standin"]["target"]
    service_id = target["prefix"].rsplit("/", 1)[1]
    http = httpx.Client(
        base_url=f"{ficc.url}/api/v1",
        headers={"Authorization": f"Bearer {ficc.admin_token()}"},
        timeout=120,
    )

    def api(method: str, path: str, **kwargs: Any) -> Any:
        response = http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise SystemExit(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    def state() -> str:
        return api("GET", f"/inference/{service_id}")["state"]

    # The bench's service serves 1024 at once; this one must saturate: replace it.
    found = api("GET", f"/inference/{service_id}")
    stop = {"revision": found["revision"]}
    api("POST", f"/inference/{service_id}/control/stop", json=stop)
    gb.wait_until("service stopped", lambda: state() == "stopped", 60, ficc.proc)
    found = api("GET", f"/inference/{service_id}")
    spec = {**found["spec"], "concurrency": CONCURRENCY}
    replaced = api(
        "PUT", f"/inference/{service_id}", json={"revision": found["revision"], "spec": spec}
    )
    if replaced["state"] == "stopped":
        start = {"revision": replaced["revision"]}
        api("POST", f"/inference/{service_id}/control/start", json=start)
    gb.wait_until("service ready", lambda: state() == "ready", 120, ficc.proc)
    tokens = {
        band: api("POST", f"/inference/{service_id}/tokens", json={"lifetime": 86400, "band": band})
        for band in ("interactive", "batch")
    }
    http.close()
    return {
        "service_id": service_id,
        "target": target,
        "tokens": {band: issued["token"] for band, issued in tokens.items()},
        "credentials": {band: issued["credential"]["id"] for band, issued in tokens.items()},
    }


async def client(
    target: loadgen.Target, request: bytes, until: float, ttfb: list, outcomes: dict
) -> None:
    """Send one streamed request after another until ``until`` (``time.monotonic()``)."""
    pool = loadgen.Pool(target)
    while time.monotonic() < until:
        response = await pool.call(request, timeout=60)
        key = str(response.status or response.error)
        outcomes[key] = outcomes.get(key, 0) + 1
        if response.status == 200 and response.deltas:
            ttfb.append(response.deltas[0] - response.sent)
        elif response.status == 429:
            await asyncio.sleep(0.05)  # Retry-After is 1 s; a bench client comes back sooner
    pool.close()


async def phase(setup: dict[str, Any], seconds: float, *, batch: bool, lowered: bool):
    """One phase; returns its wall-clock window and what the clients saw."""
    seen: dict[str, Any] = {"interactive": ([], {}), "batch": ([], {})}
    began = time.time()
    until = time.monotonic() + seconds
    clients = []
    for band, count in (("interactive", INTERACTIVE_CLIENTS), ("batch", BATCH_CLIENTS)):
        if band == "batch" and not batch:
            continue
        target = loadgen.Target({**setup["target"], "auth": setup["tokens"][band]})
        request = target.chat(STEER, stream=True)
        if band == "interactive" and lowered:
            lower = b"Host: bench\r\nx-ficc-band: batch\r\n"
            request = request.replace(b"Host: bench\r\n", lower)
        clients += [client(target, request, until, *seen[band]) for _ in range(count)]
    await asyncio.gather(*clients)
    return began, time.time(), seen


def ledger(database: Path, credential: str, began: float, ended: float, expected: int) -> list:
    """The queue waits of ``credential``'s requests that finished in the window, once the
    ledger has them all (it is written about every second)."""
    uri = f"file:{database}?mode=ro"
    deadline = time.monotonic() + 15
    while True:
        with sqlite3.connect(uri, uri=True, timeout=10) as db:
            rows = db.execute(
                "SELECT queue_wait FROM inference_usage WHERE credential_id = ?"
                " AND finished_at >= ? AND finished_at <= ? AND outcome = 'ok'",
                (credential, began, ended + 5),
            ).fetchall()
        if len(rows) >= expected or time.monotonic() > deadline:
            return [row[0] for row in rows]
        time.sleep(0.2)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 s phases instead of 20 s.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs alone.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the raw figures.")
    args = parser.parse_args()
    seconds = 8.0 if args.quick else 20.0
    gb.PINNED = False
    work = Path(tempfile.mkdtemp(prefix="ficc-bands-bench-"))
    logs = work / "logs"
    logs.mkdir()
    procs = gb.Procs(logs)
    ficc = None
    results: dict[str, Any] = {}
    try:
        ficc = gb.Ficc(procs, work, gb.write_standin_executable(work), None)
        setup = prepare(ficc)
        database = work / "ficc" / "ficc.sqlite3"
        for name, batch, lowered in (
            ("alone", False, False),
            ("loaded", True, False),
            ("one band", True, True),
        ):
            run = phase(setup, seconds, batch=batch, lowered=lowered)
            began, ended, seen = asyncio.run(run)
            figures: dict[str, Any] = {}
            for band in ("interactive", "batch"):
                ttfb, outcomes = seen[band]
                if not outcomes:
                    continue
                waits = ledger(
                    database, setup["credentials"][band], began, ended, outcomes.get("200", 0)
                )
                figures[band] = {
                    "requests": outcomes.get("200", 0),
                    "refused": sum(n for code, n in outcomes.items() if code != "200"),
                    "per_second": outcomes.get("200", 0) / (ended - began),
                    "wait_p50": quantile(waits, 0.50),
                    "wait_p99": quantile(waits, 0.99),
                    "wait_mean": statistics.fmean(waits) if waits else float("nan"),
                    "ttfb_p50": quantile(ttfb, 0.50),
                    "ttfb_p99": quantile(ttfb, 0.99),
                }
            results[name] = figures
            print(name, json.dumps(figures), flush=True)
    finally:
        procs.stop_all()
        if ficc is not None:
            ficc.reap_engines()
    table = render(results, seconds)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if not args.no_write:
        write_section("bands", "Priority bands", table)


def render(results: dict[str, Any], seconds: float) -> str:
    rows = [
        "| Phase | Band | Requests | Per second | Refused | Queue wait p50 (ms) "
        "| Queue wait p99 (ms) | TTFB p50 (ms) | TTFB p99 (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, figures in results.items():
        for band, f in figures.items():
            rows.append(
                f"| {name} | {band} | {f['requests']} | {f['per_second']:.0f} | {f['refused']} "
                f"| {ms(f['wait_p50'])} | {ms(f['wait_p99'])} | {ms(f['ttfb_p50'])} "
                f"| {ms(f['ttfb_p99'])} |"
            )
    alone = results["alone"]["interactive"]["wait_p99"]
    loaded = results["loaded"]["interactive"]["wait_p99"]
    ratio = loaded / alone if alone else float("inf")
    verdict = "met" if ratio <= 2 and results["loaded"]["batch"]["requests"] > 0 else "missed"
    rows.append("")
    rows.append(
        f"Interactive p99 queue wait loaded / alone: **{ratio:.2f}x** (goal: within 2x, the "
        f"batch band still completing work: {verdict}); {seconds:g} s phases, "
        f"{CONCURRENCY} slots, {INTERACTIVE_CLIENTS} interactive and {BATCH_CLIENTS} batch "
        "clients, each request about 50 ms."
    )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
