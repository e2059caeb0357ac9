"""Soak bench: mixed traffic through a real installation while a seeded schedule breaks it.

Run from the repository root::

    .venv/bin/python bench/chaos_bench.py --minutes 3 [--seed N]

It starts, on loopback in a temporary directory: PostgreSQL (Debian's binaries, as
tests/support/pg_support.py does) with two ``ficc serve`` on it, or -- without PostgreSQL --
one ``ficc serve`` on SQLite; a remote ``ficc executor`` linked to every controller;
SmolLM2 uploaded through the byte route and served by two llama.cpp replicas. Then,
for ``--minutes``: chat requests and streams with a project key (service-bound) and a
personal key (a person the service is shared with), small models uploaded, and replica
and service restarts; meanwhile the schedule (seeded, printed first) kills and pauses
engines (SIGKILL, SIGSTOP then SIGCONT), the agent, a controller and the database,
one fault at a time, each undone before the next. Every loop is bounded in time and
count, and the bench stops by itself. At the end the six invariants are checked and
printed (:mod:`chaos_checks`); the exit status is 1 when one failed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import chaos_checks as cc  # noqa: E402

from tests.support import pg_support  # noqa: E402
from tests.support.ha_support import (  # noqa: E402
    add_node,
    controller_env,
    register_smollm2,
    stop_process,
)
from tests.support.inference_support import (  # noqa: E402
    node_llama_spec,
    write_agent_settings,
)
from tests.support.serve_support import FICC, first_run_secrets  # noqa: E402

GIB = 1 << 30
#: The installation's tempo: a lost leader is replaced in seconds, a hung engine is
#: noticed in about 6 s, a request's own bound is 30 s (the client waits 45 s).
TEMPO = {
    "leader_lease": "5s",
    "leader_renew_interval": "1s",
    "follow_interval": "0.5s",
    "lease_duration": "12s",
    "store_pool_timeout": "2s",
    "store_read_timeout": "3s",
    "store_write_timeout": "5s",
    "store_lock_timeout": "2s",
    "liveness_interval": "2s",
    "liveness_timeout": "2s",
    "timeout_generation": "30s",
    "timeout_first_token": "30s",
    "timeout_response_header": "30s",
}
DEADLINE = 45.0
PASSWORD = "chaos-bench-password-1"
FAULTS = ("engine_kill", "engine_pause", "agent_kill", "controller_kill", "controller_pause")
DB_FAULTS = ("db_stop", "db_pause")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Controller:
    """``ficc serve`` on a fixed port (so the executor finds it again after a restart)."""

    def __init__(self, name: str, env: dict, log: Path) -> None:
        self.name, self.env, self.log = name, env, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.up = False

    def spawn(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [*FICC, "serve", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    async def wait_listening(self, http: httpx.AsyncClient, limit: float = 90) -> None:
        with trio.fail_after(limit):
            while True:
                assert self.proc.poll() is None, f"{self.name} exited, see {self.log}"
                try:
                    if (await http.get(self.url + "/api/v1/health", timeout=2)).status_code < 500:
                        self.up = True
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.2)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        stop_process(self.proc)


class Executor:
    """``ficc executor`` linked to every controller, its output in a log file."""

    def __init__(self, urls, credential, agent_dir, settings, runtime_dir, log) -> None:
        self.command = [*FICC, "executor", "--agent-dir", str(agent_dir)]
        self.command += ["--agent-config", str(settings)]
        for url in urls:
            self.command += ["--controller", url]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "FICC_NODE_CREDENTIAL": credential}
        self.env["FICC_RUNTIME_DIR"] = str(runtime_dir)
        self.env.pop("FICC_CONFIG", None)
        self.log = log
        self.proc: subprocess.Popen | None = None

    def spawn(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def stop(self) -> None:
        stop_process(self.proc)


def schedule(rng: random.Random, seconds: float, with_db: bool) -> list[tuple[float, str, float]]:
    """(start offset, fault, how long it lasts): one at a time, from 15 s in to 20 s before
    the end, a gap of 6-14 s after each is undone."""
    kinds = FAULTS + (DB_FAULTS if with_db else ())
    plan, at = [], 15.0
    while True:
        kind = rng.choice(kinds)
        lasting = round(rng.uniform(2, 10), 1) if kind != "engine_kill" else 0.0
        if at + lasting > seconds - 20:
            return plan
        plan.append((round(at, 1), kind, lasting))
        at += lasting + rng.uniform(6, 14)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.root = Path(tempfile.mkdtemp(prefix="ficc-chaos-", dir="/tmp"))
        self.data = self.root / "data"
        self.agent_dir = self.root / "agent"
        self.runtime_dir = self.root / "run"
        self.postgres: pg_support.PostgresServer | None = None
        self.controllers: list[Controller] = []
        self.executor: Executor | None = None
        self.outcomes: list[cc.Outcome] = []
        self.samples: list[tuple[float, int]] = []
        self.down: dict[str, list[tuple[float, float]]] = {}
        self.start = 0.0
        self.restarts_asked = 0
        self.warmup = 0
        self.faults_done: list[str] = []
        self.kills: list[tuple[str, float]] = []

    def now(self) -> float:
        return time.monotonic() - self.start

    # -- the installation ---------------------------------------------------------------

    async def install(self, http: httpx.AsyncClient) -> None:
        url = ""
        if pg_support.missing() is None and not self.args.sqlite:
            pg_support.reap_stale()
            self.postgres = pg_support.PostgresServer()
            await trio.to_thread.run_sync(self.postgres.start)
            url = self.postgres.url(await trio.to_thread.run_sync(self.postgres.create_database))
        names = ["ctl-a", "ctl-b"] if url else ["ctl-a"]
        for name in names:
            env = controller_env(self.data, url, name, **TEMPO)
            if not url:
                env.pop("FICC_DATABASE_URL")
            self.controllers.append(Controller(name, env, self.root / f"{name}.log"))
        for controller in self.controllers:
            controller.spawn()
            await controller.wait_listening(http)
        self.token = first_run_secrets(self.data / "first-run-secrets")["admin token"]
        env = self.controllers[0].env
        credential = await trio.to_thread.run_sync(add_node, env, "gpu-1")
        settings = write_agent_settings(self.root)
        self.runtime_dir.mkdir(mode=0o700)
        self.executor = Executor(
            [c.url for c in self.controllers],
            credential,
            self.agent_dir,
            settings,
            self.runtime_dir,
            self.root / "executor.log",
        )
        self.executor.spawn()

    async def api(self, http, method, path, *, status=None, via=None, token=None, **kw):
        controller = via or self.live()[0]
        headers = {"Authorization": f"Bearer {token or self.token}", **kw.pop("headers", {})}
        answer = await http.request(method, controller.url + path, headers=headers, **kw)
        if status is not None:
            assert answer.status_code == status, (method, path, answer.text)
        return answer

    def live(self) -> list[Controller]:
        return [c for c in self.controllers if c.up] or self.controllers

    async def until(self, http, path, predicate, limit=120):
        with trio.fail_after(limit):
            while True:
                try:
                    answer = await self.api(http, "GET", path)
                    if answer.status_code == 200 and predicate(answer.json()):
                        return answer.json()
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.25)

    async def service(self, http: httpx.AsyncClient) -> None:
        node = await self.until(
            http,
            "/api/v1/contributors/gpu-1",
            lambda n: n["state"] == "connected" and (n["snapshot"] or {}).get("runtimes"),
        )
        self.node = node
        ctl = _Ctl(self, http)
        model_id = await register_smollm2(ctl)
        limits = {"cpus": 1, "memory_bytes": GIB}
        spec = node_llama_spec(node, model_id, [{"node_id": node["id"], "limits": limits}] * 2)
        created = (await self.api(http, "POST", "/api/v1/inference", status=201, json=spec)).json()
        self.service_id = sid = created["id"]
        body = {"revision": created["revision"]}
        await self.api(
            http, "POST", f"/api/v1/inference/{sid}/control/start", json=body, status=200
        )
        await self.until(http, f"/api/v1/inference/{sid}", lambda v: v["state"] == "ready", 180)
        issued = await self.api(
            http, "POST", f"/api/v1/inference/{sid}/tokens", status=201, json={"lifetime": 3600}
        )
        self.project_key = issued.json()["token"]
        # A person the service is shared with, and their personal key.
        user = {"username": "pat", "password": PASSWORD}
        await self.api(http, "POST", "/api/v1/users", status=201, json=user)
        await self.api(
            http, "PUT", f"/api/v1/inference/{sid}/shares", status=200, json={"users": ["pat"]}
        )
        via = self.live()[0]
        login = await http.post(via.url + "/api/v1/session", json=user)
        assert login.status_code == 201, login.text
        minted = await http.post(
            via.url + "/api/v1/me/tokens",
            json={"name": "laptop"},
            headers={"X-CSRF-Token": login.json()["csrf_token"]},
        )
        assert minted.status_code == 201, minted.text
        http.cookies.clear()
        self.personal_key = minted.json()["token"]
        for controller in self.controllers:  # every controller routes it
            for key in (self.project_key, self.personal_key):
                await self.routed(http, controller, key)

    async def routed(self, http, controller, key) -> None:
        path = f"/api/v1/inference/{self.service_id}/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        with trio.fail_after(60):
            while True:
                answer = await self.api(http, "POST", path, via=controller, token=key, json=body)
                if answer.status_code == 200:
                    self.warmup += 1
                    return
                await trio.sleep(0.2)

    # -- traffic ----------------------------------------------------------------------

    def pick(self) -> Controller:
        return self.rng.choice(self.live())

    def _lost_or_broken(self, controller: Controller, began: float) -> str:
        for start, end in self.down.get(controller.name, []):
            if start <= self.now() and end >= began:
                return cc.LOST
        return cc.LOST if not controller.up else cc.BROKEN

    async def invoke(self, http, stream: bool, key_name: str, key: str) -> None:
        controller = self.pick()
        path = f"{controller.url}/api/v1/inference/{self.service_id}/v1/chat/completions"
        body = {
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 12,
            "stream": stream,
        }
        began, result, code, detail = self.now(), cc.ANSWERED, "", ""
        try:
            with trio.fail_after(DEADLINE):
                async with http.stream(
                    "POST", path, json=body, headers={"Authorization": f"Bearer {key}"}
                ) as answer:
                    raw = await answer.aread()
            if answer.status_code != 200:
                code = cc.envelope_code(raw) or ""
                result = cc.REFUSED if code else cc.BROKEN
                detail = "" if code else f"{answer.status_code} {raw[:200]!r}"
            elif stream:
                result, code = cc.stream_result(raw.decode(errors="replace").splitlines())
                detail = code if result == cc.BROKEN else ""
        except trio.TooSlowError:
            result, detail = cc.HUNG, f"no answer in {DEADLINE:g} s"
        except httpx.HTTPError as exc:
            result, detail = self._lost_or_broken(controller, began), f"{type(exc).__name__}: {exc}"
        kind = "stream" if stream else "chat"
        self.outcomes.append(
            cc.Outcome(kind, key_name, controller.name, began, self.now(), result, code, detail)
        )

    async def client(self, http, end: float, stream: bool, key_name: str, key: str) -> None:
        for _ in range(100_000):
            if self.now() >= end:
                return
            await self.invoke(http, stream, key_name, key)
            await trio.sleep(self.rng.uniform(0.05, 0.4))

    async def admin_call(
        self, http, kind: str, method: str, path: str, **kw
    ) -> httpx.Response | None:
        controller = self.pick()
        began = self.now()
        try:
            with trio.fail_after(DEADLINE):
                answer = await self.api(http, method, path, via=controller, **kw)
        except trio.TooSlowError:
            self.outcomes.append(
                cc.Outcome(kind, "admin", controller.name, began, self.now(), cc.HUNG)
            )
            return None
        except httpx.HTTPError as exc:
            result = self._lost_or_broken(controller, began)
            self.outcomes.append(
                cc.Outcome(kind, "admin", controller.name, began, self.now(), result, "", str(exc))
            )
            return None
        if answer.is_success:
            result, code = cc.ANSWERED, ""
        else:
            code = cc.envelope_code(answer.content) or ""
            result = cc.REFUSED if code else cc.BROKEN
        detail = "" if result != cc.BROKEN else f"{answer.status_code} {answer.text[:200]}"
        self.outcomes.append(
            cc.Outcome(kind, "admin", controller.name, began, self.now(), result, code, detail)
        )
        return answer

    async def uploads(self, http, end: float) -> None:
        """Small hf-directory models, registered and uploaded through the byte route."""
        for number in range(1000):
            if self.now() >= end:
                return
            files = {"config.json": b'{"n": %d}' % number, "weights.bin": os.urandom(2 << 20)}
            manifest = {
                "name": f"upload-{number}",
                "format": "hf-directory",
                "files": [
                    {"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                    for p, b in files.items()
                ],
            }
            model = await self.admin_call(http, "upload", "POST", "/api/v1/models", json=manifest)
            if model is not None and model.status_code in (200, 201):
                model_id = model.json()["id"]
                for index, content in enumerate(files.values()):
                    for _ in range(5):  # a refused write is tried again, a few times
                        answer = await self.admin_call(
                            http,
                            "upload",
                            "POST",
                            f"/api/v1/models/{model_id}/files/{index}/bytes",
                            params={"offset": 0},
                            content=content,
                            headers={"Content-Type": "application/octet-stream"},
                        )
                        if answer is not None and answer.is_success:
                            break
                        await trio.sleep(1)
            await trio.sleep(self.rng.uniform(2, 5))

    async def controls(self, http, end: float) -> None:
        """Replica restarts and service restarts, on a fresh revision each time."""
        sid = self.service_id
        for _ in range(1000):
            await trio.sleep(self.rng.uniform(12, 25))
            if self.now() >= end:
                return
            view = await self.admin_call(http, "control", "GET", f"/api/v1/inference/{sid}")
            if view is None or view.status_code != 200:
                continue
            body = {"revision": view.json()["revision"]}
            if self.rng.random() < 0.7:
                path = f"/api/v1/inference/{sid}/replicas/{self.rng.randrange(2)}/restart"
            else:
                path = f"/api/v1/inference/{sid}/restart"
            answer = await self.admin_call(http, "control", "POST", path, json=body)
            if answer is not None and answer.is_success:
                self.restarts_asked += 1

    async def sampler(self, end: float) -> None:
        for _ in range(100_000):
            if self.now() >= end:
                return
            pids = await trio.to_thread.run_sync(cc.engine_pids, str(self.agent_dir))
            self.samples.append((self.now(), len(pids)))
            await trio.sleep(1)

    # -- faults -------------------------------------------------------------------------

    async def chaos(self, http, plan) -> None:
        for at, kind, lasting in plan:
            await trio.sleep(max(0.0, at - self.now()))
            note = await self.fault(http, kind, lasting)
            line = f"+{self.now():6.1f}s {kind} {lasting:g}s: {note}"
            self.faults_done.append(line)
            print(line, flush=True)

    async def fault(self, http, kind: str, lasting: float) -> str:
        if kind in ("engine_kill", "engine_pause"):
            pids = sorted(await trio.to_thread.run_sync(cc.engine_pids, str(self.agent_dir)))
            if not pids:
                return "no engine running (skipped)"
            pid = self.rng.choice(pids)
            if kind == "engine_kill":
                os.kill(pid, signal.SIGKILL)
                return f"SIGKILL engine {pid}"
            os.kill(pid, signal.SIGSTOP)
            await trio.sleep(lasting)
            if pg_support.pid_alive(pid):
                os.kill(pid, signal.SIGCONT)
            return f"SIGSTOP then SIGCONT engine {pid}"
        if kind == "agent_kill":
            self.executor.proc.send_signal(signal.SIGKILL)
            self.executor.proc.wait()
            await trio.sleep(lasting)
            self.executor.spawn()
            return "SIGKILL the executor, started again"
        if kind in ("controller_kill", "controller_pause"):
            controller = self.rng.choice(self.controllers)
            controller.up = False
            began = self.now()
            if kind == "controller_kill":
                controller.signal(signal.SIGKILL)
                self.kills.append((controller.name, self.now()))
                controller.proc.wait()
                await trio.sleep(lasting)
                controller.spawn()
                try:
                    await controller.wait_listening(http)
                except (trio.TooSlowError, AssertionError) as exc:
                    return f"SIGKILL {controller.name}; it did not come back: {exc}"
            else:
                controller.signal(signal.SIGSTOP)
                await trio.sleep(lasting)
                controller.signal(signal.SIGCONT)
            controller.up = True
            self.down.setdefault(controller.name, []).append((began, self.now()))
            verb = "SIGKILL, started again" if kind == "controller_kill" else "SIGSTOP, SIGCONT"
            return f"{controller.name}: {verb}"
        if kind == "db_stop":
            await trio.to_thread.run_sync(self.postgres.stop)
            await trio.sleep(lasting)
            await trio.to_thread.run_sync(self.postgres.start)
            return "PostgreSQL stopped (fast shutdown), started again"
        if kind == "db_pause":
            group = self.postgres.proc.pid
            os.killpg(group, signal.SIGSTOP)
            await trio.sleep(lasting)
            os.killpg(group, signal.SIGCONT)
            return "PostgreSQL's processes SIGSTOP, SIGCONT"
        raise ValueError(kind)

    # -- the run --------------------------------------------------------------------------

    async def run(self) -> int:
        seconds = self.args.minutes * 60
        async with httpx.AsyncClient(timeout=httpx.Timeout(DEADLINE + 5)) as http:
            try:
                with trio.fail_after(400):
                    await self.install(http)
                    await self.service(http)
                mode = "PostgreSQL, 2 controllers" if self.postgres else "SQLite, 1 controller"
                plan = schedule(self.rng, seconds, self.postgres is not None)
                print(f"chaos bench: seed {self.args.seed}, {self.args.minutes:g} min, {mode}")
                print("schedule (offset, fault, lasting):")
                for at, kind, lasting in plan:
                    print(f"  +{at:6.1f}s {kind} {lasting:g}s")
                self.start = time.monotonic()
                with trio.fail_after(seconds + DEADLINE + 120):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.chaos, http, plan)
                        nursery.start_soon(self.uploads, http, seconds)
                        nursery.start_soon(self.controls, http, seconds)
                        nursery.start_soon(self.sampler, seconds)
                        for stream in (False, True):
                            for name, key in (
                                ("project", self.project_key),
                                ("personal", self.personal_key),
                            ):
                                nursery.start_soon(self.client, http, seconds, stream, name, key)
                verdicts = await self.verify(http)
            finally:
                await trio.to_thread.run_sync(self.teardown)
        after = cc.engine_pids(str(self.agent_dir))
        for pid in after:
            os.kill(pid, signal.SIGKILL)
        verdicts[2] = cc.check_orphans(self.end_pids, self.known_pids, after)
        print("\ninvariants:")
        for verdict in verdicts:
            print("\n".join(verdict.lines()))
        print(f"faults: {len(self.faults_done)}; logs and data in {self.root}")
        failed = [v.name for v in verdicts if not v.held]
        if not failed and not self.args.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        print("RESULT:", "all invariants held" if not failed else "FAILED: " + "; ".join(failed))
        return 1 if failed else 0

    async def verify(self, http) -> list[cc.Verdict]:
        sid = self.service_id
        # Settle: the service ready again and its status naming every engine.
        status = None
        with trio.move_on_after(90):
            await self.until(http, f"/api/v1/inference/{sid}", lambda v: v["state"] == "ready")
            while True:
                await trio.sleep(2)  # the usage recorder and the status catch up
                answer = await self.api(http, "GET", f"/api/v1/inference/{sid}/status")
                if answer.status_code == 200:
                    status = answer.json()
                    pids = {r.get("pid") for r in status.get("replicas", [])}
                    live = cc.engine_pids(str(self.agent_dir))
                    if set(live) <= pids:
                        break

        async def read(path: str, **params):
            try:
                answer = await self.api(http, "GET", path, params=params)
            except httpx.HTTPError:
                return None
            return answer.json() if answer.status_code == 200 else None

        usage = await read("/api/v1/usage", service=sid)
        models = await read("/api/v1/models")
        events, after = [], None
        for _ in range(50):
            page = await read(
                f"/api/v1/inference/{sid}/events",
                limit=500,
                **({"after": after} if after is not None else {"after": 0}),
            )
            if page is None:
                events = None
                break
            events += page["events"]
            if not page["events"]:
                break
            after = page["next_after"]
        node = await read("/api/v1/contributors/gpu-1")
        self.end_pids = cc.engine_pids(str(self.agent_dir))
        self.known_pids = {r.get("pid") for r in (status or {}).get("replicas", [])}
        return [
            cc.check_requests(self.outcomes),
            cc.check_usage(self.outcomes, usage, self.warmup, self.kills),
            None,  # orphans: once the installation stopped
            cc.check_commitment(self.samples, 2, node),
            cc.check_blobs(self.data, (models or {}).get("models")),
            cc.check_restarts(events, status, self.restarts_asked),
        ]

    def teardown(self) -> None:
        if self.postgres is not None and self.postgres.proc is not None:
            os.killpg(self.postgres.proc.pid, signal.SIGCONT)
        if self.executor is not None:
            self.executor.stop()
        for controller in self.controllers:
            controller.stop()
        if self.postgres is not None:
            self.postgres.close()


class _Ctl:
    """What tests/inference_support.register_gguf calls: ``ok`` and ``call``."""

    def __init__(self, bench: Bench, http: httpx.AsyncClient) -> None:
        self.bench, self.http = bench, http

    async def call(self, method, path, **kw):
        return await self.bench.api(self.http, method, path, **kw)

    async def ok(self, method, path, status=200, **kw):
        return (await self.bench.api(self.http, method, path, status=status, **kw)).json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sqlite", action="store_true", help="SQLite even with PostgreSQL")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    return trio.run(Bench(args).run)


if __name__ == "__main__":
    sys.exit(main())
