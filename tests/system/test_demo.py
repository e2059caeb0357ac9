"""The README's first command: `ficc serve --demo` from an empty data directory, twice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import trio
from openai import OpenAI

from ..support.inference_support import llama_server_executable, write_agent_settings
from ..support.serve_support import FICC


def _start(data_dir, agent_dir, log, extra=()):
    env = {**os.environ, "FICC_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("FICC_CONFIG", None)
    return subprocess.Popen(
        [*FICC, "serve", "--demo", "--port", "0", "--agent-dir", agent_dir, *extra],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )


async def _interrupt(proc) -> None:
    """Ctrl-C: ``ficc serve --demo`` stops, exiting 0."""
    proc.send_signal(signal.SIGINT)
    assert await trio.to_thread.run_sync(lambda: proc.wait(timeout=60)) == 0


def _reap(proc) -> None:
    """Kill the demo if it still runs (a failed test) and close its output."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stdout.close()


async def _snippets(proc, seconds: float = 120) -> tuple[str, str, str]:
    def read() -> str:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops" in line:
                return "".join(lines)
        raise AssertionError("ficc serve --demo exited:\n" + "".join(lines))

    with trio.fail_after(seconds):
        text = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
    token = re.search(r"export FICC_TOKEN='(\S+)'", text).group(1)
    base = re.search(r'base_url="(\S+)"', text).group(1)
    curl = re.search(r"curl -N (\S+)", text).group(1)
    assert curl == base + "/chat/completions"
    return text, token, base


@pytest.mark.slow
@pytest.mark.deadline(600)
async def test_serve_demo_gives_a_working_chat_service_and_reuses_it_on_the_next_run(tmp_path):
    agent_dir = tempfile.mkdtemp(prefix="fd-", dir="/tmp")
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        proc = _start(tmp_path / "data", agent_dir, log)
        try:
            text, token, base = await _snippets(proc)
            assert "Your chat service is running" in text
            # The pasted curl: a streamed chat completion with the service's alias.
            async with httpx.AsyncClient(timeout=60) as http:
                async with http.stream(
                    "POST",
                    base + "/chat/completions",
                    headers={"Authorization": f"Bearer {token}"},
                    json={
                        "model": "smollm2",
                        "stream": True,
                        "max_tokens": 8,
                        "messages": [{"role": "user", "content": "Hi"}],
                    },
                ) as response:
                    assert response.status_code == 200
                    body = b"".join([chunk async for chunk in response.aiter_bytes()])
            assert body.rstrip().endswith(b"data: [DONE]")

            # The pasted openai snippet.
            def chat() -> str:
                client = OpenAI(base_url=base, api_key=token, max_retries=0)
                answer = client.chat.completions.create(
                    model="smollm2", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
                )
                return answer.choices[0].message.content

            assert await trio.to_thread.run_sync(chat)
            # /v1/models shows what an answer may take: a quarter of the context length.
            entry = await trio.to_thread.run_sync(
                lambda: (
                    OpenAI(base_url=base, api_key=token, max_retries=0)
                    .models.retrieve("smollm2")
                    .model_dump()
                )
            )
            assert (entry["context_length"], entry["max_output"]) == (2048, 512)

            await _interrupt(proc)
            first_log = log_path.read_text()
            assert "uploading SmolLM2-135M-Instruct.Q4_1.gguf" in first_log
            # The runtime came from the installed ficc-llama-server plugin: no agent TOML.
            assert not list((tmp_path / "data").glob("*.toml"))
            assert "ficc: stopped" in first_log

            # Again: the model and the service are reused, a new token works.
            proc = _start(tmp_path / "data", agent_dir, log)
            text, second_token, second_base = await _snippets(proc)
            # The same service (the port is the OS's choice each time).
            assert second_base.split("/api/")[1] == base.split("/api/")[1]
            assert second_token != token
            log.flush()
            second_log = log_path.read_text()[len(first_log) :]
            assert "is registered and verified; reusing it" in second_log
            assert "exists; reusing it" in second_log
            assert "uploading" not in second_log
            assert (
                await trio.to_thread.run_sync(
                    lambda: (
                        OpenAI(base_url=second_base, api_key=second_token).models.list().data[0].id
                    )
                )
                == "smollm2"
            )
            await _interrupt(proc)
        finally:
            _reap(proc)


