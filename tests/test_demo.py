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
