"""Model registry benchmark: acquisition vs curl, verification vs sha256sum, loop stalls.

Run from the repository root::

    .venv/bin/python bench/models_bench.py            # 1 GiB file, 3 runs, median
    .venv/bin/python bench/models_bench.py --size-mib 256 --runs 1

Every figure is measured against its baseline in the same run, on the same file
and the same local HTTPS server on loopback (trustme certificates), and reported
as a ratio with a verdict against the goals. The server is Debian's nginx when it
is installed (``--server nginx``; ``apt-get install nginx-light``): like a remote
origin, it costs the machine little, so the figures compare the clients. The test
suite's h11-over-TLS server in its own process (``--server python``) spends about
a core of this machine's two encrypting in Python, which the clients then share.
The table is printed and written into docs/performance.md between the ``models``
markers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trustme
from doc_section import write_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ficc_core.api.app import create_app  # noqa: E402
from ficc_core.base.digests import sha256_file  # noqa: E402
from ficc_core.config import load_config  # noqa: E402
from ficc_core.controller.service import open_service  # noqa: E402
from ficc_core.models.blob_records import FileRef  # noqa: E402
from tests.support.httpsd import ServedFile, open_https_server, write_ca_bundle  # noqa: E402

MiB = 1 << 20
#: The paced download's rate (nginx's ``limit_rate``): a fast internet link, which is
#: what bounds most operators' downloads, rather than the two clients' CPU.
PACED_MIB_PER_S = 200
PACED_BYTES_PER_S = PACED_MIB_PER_S * MiB


def make_file(path: Path, size: int) -> str:
    """Write ``size`` pseudo-random bytes (incompressible) and return their sha256."""
    digest = hashlib.sha256()
    block = os.urandom(4 * MiB)
    with path.open("wb") as handle:
        written = 0
        while written < size:
            piece = block[: min(len(block), size - written)]
            handle.write(piece)
            digest.update(piece)
            written += len(piece)
    return digest.hexdigest()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def curl_download(url: str, ca: Path, out: Path) -> tuple[float, float]:
    """Seconds for curl to download ``url`` over HTTPS to ``out``, and the CPU seconds it used."""
    cpu = _children_cpu()
    started = time.perf_counter()
    await trio.run_process(
        ["curl", "--silent", "--show-error", "--fail", "--cacert", str(ca), "-o", str(out), url]
    )
    return time.perf_counter() - started, _children_cpu() - cpu


class StallProbe:
    """The event loop's longest stall while it runs: a task sleeps 1 ms in a loop."""

    def __init__(self) -> None:
        self.worst = 0.0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[StallProbe]:
        async def probe() -> None:
            while True:
                before = time.perf_counter()
                await trio.sleep(0.001)
                self.worst = max(self.worst, time.perf_counter() - before - 0.001)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            yield self
            nursery.cancel_scope.cancel()


async def ficc_acquire(url: str, ca: Path, data_dir: Path, sha: str, size: int) -> dict[str, float]:
    """Acquire through the real service: seconds until every byte is durable, until the
    blob is verified and published, the CPU seconds this process used meanwhile, and the
    event loop's longest stall meanwhile."""
    config = load_config(
        overrides={
            "data_dir": str(data_dir),
            "ca_bundle": str(ca),
            "allow_private_addresses": True,
        },
        environ={},
    )
    async with open_service(config, background=True) as service:
        token = (await service.auth.bootstrap())["token"]
        client = create_app(service).test_client()
        headers = {"Authorization": f"Bearer {token}"}
        body = {
            "name": "bench",
            "format": "gguf",
            "files": [{"path": "bench.gguf", "size": size, "sha256": sha, "url": url}],
        }
        model = await (await client.post("/api/v1/models", headers=headers, json=body)).get_json()
        received_at = None
        async with StallProbe().running() as probe:
            cpu = time.process_time()
            started = time.perf_counter()
            await client.post(f"/api/v1/models/{model['id']}/acquire", headers=headers)
            while True:
                state = await service.blobs.status(FileRef(model["id"], 0, sha, size))
                now = time.perf_counter() - started
                if received_at is None and state.durable_offset == size:
                    received_at = now
                if state.verified:
                    return {
                        "ficc_download_s": received_at or now,
                        "ficc_total_s": now,
                        "ficc_cpu_s": time.process_time() - cpu,
                        "acquire_stall_s": probe.worst,
                    }
                if state.state == "failed":
                    raise RuntimeError(state.reason)
                await trio.sleep(0.01)


def sha256sum(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["sha256sum", str(path)], check=True, capture_output=True)
    return time.perf_counter() - started


async def verify_with_stall_probe(path: Path, size: int) -> tuple[float, float]:
    """Hash ``path`` the way the blob store verifies an upload (worker thread), probing the loop.

    Returns (seconds to hash, longest event-loop stall seen in seconds).
    """
    async with StallProbe().running() as probe:
        started = time.perf_counter()
        await trio.to_thread.run_sync(sha256_file, path, size)
        elapsed = time.perf_counter() - started
    return elapsed, probe.worst


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