async def test_the_demo_service_bounds_an_answer_by_a_quarter_of_its_context_length():
    from ficc_core.cli import demo
    from ficc_core.models.gguf import read_gguf_files
    from ficc_core.schema import Specification
    from ficc_core.schema._convert import structure

    from ..support.models_support import smollm2_path

    node_id, digest = "local", "sha256:" + "0" * 64
    runtime = {
        "name": demo.RUNTIME,
        "executor_provider": "process",
        "package_digest": digest,
        "image_digest": digest,
        "executable": "/usr/bin/ficc-llama-server",
    }
    submitted: list[dict] = []

    async def api(method: str, path: str, **kwargs):
        # The controller's answers the demo reads, for a first run.
        if (method, path) == ("GET", "/inference"):
            return {"services": []}
        if (method, path) == ("GET", f"/contributors/{node_id}"):
            return {"state": "connected", "snapshot": {"resources": {"cpus": 4},
                                                       "runtimes": [runtime]}}  # fmt: skip
        if (method, path) == ("GET", "/models/m1"):
            return model
        assert (method, path) == ("POST", "/inference"), (method, path)
        submitted.append(kwargs["json"])
        return {"id": "svc", "desired": "running", "state": "ready"}

    # The real SmolLM2's GGUF metadata: trained on 8,192 tokens, so the demo's context
    # (2,048) is its context length, and an answer may take a quarter of it.
    model = {"id": "m1", "metadata": read_gguf_files([smollm2_path()]).to_json()}
    assert model["metadata"]["context_length"] == 8192
    with trio.fail_after(10):
        await demo._service(api, "m1", node_id)  # type: ignore[arg-type]
    spec = submitted[-1]
    assert (spec["context"], spec["max_output"]) == (2048, 512)
    structure(spec, Specification)  # the controller accepts it as it is
    # A model trained on less bounds it; one whose metadata says nothing leaves the context.
    assert demo.max_output({"metadata": {"context_length": 1024}}) == 256
    assert demo.max_output({"metadata": None}) == 512


def _flaky_runtime(folder: Path, flag: Path) -> Path:
    """Agent settings declaring, as the llama_server runtime, the real llama-server behind a
    wrapper that prints an error and exits 3 while ``flag`` exists (the same file, so the
    same digest, either way)."""
    engine = folder / "flaky-llama-server"
    engine.write_text(
        "#!/bin/sh\n"
        f"if [ -e {flag} ]; then echo 'error: cannot load the model (flag set)' >&2; exit 3; fi\n"
        f'exec {llama_server_executable()} "$@"\n'
    )
    engine.chmod(0o755)
    return write_agent_settings(folder, engine)


