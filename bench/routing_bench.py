"""Routing benchmark: affinity against least-loaded on real llama.cpp, a slow replica, and cost.

Run from the repository root (about 10 minutes on 2 shared cores)::

    .venv/bin/python bench/routing_bench.py             # all three, rewrites the doc section
    .venv/bin/python bench/routing_bench.py --no-write  # print only
    .venv/bin/python bench/routing_bench.py --no-write --only-cache --conversations 8 \
        --slots 4 --pause 5 15 --answer-tokens 128      # another conversation setup

Three measurements, each printed with its comparison and written into
docs/performance.md between the ``routing`` markers:

* **cache** (needs ``ficc-llama-server`` and SmolLM2): ``ficc serve`` runs a service of
  two real llama.cpp replicas of SmolLM2 (``--parallel 2`` each, one thread and one CPU
  each, ``cache_prompt`` on, as llama-server defaults). A few conversations run at
  once; each turn resends the growing history after one system prompt of about 1,000
  tokens that all of them share (``--own-system``: one per conversation). The time to
  first token of every follow-up turn is measured for three arms: *least-loaded*
  (a controller with the prefix index off and no scraping: the gateway's in-flight
  count, ties at random), *session* (a ``x-session-id`` header per conversation) and
  *prefix* (no header: the prefix index alone), the last two on a controller with the
  defaults. Each arm's share of requests per replica comes from the gateway's
  ``ficc_gateway_requests`` counter.
* **slow** : a service of two stand-in engines (``bench/standin.py``); one is steered
  slow (each answer 50 ms late, and its ``/metrics`` says 4 requests wait in it). A
  closed loop of 8 clients runs against the least in-flight router (the baseline
  controller) and the scored router (the defaults); the requests each replica got are
  compared.
* **cost**: the router's pick in process, per request, for 2 replicas with scraped
  load: no prompt, a 4 KiB and a 64 KiB chat prompt, with and without a session.

The two controllers run one after the other (never at once). Each runs the stand-in
service, removes it, then runs the SmolLM2 one: both at once would ask for more CPUs
than the machine has (``--cpus``: each llama.cpp replica's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Any

import gateway_bench as gb
import httpx
from doc_section import write_section

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

#: The baseline controller: no prefix index, and no scrape within the run.
BASELINE = {"FICC_PREFIX_ENABLED": "false", "FICC_SCRAPE_INTERVAL": "1d"}
CONVERSATIONS, TURNS, ANSWER_TOKENS = 4, 6, 16
#: Words of the shared system prompt and of each user turn (about a token each).
SYSTEM_WORDS, TURN_WORDS = 990, 30
#: Seconds a user takes between an answer and the next turn (uniform, seeded).
PAUSE = (0.5, 4.0)
#: One system prompt for every conversation (an application's), not one each.
SHARED_SYSTEM = True
#: llama.cpp slots per replica (``--parallel``: the service's concurrency).
SLOTS = 2
#: CPUs each llama.cpp replica may use (its placement's limit: a cgroup quota here).
CPUS = 1.0
WORDS = (
    "river stone lamp harbour keeper night storm light tower ship rope signal tide wind "
    "rock map glass oil wick bell fog coast gull salt wave beam log watch shift stair door "
    "brass lens clock north south east west island reef chart anchor mast sail deck cabin"
).split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def _metric(url: str, name: str) -> dict[tuple[str, str], float]:
    """The gateway's ``name`` samples by (service, replica)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {}
    pattern = re.compile(rf'^{name}\{{replica="([^"]*)",service="([^"]*)"\}} (\S+)$', re.M)
    for replica, service, value in pattern.findall(text):
        found[(service, replica)] = float(value)
    return found