_NGINX_CONF = """daemon off; master_process off; worker_processes 1;
pid {work}/nginx.pid; error_log {work}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
  access_log off; sendfile on;
  client_body_temp_path {work}/nginx-tmp; proxy_temp_path {work}/nginx-tmp;
  fastcgi_temp_path {work}/nginx-tmp; uwsgi_temp_path {work}/nginx-tmp;
  scgi_temp_path {work}/nginx-tmp;
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {work}/server.pem; ssl_certificate_key {work}/server.key;
    location = /bench.bin {{ alias {source}; }}
    location = /paced.bin {{ alias {source}; limit_rate {paced}; }}
  }}
}}
"""


def start_nginx(source: Path, work: Path) -> tuple[subprocess.Popen, str, Path]:
    """Serve ``source`` with nginx on a free loopback port; return it, the URL and CA bundle."""
    ca = trustme.CA()
    bundle = write_ca_bundle(work, ca)
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(work / "server.key"))
    with (work / "server.pem").open("wb") as chain:
        for pem in cert.cert_chain_pems:
            chain.write(pem.bytes())
    (work / "nginx-tmp").mkdir()
    port = _free_port()
    conf = work / "nginx.conf"
    conf.write_text(
        _NGINX_CONF.format(work=work, port=port, source=source, paced=PACED_BYTES_PER_S)
    )
    server = subprocess.Popen([shutil.which("nginx") or "nginx", "-c", str(conf)])
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                log = (work / "nginx-error.log").read_text()
                raise RuntimeError(f"nginx did not start: {log}") from None
            time.sleep(0.02)
    return server, f"https://127.0.0.1:{port}/bench.bin", bundle


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve_file(source: Path, work: Path) -> None:
    """``--serve``: serve ``source`` over HTTPS until killed; print the URL and CA bundle."""
    ca = trustme.CA()
    bundle = write_ca_bundle(work, ca)
    async with open_https_server(ca) as server:
        server.add("/bench.bin", ServedFile(source))
        print(server.url("/bench.bin"), bundle, flush=True)
        await trio.sleep_forever()


async def measure(
    work: Path,
    url: str,
    paced_url: str | None,
    bundle: Path,
    sha: str,
    size: int,
    curl_first: bool,
    server: int,
) -> dict[str, float]:
    """Every figure of one run against one served file.

    curl and FICC take turns going first from run to run, so that neither is always
    the one that meets a cold page cache or a busier machine. With ``paced_url`` (nginx
    serving), both also download the file paced at :data:`PACED_BYTES_PER_S`
    (``paced_`` figures).
    """
    source = work / "source.bin"
    figures: dict[str, float] = {}

    async def curl(url: str = url, prefix: str = "") -> None:
        served = process_cpu(server)
        figures[f"{prefix}curl_s"], figures[f"{prefix}curl_cpu_s"] = await curl_download(
            url, bundle, work / "curl.out"
        )
        figures[f"{prefix}server_cpu_curl_s"] = process_cpu(server) - served
        (work / "curl.out").unlink()

    async def ficc(url: str = url, prefix: str = "") -> None:
        served = process_cpu(server)
        got = await ficc_acquire(url, bundle, work / f"{prefix}data", sha, size)
        figures.update({f"{prefix}{key}": value for key, value in got.items()})
        figures[f"{prefix}server_cpu_ficc_s"] = process_cpu(server) - served

    for step in (curl, ficc) if curl_first else (ficc, curl):
        await step()
    if paced_url is not None:
        for step in (curl, ficc) if curl_first else (ficc, curl):
            await step(paced_url, "paced_")
    figures["sha256sum_s"] = await trio.to_thread.run_sync(sha256sum, source)
    figures["curl_plus_sha256sum_s"] = figures["curl_s"] + figures["sha256sum_s"]
    figures["ficc_hash_s"], figures["stall_s"] = await verify_with_stall_probe(source, size)
    return figures


def one_run(size: int, work: Path, curl_first: bool, kind: str) -> dict[str, float]:
    """Make a file, serve it from another process, and measure against it."""
    source = work / "source.bin"
    sha = make_file(source, size)
    if kind == "nginx":
        server, url, bundle = start_nginx(source, work)
    else:
        # The server runs in its own process so neither client shares its event loop.
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(source), str(work)],
            stdout=subprocess.PIPE,
            text=True,
        )
    try:
        if kind != "nginx":
            url, served_bundle = server.stdout.readline().split()
            bundle = Path(served_bundle)
        paced = url.removesuffix("/bench.bin") + "/paced.bin" if kind == "nginx" else None
        return trio.run(measure, work, url, paced, bundle, sha, size, curl_first, server.pid)
    finally:
        server.kill()
        server.wait()


SERVERS = {
    "nginx": "Debian's nginx, one worker",
    "python": "the test suite's h11-over-TLS server, in its own process",
}

#: The goals (issue 13): ratio FICC / baseline at least this, or a stall under it.
DOWNLOAD_GOAL, END_TO_END_GOAL, STALL_GOAL_S = 0.8, 1.0, 0.020