def _wait_for(path: Path, text: str, proc, seconds: float) -> str:
    """The log at ``path`` once it holds ``text`` (bounded; the process must live)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        log = path.read_text()
        if text in log:
            return log
        assert proc.poll() is None, f"ficc serve --demo exited:\n{log}"
        time.sleep(0.1)  # polling a file another process writes
    raise AssertionError(f"no {text!r} within {seconds} s:\n{path.read_text()}")


@pytest.mark.slow
@pytest.mark.deadline(600)
async def test_a_failing_demo_ends_at_once_with_why_the_controller_serves_on_and_a_rerun_restarts(
    tmp_path,
):
    agent_dir = tempfile.mkdtemp(prefix="fd-", dir="/tmp")
    flag = tmp_path / "fail"
    flag.touch()
    settings = _flaky_runtime(tmp_path, flag)
    log_path = tmp_path / "serve.log"
    extra = ["--agent-config", str(settings), "--replica-retry-max", "1s"]
    extra += ["--first-run-secrets", "stdout"]
    with log_path.open("w") as log:
        proc = _start(tmp_path / "data", agent_dir, log, extra)
        try:
            await trio.to_thread.run_sync(
                _wait_for, log_path, "demo: starting generation 1", proc, 240
            )
            began = time.monotonic()
            said = await trio.to_thread.run_sync(
                _wait_for, log_path, "the controller keeps serving", proc, 120
            )
            # It ended once the replica stopped retrying (3 quick attempts), not after 180 s.
            assert time.monotonic() - began < 60
            failure = said[said.index("demo: the demo service smollm2") :]
            assert "stopped retrying" in failure
            assert "the engine exited with status 3" in failure
            assert "its log ends: error: cannot load the model (flag set)" in failure
            assert "ficc inference logs smollm2" in failure
            assert "run 'ficc serve --demo' again: it restarts the service" in failure
            assert "[demo_service_failed]" in failure
            assert "estimate" not in failure  # no memory hint for an engine that exits
            assert "Traceback" not in said and "TooSlowError" not in said
            # Quiet: none of the demo's own requests is in the access log, none of its
            # service's events in the events log while it waits (it says what matters).
            assert "demo-operator" not in said
            assert "ficc.access" not in said and "ficc.events: attempt" not in said
            assert "ficc.events: service" not in said
            # The controller serves on: the first run's admin token works.
            banner = await trio.to_thread.run_sync(lambda: _banner(proc))
            url = re.search(r"listening on (\S+)", banner).group(1)
            admin = re.search(r"admin token:\s+(\S+)", banner).group(1)
            async with httpx.AsyncClient(timeout=30) as http:
                whoami = await http.get(
                    url + "/api/v1/whoami", headers={"Authorization": f"Bearer {admin}"}
                )
            assert whoami.status_code == 200, whoami.text
            assert proc.poll() is None
            await _interrupt(proc)
            proc.stdout.close()
            first_log = log_path.read_text()

            # The cause is gone: the rerun restarts the failed service, which serves.
            flag.unlink()
            proc = _start(tmp_path / "data", agent_dir, log, extra)
            _, token, base = await _snippets(proc, 240)
            log.flush()
            second_log = log_path.read_text()[len(first_log) :]
            assert "failed (replica 0 stopped retrying" in second_log
            assert "restarting it" in second_log and "starting generation 2" in second_log
            async with httpx.AsyncClient(timeout=60) as http:
                answer = await http.post(
                    base + "/chat/completions",
                    headers={"Authorization": f"Bearer {token}"},
                    json={"model": "smollm2", "max_tokens": 4,
                          "messages": [{"role": "user", "content": "Hi"}]},
                )  # fmt: skip
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"]
            await _interrupt(proc)
        finally:
            _reap(proc)


def _banner(proc) -> str:
    """The controller's start banner on standard output, through its last line."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "ficc admin create-token" in line:
            return "".join(lines)
    raise AssertionError("no banner:\n" + "".join(lines))


async def test_a_demo_that_cannot_go_on_says_why_in_one_error_and_never_raises_anything_else(
    monkeypatch,
):
    from ficc_core.base.errors import FiccError
    from ficc_core.cli import demo

    # The node never offers the runtime: a bounded wait, then a refusal naming what to run.
    async def api(method: str, path: str, **kwargs):
        return {"state": "connected", "snapshot": {"runtimes": []}}

    monkeypatch.setattr(demo, "NODE_TIMEOUT", 0.3)
    with trio.fail_after(10), pytest.raises(FiccError) as refused:
        await demo._runtime(api, "local")  # type: ignore[arg-type]
    assert refused.value.code == "demo_runtime_missing"
    assert "ficc doctor" in refused.value.message

    # Anything unexpected (the controller's connection refused, a timeout, a bug) ends the
    # demo as a FiccError, which ficc serve prints in one line and serves on.
    async def broken(service, base_url):
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(demo, "_run_demo", broken)
    with pytest.raises(FiccError) as failed:
        await demo.run_demo(None, "http://127.0.0.1:1")  # type: ignore[arg-type]
    assert failed.value.code == "demo_failed"
    assert "ConnectError: connection refused" in failed.value.message
    assert "run 'ficc serve --demo' again" in failed.value.message
