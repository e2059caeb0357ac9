"""Acceptance of the project endpoint: a real `ficc serve`, real llama.cpp, the openai client.

As an operator does it: a plain `ficc serve`, `ficc login`, `ficc models add` with
the real SmolLM2 GGUF, two services created from the CLI with the routing options
(one names the other as its fallback). A project invoke credential and ONE base URL
(the server's URL with `/v1`) then reach both services by model name: chat, streamed
chat and text completions (llama.cpp's `/v1/completions`, usage reported when
streamed), `models.list()` shows both with their context length; once the first is
stopped, its fallback answers for it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
import trio
from openai import OpenAI

from ..support.models_support import smollm2_path
from ..support.serve_support import ServeProcess, ficc_command, first_run_secrets

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello."}]


@pytest.mark.deadline(610)
async def test_one_base_url_reaches_two_services_by_name_and_a_fallback_serves_a_stopped_one(
    tmp_path,
):
    env = {key: value for key, value in os.environ.items() if not key.startswith("FICC_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    ficc = ficc_command(env)
    data = Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))  # short: engine socket paths
    serve = ServeProcess(data)
    try:
        with trio.fail_after(600):
            url = await serve.wait_ready()
            secrets = first_run_secrets(Path(await serve.read_until(r"secrets file:\s+(\S+)")))
            await ficc(
                "login", url, "--username", "admin", "--password-stdin",
                stdin=secrets["admin password"],
            )  # fmt: skip
            await ficc("models", "add", str(smollm2_path()))

            async def create(alias: str, *routing: str) -> dict:
                # The CLI's suggestion with the routing options, one CPU each (the
                # suggestion would give the first service every free CPU), submitted.
                preview = await ficc(
                    "inference", "create", "--model", "smollm2", "--engine", "llama_cpp",
                    "--context", "512", "--concurrency", "1", "--alias", alias, *routing,
                    "--json",
                )  # fmt: skip
                spec = json.loads(preview)["preview"]["spec"]
                spec["placements"][0]["limits"]["cpus"] = 1
                (tmp_path / f"{alias}.json").write_text(json.dumps(spec))
                await ficc("inference", "create", str(tmp_path / f"{alias}.json"))
                await ficc("inference", "start", alias, "--wait")
                return spec

            await create("beta", "--description", "the fallback")
            spec = await create(
                "alpha", "--also-as", "chat", "--fallback", "beta",
                "--description", "the first choice", "--max-output", "64",
            )  # fmt: skip
            assert spec["fallbacks"] == ["beta"] and spec["aliases"] == ["chat"]
            assert spec["max_output"] == 64

            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                minted = await http.post(
                    "/api/v1/tokens",
                    json={"name": "app", "scopes": ["inference:invoke"], "lifetime": 3600},
                    headers={"Authorization": f"Bearer {secrets['admin token']}"},
                )
                assert minted.status_code == 201, minted.text
            client = OpenAI(
                base_url=f"{url}/v1", api_key=minted.json()["token"], max_retries=0, timeout=120
            )

            def conversation() -> dict:
                seen: dict = {}
                models = {m.id: m.model_dump() for m in client.models.list().data}
                seen["models"] = models
                for name in ("alpha", "chat", "beta", "smollm2"):
                    raw = client.chat.completions.with_raw_response.create(
                        model=name, messages=HI, max_tokens=8
                    )
                    answer = raw.parse()
                    seen[name] = (raw.headers["x-ficc-service"], answer.model)
                    assert answer.choices[0].message.content
                text = ""
                for chunk in client.chat.completions.create(
                    model="beta", messages=HI, max_tokens=8, stream=True
                ):
                    if chunk.choices:
                        text += chunk.choices[0].delta.content or ""
                seen["streamed"] = text
                completion = client.completions.create(
                    model="alpha", prompt="Once upon a time", max_tokens=8
                )
                seen["completion"] = (completion.choices[0].text, completion.usage)
                chunks = list(
                    client.completions.create(
                        model="chat",
                        prompt="Once upon a time",
                        max_tokens=8,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
                seen["completion_stream"] = chunks
                unasked = client.chat.completions.create(
                    model="beta",
                    messages=[{"role": "user", "content": "Hi"}],
                    max_tokens=4,
                    stream=True,
                )
                seen["unasked"] = [chunk for chunk in unasked if not chunk.choices]
                return seen

            seen = await trio.to_thread.run_sync(conversation)
            models = seen["models"]
            assert set(models) == {"alpha", "beta"}
            assert models["alpha"]["context_length"] == 512  # the context; SmolLM2 knows 8192
            assert models["alpha"]["max_output"] == 64
            assert models["alpha"]["description"] == "the first choice"
            assert models["alpha"]["aliases"] == ["chat", "smollm2"]
            assert models["alpha"]["owned_by"] == "default"
            assert models["beta"]["capabilities"] == {
                "chat": True,
                "embeddings": False,
                "tools": False,
                "vision": False,
                "completions": True,
            }
            # By alias, by another name, the other service, the model's name (both have it:
            # the first by alias, both being ready).
            assert seen["alpha"] == ("alpha", "alpha")
            assert seen["chat"] == ("alpha", "alpha")
            assert seen["beta"] == ("beta", "beta")
            assert seen["smollm2"] == ("alpha", "alpha")
            assert seen["streamed"]
            text, usage = seen["completion"]
            assert text and usage.completion_tokens > 0
            # Usage asked for: the last chunk reports it; not asked: no chunk without
            # choices (the gateway asked the engine for it, and keeps it).
            assert seen["completion_stream"][-1].usage.completion_tokens > 0
            assert seen["unasked"] == []
            assert "".join(c.choices[0].text for c in seen["completion_stream"] if c.choices)

            await ficc("inference", "stop", "alpha", "--wait")

            def after_stop() -> tuple:
                listed = [m.id for m in client.models.list().data]
                raw = client.chat.completions.with_raw_response.create(
                    model="alpha", messages=HI, max_tokens=8
                )
                return listed, raw.headers["x-ficc-service"], raw.parse().model

            listed, served_by, model = await trio.to_thread.run_sync(after_stop)
            assert listed == ["beta"]  # a stopped service is not listed
            assert (served_by, model) == ("beta", "beta")
            # Each request is accounted to the service that served it; the stopped one
            # keeps the record of the refusal the fallback answered.
            requests, refusals = {}, {}
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for alias in ("alpha", "beta"):
                    shown = json.loads(await ficc("inference", "show", alias, "--json"))
                    usage = await http.get(
                        f"/api/v1/inference/{shown['id']}/usage",
                        headers={"Authorization": f"Bearer {secrets['admin token']}"},
                    )
                    totals = usage.json()["totals"]
                    requests[alias] = totals["requests"] - totals["errors"]
                    refusals[alias] = totals["errors"]
            assert requests == {"alpha": 5, "beta": 4}  # beta: one more, the unasked stream
            assert refusals == {"alpha": 1, "beta": 0}
    finally:
        serve.proc.terminate()
        serve.kill()
        shutil.rmtree(data, ignore_errors=True)