class Controller:
    """One ``ficc serve``, for a two-replica stand-in service, then a two-replica SmolLM2
    one."""

    def __init__(self, procs: gb.Procs, work: Path, env: dict[str, str], llama) -> None:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.ficc = gb.Ficc(procs, work, gb.write_standin_executable(work), llama)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self.url = self.ficc.url
        self.http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.ficc.admin_token()}"},
            timeout=120,
        )
        self.runtimes: dict[str, Any] = {}
        self.services: dict[str, dict[str, Any]] = {}

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, f"/api/v1{path}", **kwargs)
        if response.status_code >= 400:
            raise SystemExit(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    def register(self, name: str, path: Path) -> str:
        manifest = {
            "name": name,
            "format": "gguf",
            "licence": "apache-2.0",
            "files": [{"path": path.name, "size": path.stat().st_size,
                       "sha256": gb.sha256_file(path)}],
        }  # fmt: skip
        model = self.api("POST", "/models", json=manifest)
        offset = 0
        with path.open("rb") as handle:
            while piece := handle.read(16 << 20):
                self.api("POST", f"/models/{model['id']}/files/0/bytes",
                         params={"offset": offset}, content=piece,
                         headers={"Content-Type": "application/octet-stream"})  # fmt: skip
                offset += len(piece)
        gb.wait_until(
            f"model {name}",
            lambda: self.api("GET", f"/models/{model['id']}")["state"] == "verified",
            120,
        )
        return model["id"]

    def node_ready(self) -> bool:
        node = self.http.get("/api/v1/contributors/local")
        if node.status_code != 200 or node.json()["state"] != "connected":
            return False
        for runtime in (node.json().get("snapshot") or {}).get("runtimes", ()):
            self.runtimes[runtime["name"]] = runtime
        return "standin" in self.runtimes

    def service(
        self, alias: str, runtime: str, exe: Path, model_id: str, cpus: float = 0.5, **extra: Any
    ) -> None:
        found = self.runtimes[runtime]
        placement = {"node_id": "local", "limits": {"cpus": cpus, "memory_bytes": gb.GIB}}
        spec = {
            "alias": alias,
            "model_id": model_id,
            "engine": "llama_cpp",
            "runtime": {key: found[key] for key in
                        ("executor_provider", "package_digest", "image_digest")}
            | {"isolation": "process", "network": "none"},
            "image_executable": str(exe),
            "request_deadline": 300,
            "placements": [placement, placement],
            **extra,
        }  # fmt: skip
        created = self.api("POST", "/inference", json=spec)
        self.api("POST", f"/inference/{created['id']}/control/start",
                 json={"revision": created["revision"]})  # fmt: skip
        gb.wait_until(
            f"service {alias}",
            lambda: self.api("GET", f"/inference/{created['id']}")["state"] == "ready",
            180,
            self.ficc.proc,
        )
        token = self.api("POST", f"/inference/{created['id']}/tokens", json={"lifetime": 86400})
        # Held to limits far above the load, as gateway_bench's tokens are: default_rpm
        # refused nearly every request of the slow-replica loops (429s, counted as errors).
        self.api(
            "PUT",
            f"/tokens/{token['credential']['id']}/limits",
            json={"rpm": 10**9, "tpm": 10**12},
        )
        self.services[alias] = {"id": created["id"], "token": token["token"], "exe": exe}

    def add_standin(self) -> None:
        """The two-replica stand-in service (half a CPU each)."""
        gb.wait_until("the embedded node", self.node_ready, 60, self.ficc.proc)
        fake = self.ficc.agent_dir / "standin.gguf"
        fake.write_bytes(os.urandom(4096))
        self.service("standin", "standin", self.ficc.standin, self.register("standin", fake),
                     context=2048, concurrency=64)  # fmt: skip

    def add_llama(self, llama) -> bool:
        """The two-replica SmolLM2 service (:data:`CPUS` each); False without the runtime."""
        gb.wait_until("the embedded node", self.node_ready, 60, self.ficc.proc)
        if not llama or "llama_server" not in self.runtimes:
            return False
        self.service("smollm2", "llama_server", llama[0], self.register("smollm2", llama[1]),
                     cpus=CPUS, context=4096, concurrency=SLOTS)  # fmt: skip
        return True

    def remove(self, alias: str) -> None:
        """Remove service ``alias`` and wait until it holds nothing (its CPUs are free)."""
        service_id = self.services.pop(alias)["id"]
        revision = self.api("GET", f"/inference/{service_id}")["revision"]
        self.api("POST", f"/inference/{service_id}/control/remove", json={"revision": revision})
        gb.wait_until(
            f"service {alias} removed",
            lambda: self.http.get(f"/api/v1/inference/{service_id}").status_code == 404,
            60,
            self.ficc.proc,
        )

    def requests(self, alias: str) -> dict[str, float]:
        """Requests relayed so far per replica of ``alias`` (its attempt ID)."""
        service_id = self.services[alias]["id"]
        counts = _metric(self.url, "ficc_gateway_requests_total")
        return {replica: n for (service, replica), n in counts.items() if service == service_id}

    def close(self) -> None:
        self.http.close()


def _share(before: dict[str, float], after: dict[str, float]) -> list[float]:
    got = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    total = sum(got.values()) or 1
    return sorted((v / total for v in got.values()), reverse=True)


# -- cache: multi-turn conversations on two real llama.cpp replicas ------------------------------


def _conversation(url: str, service: dict, seed: int, session: bool, out: list) -> None:
    rng, think = random.Random(seed), random.Random(-seed)
    system = "You answer as the keeper of an old lighthouse. House rules: " + _text(
        random.Random(0) if SHARED_SYSTEM else rng, SYSTEM_WORDS
    )
    messages = [{"role": "system", "content": system}]
    headers = {"Authorization": f"Bearer {service['token']}"}
    if session:
        headers["x-session-id"] = f"conversation-{seed}"
    with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
        for turn in range(TURNS):
            messages.append({"role": "user", "content": "Tell me: " + _text(rng, TURN_WORDS)})
            # include_usage: the gateway passes the last chunk (usage, and llama.cpp's
            # timings with it) only to a client that asks for it, as OpenAI does.
            body = {"messages": messages, "stream": True, "max_tokens": ANSWER_TOKENS,
                    "temperature": 0, "stream_options": {"include_usage": True}}  # fmt: skip
            sent = time.perf_counter()
            first, answer, usage, timings = None, [], {}, {}
            path = f"/api/v1/inference/{service['id']}/v1/chat/completions"
            with http.stream("POST", path, json=body) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    usage = event.get("usage") or usage
                    timings = event.get("timings") or timings
                    for choice in event.get("choices", ()):
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            first = first or time.perf_counter()
                            answer.append(piece)
            out.append(
                {"seed": seed, "turn": turn, "ttft": (first or time.perf_counter()) - sent,
                 "prompt_tokens": usage.get("prompt_tokens"),
                 "computed": timings.get("prompt_n"), "cached": timings.get("cache_n")}
            )  # fmt: skip
            messages.append({"role": "assistant", "content": "".join(answer) or "..."})
            # The user reads and types: without it, conversations return in lockstep with
            # their replica's batch, and least-loaded sends each back to the idle replica,
            # which is by chance its own.
            time.sleep(think.uniform(*PAUSE))


def cache_arm(controller: Controller, arm: str, seed: int) -> dict[str, Any]:
    service = controller.services["smollm2"]
    before = controller.requests("smollm2")
    out: list[dict] = []
    threads = [
        threading.Thread(
            target=_conversation,
            args=(controller.url, service, seed + i, arm == "session", out),
            daemon=True,
        )
        for i in range(CONVERSATIONS)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    follow = [r["ttft"] for r in out if r["turn"] > 0]
    computed = [r["computed"] for r in out if r["turn"] > 0 and r["computed"] is not None]
    return {
        "arm": arm,
        "follow_ups": len(follow),
        "median": statistics.median(follow) if follow else float("nan"),
        "p90": sorted(follow)[int(0.9 * len(follow))] if follow else float("nan"),
        "first_turn": statistics.median(r["ttft"] for r in out if r["turn"] == 0),
        "share": _share(before, controller.requests("smollm2")),
        "last_prompt_tokens": max((r["prompt_tokens"] or 0) for r in out),
        # What the engine computed, not read from its cache (llama.cpp's timings.prompt_n).
        "computed": statistics.median(computed) if computed else float("nan"),
        "computed_mean": statistics.mean(computed) if computed else float("nan"),
        "computed_max": max(computed, default=0),
        "hits": _hits(out),
        "seconds": time.monotonic() - started,
        "turns": sorted(out, key=lambda r: (r["seed"], r["turn"])),
    }


def _hits(out: list[dict]) -> float:
    """The share of follow-ups whose engine found the whole previous turn in its cache:
    it computed only what this turn added (the last answer and the new question)."""
    sent = {(r["seed"], r["turn"]): r["prompt_tokens"] for r in out}
    follow = [r for r in out if r["turn"] > 0 and r["cached"] is not None]
    hit = [r for r in follow if r["cached"] >= (sent.get((r["seed"], r["turn"] - 1)) or 1e9)]
    return len(hit) / len(follow) if follow else float("nan")


# -- slow: one stand-in replica made slow ---------------------------------------------------------


def _sockets(controller: Controller) -> dict[str, str]:
    """The stand-in replicas' engine sockets by attempt ID."""
    from ficc_core.executor.attempts import attempt_key

    found: dict[str, str] = {}
    replicas = controller.requests("standin")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(controller.ficc.standin) not in argv or "--host" not in argv:
            continue
        socket = gb.engine_socket(int(entry))
        for replica in replicas:
            if attempt_key(replica) in socket:
                found[replica] = socket
    return found


def slow_arm(controller: Controller, arm: str, scored: bool) -> dict[str, Any]:
    service = controller.services["standin"]
    target = {"address": f"tcp:127.0.0.1:{controller.ficc.port}",
              "prefix": f"/api/v1/inference/{service['id']}", "auth": service["token"],
              "model": "standin"}  # fmt: skip
    gb.loadgen({"job": "load", "target": target, "concurrency": 4, "seconds": 1, "warmup": 0.2})
    sockets = _sockets(controller)
    if len(sockets) != 2:
        raise SystemExit(f"expected two stand-in replicas, found {sockets}")
    slow, fast = sorted(sockets)
    # The same loop with no replica slow: what this controller does on this machine now.
    reference = gb.loadgen({"job": "load", "target": target, "concurrency": 8, "seconds": 6,
                            "warmup": 0.5})  # fmt: skip
    _post_unix(sockets[slow], "/steer", b'{"delay": 0.05, "queued": 4}')
    if scored:  # the scraper has read the steered replica
        waiting = "ficc_gateway_engine_waiting_requests"
        gb.wait_until(
            "the slow replica's scrape",
            lambda: _metric(controller.url, waiting).get((service["id"], slow)) == 4,
            15,
        )
    before = controller.requests("standin")
    got = gb.loadgen({"job": "load", "target": target, "concurrency": 8, "seconds": 6,
                      "warmup": 0.5})  # fmt: skip
    after = controller.requests("standin")
    _post_unix(sockets[slow], "/steer", b'{"delay": 0, "queued": 0}')
    sent = {k: after.get(k, 0) - before.get(k, 0) for k in (slow, fast)}
    return {"arm": arm, "slow": sent[slow], "fast": sent[fast], "ok": got["ok"],
            "errors": got["errors"], "p50": got["latencies"].get("p50"),
            "reference_ok": reference["ok"]}  # fmt: skip


def _post_unix(socket_path: str, path: str, body: bytes) -> None:
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(socket_path)
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        while sock.recv(65536):
            pass


# -- cost: the router in process -------------------------------------------------------------------


def cost() -> list[tuple[str, float]]:
    """Microseconds per pick (best of 5 rounds of 10,000) for 2 replicas with scraped load."""
    import trio

    from ficc_core.config import Config
    from ficc_core.controller.metrics import Metrics
    from ficc_core.gateway.request import Request
    from ficc_core.gateway.scoring import router_from_config
    from ficc_core.gateway.scrape import EngineLoad, ReplicaLoad
    from ficc_core.routing.live import LiveReplica, LiveService, LiveTable
    from ficc_core.testing.executor_kit import new_fence

    view = LiveService(
        id="svc", project_id="p", alias="chat", generation=1, admission="serving",
        concurrency=1 << 30,
        replicas=tuple(LiveReplica(index=i, node_id="n", fence=new_fence(1)) for i in range(2)),
    )  # fmt: skip

    def chat(size: int) -> bytes:
        rng = random.Random(size)
        return json.dumps({"model": "chat", "messages": [
            {"role": "system", "content": _text(rng, size // 6)},
            {"role": "user", "content": "hello"}]}).encode()  # fmt: skip

    cases = [
        ("no prompt", b"{}", {}),
        ("4 KiB chat", chat(4096), {}),
        ("64 KiB chat", chat(65536), {}),
        ("4 KiB chat, session header", chat(4096), {"x-session-id": "conversation-1"}),
        ("64 KiB chat, session header", chat(65536), {"x-session-id": "conversation-1"}),
    ]
    results = []

    def picks(router: Any, payload: bytes, headers: dict[str, str], n: int) -> None:
        for _ in range(n):
            request = Request(
                service_id="svc",
                path="/v1/chat/completions",
                actor=None,  # type: ignore[arg-type]  # routing never reads it
                view=view,
                headers=headers,
                started=0.0,
                deadline=float("inf"),
                payload=payload,
            )
            router.pick(view, set(), request)

    async def measure() -> None:
        for label, payload, headers in cases:
            router = router_from_config(
                Config(),
                live=LiveTable(),
                contributors=None,  # type: ignore[arg-type]  # nothing is scraped here
                local=lambda key: 0,
                metrics=Metrics(),
                rng=random.Random(1),
            )
            assert router.scraper is not None
            now = trio.current_time()
            for replica in view.replicas:
                router.scraper.replicas[replica.key] = ReplicaLoad(
                    "svc", first_seen=now, load=EngineLoad(1, 0, 0.3), at=now
                )
            n = 10_000
            rounds = timeit.repeat(
                lambda r=router, p=payload, h=headers, k=n: picks(r, p, h, k), number=1, repeat=5
            )
            results.append((label, min(rounds) / n * 1e6))

    trio.run(measure)
    return results


# -- main ------------------------------------------------------------------------------------------


def _fmt_share(share: list[float]) -> str:
    return " / ".join(f"{100 * s:.0f}%" for s in share)


def report(cache: list[dict], slow: list[dict], costs: list[tuple[str, float]]) -> str:
    load = os.getloadavg()
    # The bench itself keeps about one core busy; more than that was someone else's.
    busy = "other work was running" if load[2] > 1.5 else "nothing else was running"
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on a {os.cpu_count()}-core machine "
        f"(load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the end of the run: "
        f"{busy}; figures are comparisons within this run).",
        "",
    ]
    if cache:
        by = {r["arm"]: r for r in cache}
        base = by.get("least-loaded")
        lines += [
            f"**Multi-turn conversations, two real llama.cpp replicas** ({CONVERSATIONS} "
            f"conversations at once, {TURNS} turns each, "
            + (
                "one system prompt of about {} words shared by all"
                if SHARED_SYSTEM
                else "a system prompt of about {} words each"
            ).format(SYSTEM_WORDS)
            + f", user turns of {TURN_WORDS} words and {ANSWER_TOKENS}-token answers, a "
            f"user's pause of {PAUSE[0]:g} to {PAUSE[1]:g} s between turns; SmolLM2-135M "
            f"Q4_1, `--parallel {SLOTS}`, one thread and {CPUS:g} CPU per replica).",
            "",
            "| Arm | Follow-up TTFT median | p90 | Least-loaded's median / this | Prompt tokens "
            "computed per follow-up: median / mean / max | Follow-ups that found the last "
            "turn cached | Requests per replica "
            "| First turn median | Longest prompt (tokens) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in cache:
            ratio = base["median"] / r["median"] if base and r["median"] else float("nan")
            lines.append(
                f"| {r['arm']} | {r['median'] * 1e3:.0f} ms | {r['p90'] * 1e3:.0f} ms | "
                f"{ratio:.2f} | {r['computed']:.0f} / {r['computed_mean']:.0f} / "
                f"{r['computed_max']:.0f} | {100 * r['hits']:.0f}% | {_fmt_share(r['share'])} | "
                f"{r['first_turn'] * 1e3:.0f} ms | {r['last_prompt_tokens']} |"
            )
        lines.append("")
    if slow:
        by = {r["arm"]: r for r in slow}
        lines += [
            "**A slow replica** (stand-in engines; one answers 50 ms late and reports 4 "
            "requests waiting in it; 8 clients in a closed loop for 6 s).",
            "",
            "| Router | Requests to the slow replica | To the fast one | Completed | p50 "
            "| Completed with no replica slow (same controller, just before) |",
            "|---|---|---|---|---|---|",
        ]
        for r in slow:
            lines.append(
                f"| {r['arm']} | {r['slow']:.0f} | {r['fast']:.0f} | {r['ok']} | "
                f"{(r['p50'] or 0) * 1e3:.1f} ms | {r['reference_ok']} |"
            )
        if "least in-flight" in by and "scored" in by:
            base, scored = by["least in-flight"]["slow"], by["scored"]["slow"]
            verdict = (
                f"{base / scored:.1f}x fewer requests" if scored else f"no request ({base:.0f})"
            )
            lines += ["", f"The scored router sent the slow replica {verdict}."]
        lines.append("")
    if costs:
        lines += [
            "**The router's cost per request** (in process, best of 5 x 10,000 picks, 2 "
            "replicas with scraped load, defaults):",
            "",
            "| Request | Pick |",
            "|---|---|",
            *(f"| {label} | {us:.1f} µs |" for label, us in costs),
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs alone.")
    parser.add_argument("--no-engine", action="store_true", help="Leave the llama.cpp part out.")
    parser.add_argument("--only-cache", action="store_true", help="Only the llama.cpp part.")
    parser.add_argument("--pause", type=float, nargs=2, default=PAUSE, metavar=("LOW", "HIGH"),
                        help="A user's pause between turns, seconds (uniform).")  # fmt: skip
    parser.add_argument("--conversations", type=int, default=CONVERSATIONS,
                        help="Conversations at once.")  # fmt: skip
    parser.add_argument("--turns", type=int, default=TURNS,
                        help="Turns per conversation (the first is no follow-up).")  # fmt: skip
    parser.add_argument("--own-system", action="store_true",
                        help="A system prompt per conversation, not one for all.")  # fmt: skip
    parser.add_argument("--slots", type=int, default=SLOTS,
                        help="llama.cpp slots per replica (its concurrency).")  # fmt: skip
    parser.add_argument("--cpus", type=float, default=CPUS,
                        help="CPUs per llama.cpp replica (the stand-in service is gone "
                        "by then).")  # fmt: skip
    parser.add_argument("--answer-tokens", type=int, default=ANSWER_TOKENS,
                        help="max_tokens of each answer.")  # fmt: skip
    args = parser.parse_args()
    globals().update(
        PAUSE=tuple(args.pause),
        CONVERSATIONS=args.conversations,
        TURNS=args.turns,
        SLOTS=args.slots,
        CPUS=args.cpus,
        ANSWER_TOKENS=args.answer_tokens,
        SHARED_SYSTEM=not args.own_system,
    )
    gb.PINNED = False  # a shared machine: nothing is pinned
    costs = [] if args.only_cache else cost()
    llama = None if args.no_engine else gb.llama_runtime()
    cache: list[dict] = []
    slow: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="ficc-routing-bench-"))
    for name, env in (("baseline", BASELINE), ("defaults", {})):
        logs = work / name / "logs"
        logs.mkdir(parents=True)
        procs = gb.Procs(logs)
        controller = None
        try:
            print(f"starting the {name} controller ...", flush=True)
            controller = Controller(procs, work / name, env, llama)
            controller.ficc.engine_pids = []
            if not args.only_cache:
                # The stand-ins go before the llama.cpp replicas come: the two services'
                # CPUs together would be more than this machine has.
                controller.add_standin()
                scored = name != "baseline"
                slow.append(slow_arm(controller, "scored" if scored else "least in-flight",
                                     scored=scored))  # fmt: skip
                print(slow[-1], flush=True)
                controller.remove("standin")
            if controller.add_llama(llama):
                arms = ["least-loaded"] if name == "baseline" else ["session", "prefix"]
                for offset, arm in enumerate(arms):
                    cache.append(cache_arm(controller, arm, seed=100 * (len(cache) + offset + 1)))
                    print(cache[-1], flush=True)
        finally:
            if controller is not None:
                controller.close()
            procs.stop_all()
    table = report(cache, slow, costs)
    print(table)
    if not args.no_write:
        write_section("routing", "Routing", table)


if __name__ == "__main__":
    main()