def render(size: int, runs: list[dict[str, float]], kind: str) -> str:
    med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    # Ratios are medians of each run's own ratio: both sides of one met the same machine.
    download = statistics.median(run["curl_s"] / run["ficc_download_s"] for run in runs)
    end_to_end = statistics.median(
        run["curl_plus_sha256sum_s"] / run["ficc_total_s"] for run in runs
    )
    hashing = statistics.median(run["sha256sum_s"] / run["ficc_hash_s"] for run in runs)
    mib = size / MiB
    gib = size / (1 << 30)
    rows = [
        ("Acquisition, download only", med["ficc_download_s"], med["curl_s"], "curl", download),
        (
            "Acquisition, download + verify + publish",
            med["ficc_total_s"],
            med["curl_plus_sha256sum_s"],
            "curl + sha256sum",
            end_to_end,
        ),
        (
            "Verification of an upload (sha256 of the file)",
            med["ficc_hash_s"],
            med["sha256sum_s"],
            "sha256sum",
            hashing,
        ),
    ]
    if "paced_curl_s" in runs[0]:
        paced = statistics.median(
            run["paced_curl_s"] / run["paced_ficc_download_s"] for run in runs
        )
        rows.insert(
            1,
            (
                f"Acquisition, download only, the origin paced at {PACED_MIB_PER_S} MiB/s",
                med["paced_ficc_download_s"],
                med["paced_curl_s"],
                "curl",
                paced,
            ),
        )
    lines = [
        f"File: {mib:.0f} MiB of random bytes; local HTTPS server on loopback "
        f"({SERVERS[kind]}); "
        f"median of {len(runs)} run(s); machine: {os.cpu_count()} cores.",
        "",
        "| Figure | FICC | Baseline | FICC MiB/s | Baseline MiB/s | Ratio (baseline / FICC time) |",
        "|---|---|---|---|---|---|",
    ]
    for name, ours, theirs, baseline, ratio in rows:
        lines.append(
            f"| {name} | {ours:.2f} s | {theirs:.2f} s ({baseline}) | {mib / ours:.0f} | "
            f"{mib / theirs:.0f} | {ratio:.2f} |"
        )
    stall = max(med["acquire_stall_s"], med["stall_s"])
    goals = [
        ("Download only >= 0.8x curl", f"{download:.2f}x", download >= DOWNLOAD_GOAL),
        (
            "End to end >= 1.0x curl + sha256sum",
            f"{end_to_end:.2f}x",
            end_to_end >= END_TO_END_GOAL,
        ),
        (
            "Longest event-loop stall < 20 ms",
            f"{med['acquire_stall_s'] * 1000:.1f} ms acquiring, "
            f"{med['stall_s'] * 1000:.1f} ms verifying",
            stall < STALL_GOAL_S,
        ),
    ]
    lines += [
        "",
        "| Goal | Measured | Verdict |",
        "|---|---|---|",
        *(
            f"| {goal} | {measured} | {'met' if ok else '**missed**'} |"
            for goal, measured, ok in goals
        ),
        "",
        f"CPU per GiB received: FICC {med['ficc_cpu_s'] / gib:.2f} s (the whole controller "
        f"process: receiving, hashing, writing, fsyncing, the API and the stall probe), "
        f"curl {med['curl_cpu_s'] / gib:.2f} s (no hashing, no fsync); the server "
        f"{med['server_cpu_ficc_s'] / gib:.2f} s serving FICC and "
        f"{med['server_cpu_curl_s'] / gib:.2f} s serving curl. "
        f"Per run (curl, FICC download, FICC end to end, in s): "
        + "; ".join(
            f"{run['curl_s']:.2f}, {run['ficc_download_s']:.2f}, {run['ficc_total_s']:.2f}"
            for run in runs
        )
        + ".",
    ]
    if "paced_curl_s" in runs[0]:
        lines[-1] += (
            f" Paced at {PACED_MIB_PER_S} MiB/s, CPU per GiB: FICC "
            f"{med['paced_ficc_cpu_s'] / gib:.2f} s, curl {med['paced_curl_cpu_s'] / gib:.2f} s; "
            f"longest stall {med['paced_acquire_stall_s'] * 1000:.1f} ms."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        trio.run(serve_file, Path(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs alone.")
    parser.add_argument(
        "--server",
        choices=("auto", "nginx", "python"),
        default="auto",
        help="The HTTPS server (auto: nginx when it is installed).",
    )
    args = parser.parse_args()
    kind = args.server
    if kind == "auto":
        kind = "nginx" if shutil.which("nginx") else "python"
    size = args.size_mib * MiB
    runs = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="ficc-bench-") as work:
            figures = one_run(size, Path(work), curl_first=index % 2 == 0, kind=kind)
        print(
            f"run {index + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()),
            file=sys.stderr,
        )
        runs.append(figures)
    table = render(size, runs, kind)
    print(table)
    if not args.no_write:
        write_section("models", "Model registry", table)


if __name__ == "__main__":
    main()
