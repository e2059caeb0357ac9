"""Several real controllers on one PostgreSQL: processes, a client over HTTP, traffic.

Everything here talks to the controllers the way an operator and a client do: `ficc
serve` and `ficc executor` as subprocesses, the API over loopback HTTP, the CLI for
what only the CLI does (adding a node). Nothing reaches into a controller's memory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from .inference_support import register_gguf, write_agent_settings
from .models_support import smollm2_path
from .serve_support import FICC, first_run_secrets
from .waiting import eventually

GIB = 1024**3


def controller_env(data_dir: Path, database_url: str, name: str, **settings: Any) -> dict:
    """The environment of one controller of the installation: the shared data directory
    (its blobs), the shared database, its own identity and the lease's tempo."""
    env = {
        **os.environ,
        "FICC_DATA_DIR": str(data_dir),
        "FICC_DATABASE_URL": database_url,
        "FICC_CONTROLLER_ID": name,
        "FICC_EMBEDDED_AGENT": "false",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("FICC_CONFIG", None)
    for key, value in settings.items():
        env[f"FICC_{key.upper()}"] = str(value)
    return env


class ControllerProcess:
    """``ficc serve`` as one controller of several (a real process, SIGKILL-able).

    Its output goes to ``log`` (a test that runs for minutes must not fill a pipe).
    """

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self.env = dict(env)
        self.log = log
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def spawn(self) -> int:
        """Start the process; return where its output begins in the log."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [*FICC, "serve", "--port", "0"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        return offset

    async def start(self) -> str:
        """Start it and wait for its listening line; return the API's URL."""
        offset = self.spawn()
        with trio.fail_after(60):
            while True:
                text = self.log.read_text(errors="replace")[offset:]
                found = re.search(r"listening on (http://\S+)", text)
                if found:
                    self.url = found.group(1)
                    return self.url
                assert self.proc.poll() is None, f"ficc serve exited:\n{text}"
                await trio.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def sigkill(self) -> None:
        """What a crash looks like: no clean shutdown, the lease is not released."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen | None, grace: float = 30) -> None:
    """SIGTERM ``proc`` if it still runs and wait for it, SIGKILL it after ``grace`` seconds."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def add_node(env: Mapping[str, str], name: str) -> str:
    """``ficc admin add-node NAME --json``: the node's credential."""
    result = subprocess.run(
        [*FICC, "admin", "add-node", name, "--json"],
        capture_output=True,
        text=True,
        env=dict(env),
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["credential"]


class ExecutorOf:
    """``ficc executor`` linked to every controller in ``urls`` (in that order)."""

    def __init__(
        self, urls: list[str], credential: str, agent_dir: Path, settings: Path, **env: str
    ) -> None:
        environ = {**os.environ, "PYTHONUNBUFFERED": "1", "FICC_NODE_CREDENTIAL": credential}
        environ.pop("FICC_CONFIG", None)
        environ.update(env)
        command = [
            *FICC,
            "executor",
            "--agent-dir",
            str(agent_dir),
            "--agent-config",
            str(settings),
        ]
        for url in urls:
            command += ["--controller", url]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environ
        )

    def kill(self) -> None:
        stop_process(self.proc, grace=15)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@attrs.define
class Api:
    """One controller's management API, as an operator's client sees it."""

    url: str
    token: str
    http: httpx.AsyncClient

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        return await self.http.request(method, self.url + path, headers=headers, **kwargs)

    async def ok(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = await self.call(method, path, **kwargs)
        assert response.status_code == status, (self.url, method, path, response.text)
        return response.json()

    async def until(self, method: str, path: str, predicate, period: float = 0.1) -> Any:
        """Poll ``path`` until ``predicate(json)`` holds (a 200 answer); return it."""

        async def answer() -> Any:
            response = await self.call(method, path)
            return response.json() if response.status_code == 200 else None

        return await eventually(
            answer, None, until=lambda found: found is not None and predicate(found), every=period
        )

    async def leader(self) -> dict:
        return await self.ok("GET", "/api/v1/system/controllers")


async def register_smollm2(api: Api, name: str = "smollm2") -> str:
    """Register the SmolLM2 GGUF and upload it through the byte route; return its id."""
    return await register_gguf(api, smollm2_path(), name)


@attrs.define
class Installation:
    """Two controllers on one store and one blob directory, a node linked to both."""

    a: ControllerProcess
    b: ControllerProcess
    api_a: Api
    api_b: Api
    http: httpx.AsyncClient
    executor: ExecutorOf


@asynccontextmanager
async def two_controllers(
    tmp_path: Path,
    database_url: str,
    agent_dir: Path,
    tempo: Mapping[str, str],
    *,
    executor_env: Mapping[str, str] | None = None,
    database_urls: Mapping[str, str] | None = None,
) -> AsyncIterator[Installation]:
    """``ctl-a`` started first (it leads), then ``ctl-b``, the admin token of the first
    run, and node ``gpu-1`` (a real ``ficc executor``) linked to both; all stopped after.

    ``database_urls`` gives a controller (by name) its own URL of the same database
    (through a proxy, or with its own ``application_name``)."""
    data = tmp_path / "data"
    urls = {"ctl-a": database_url, "ctl-b": database_url, **(database_urls or {})}
    a = ControllerProcess(controller_env(data, urls["ctl-a"], "ctl-a", **tempo), tmp_path / "a.log")
    b = ControllerProcess(controller_env(data, urls["ctl-b"], "ctl-b", **tempo), tmp_path / "b.log")
    executor = None
    try:
        with trio.fail_after(120):
            url_a = await a.start()
            token = first_run_secrets(data / "first-run-secrets")["admin token"]
            url_b = await b.start()
            credential = await trio.to_thread.run_sync(add_node, a.env, "gpu-1")
        settings = write_agent_settings(tmp_path)
        executor = ExecutorOf(
            [url_a, url_b], credential, agent_dir, settings, **(executor_env or {})
        )
        async with httpx.AsyncClient(timeout=60) as http:
            yield Installation(
                a, b, Api(url_a, token, http), Api(url_b, token, http), http, executor
            )
    finally:
        if executor is not None:
            executor.kill()
        for controller in (a, b):
            controller.stop()


async def stream_problem(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str]
) -> str:
    """POST one streaming chat completion and read it whole: "" when it ended with
    ``data: [DONE]``, otherwise what went wrong (status and body, early end, or error)."""
    try:
        async with http.stream("POST", path, json=body, headers=headers) as r:
            if r.status_code != 200:
                return f"{r.status_code} {(await r.aread())[:300]!r}"
            lines = [line async for line in r.aiter_lines()]
            if "data: [DONE]" not in lines:
                return f"stream ended early: {lines[-3:]!r}"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


@attrs.define
class Streams:
    """Streaming chat completions sent one after another by ``clients`` clients through
    one controller, until stopped; every answer that is not a whole stream is a failure."""

    url: str
    service_id: str
    token: str
    sent: int = 0
    completed: int = 0
    failures: list[str] = attrs.Factory(list)
    stop: trio.Event = attrs.Factory(trio.Event)
    #: (monotonic time, ok) of every request's end, for the figures.
    ends: list[tuple[float, bool]] = attrs.Factory(list)

    async def run(self, clients: int = 2) -> None:
        body = {
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 8,
            "stream": True,
        }
        path = f"{self.url}/api/v1/inference/{self.service_id}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {self.token}"}

        async def client() -> None:
            async with httpx.AsyncClient(timeout=60) as http:
                while not self.stop.is_set():
                    self.sent += 1
                    problem = await stream_problem(http, path, body, headers)
                    self.ends.append((time.monotonic(), not problem))
                    if problem:
                        self.failures.append(problem)
                    else:
                        self.completed += 1
                    await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)

    async def wait_completed(self, more: int) -> None:
        """Wait until ``more`` further requests completed."""
        target = self.completed + more
        await eventually(lambda: self.completed >= target, None, every=0.05)
