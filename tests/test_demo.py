"""The README's first command: `ficc serve --demo` from an empty data directory, twice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile

import httpx
import pytest
import trio
from openai import OpenAI

from .serve_support import FICC


def _start(data_dir, agent_dir, log):
    env = {**os.environ, "FICC_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("FICC_CONFIG", None)
    return subprocess.Popen(
        [*FICC, "serve", "--demo", "--port", "0", "--agent-dir", agent_dir],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )


async def _snippets(proc) -> tuple[str, str, str]:
    def read() -> str:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops" in line:
                return "".join(lines)
        raise AssertionError("ficc serve --demo exited:\n" + "".join(lines))

    with trio.fail_after(120):
        text = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
    token = re.search(r"export FICC_TOKEN='(\S+)'", text).group(1)
    base = re.search(r'base_url="(\S+)"', text).group(1)
    curl = re.search(r"curl -N (\S+)", text).group(1)
    assert curl == base + "/chat/completions"
    return text, token, base


@pytest.mark.slow
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

            proc.send_signal(signal.SIGINT)
            assert await trio.to_thread.run_sync(lambda: proc.wait(timeout=60)) == 0
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
            proc.send_signal(signal.SIGINT)
            assert await trio.to_thread.run_sync(lambda: proc.wait(timeout=60)) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()


async def test_the_demo_service_bounds_an_answer_by_a_quarter_of_its_context_length():
    from ficc_core.cli import demo
    from ficc_core.models.gguf import read_gguf_files
    from ficc_core.schema import Specification
    from ficc_core.schema._convert import structure

    from .models_support import smollm2_path

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
