"""End to end with real processes: the adapter's job, run by the process executor.

The process provider launches the job the llama_cpp adapter makes for the real
SmolLM2 GGUF, with ``ficc-llama-server`` (llama.cpp's C++ server from xllamacpp)
as the engine, in its own network and mount namespaces; every request goes
through the executor's fenced endpoint action (open/read), as the gateway's do.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import trio
from ficc_adapter_llama_cpp.adapter import LlamaCppAdapter

from ficc_core import (
    JobInput,
    ModelFile,
    ModelManifest,
    ModelMetadata,
    ModelRecord,
    PathNotAdmitted,
    Placement,
    ResourceLimits,
    Runtime,
    Specification,
)
from ficc_core.testing import executor_kit as kit
from ficc_core.testing.executor_kit import exchange

GIB = 1024**3
MAX_TOKENS = 16
DIGEST = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def runtime_executable() -> str:
    """The console script of the ficc-llama-server distribution, beside this Python."""
    found = shutil.which("ficc-llama-server", path=str(Path(sys.executable).parent))
    assert found, "install runtimes/llama_server (make install)"
    return str(Path(found).absolute())


def _model(path: Path, *, embedding: bool) -> tuple[ModelRecord, JobInput]:
    with path.open("rb") as file:
        sha = hashlib.file_digest(file, "sha256").hexdigest()
    manifest = ModelManifest.gguf(
        "SmolLM2 135M Instruct", ModelFile(path=path.name, size=path.stat().st_size, sha256=sha)
    )
    record = ModelRecord(
        id="smollm2",
        revision=manifest.digest(),
        manifest=manifest,
        metadata=ModelMetadata(architecture="llama", context_length=8192, embedding=embedding),
    )
    return record, JobInput(id="model", path=str(path), digest=f"sha256:{sha}")


@pytest.fixture(scope="module")
def chat_model(smollm2_gguf, runtime_executable):
    return _model(smollm2_gguf, embedding=False), runtime_executable


@pytest.fixture(scope="module")
def embedding_model(smollm2_embedding_gguf, runtime_executable):
    return _model(smollm2_embedding_gguf, embedding=True), runtime_executable


def _job(model_and_runtime):
    (record, model_input), executable = model_and_runtime
    placement = Placement(node_id="node-1", limits=ResourceLimits(cpus=1, memory_bytes=2 * GIB))
    specification = Specification(
        alias="smol",
        model_id=record.id,
        engine="llama_cpp",
        runtime=Runtime(
            executor_provider="process",
            package_digest=DIGEST,
            image_digest=DIGEST,
            isolation="process",
        ),
        image_executable=executable,
        context=512,
        concurrency=2,
        placements=[placement],
    )
    job = LlamaCppAdapter().job(specification, record, placement, (model_input,))
    return job, placement.limits


def _chat(stream: bool) -> dict:
    return {
        "model": "smol",
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
    }


async def test_a_chat_completion_streams_through_the_endpoint_action(provider, chat_model):
    job, limits = _job(chat_model)
    with trio.fail_after(60):
        async with kit.launched(provider, job, limits=limits) as fence:
            status, headers, chunks = await exchange(
                provider, fence, "POST", "/v1/chat/completions", _chat(stream=True)
            )
        ended = await provider.status(fence)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert len(chunks) > 1, "the answer arrives in pieces, not as one body"
    events = [
        line.removeprefix("data: ")
        for line in b"".join(chunks).decode().splitlines()
        if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(event) for event in events[:-1]]
    text = "".join(d["choices"][0]["delta"].get("content") or "" for d in deltas if d["choices"])
    assert text.strip()
    assert all(d["model"] == "smol" for d in deltas)
    # The executor's SIGTERM stopped the engine cleanly, not by SIGKILL after the grace.
    assert (ended.state, ended.exit_code, ended.signal) == ("stopped", 0, None)
    assert any("ficc-llama-server: stopped" in line for line in ended.log_tail)


async def test_a_plain_chat_completion_and_the_other_routes_answer(provider, chat_model):
    job, limits = _job(chat_model)
    with trio.fail_after(60):
        async with kit.launched(provider, job, limits=limits) as fence:
            status, answer = await kit.request_json(
                provider, fence, "POST", "/v1/chat/completions", _chat(stream=False)
            )
            models_status, models = await kit.request_json(provider, fence, "GET", "/v1/models")
            metrics_status, _, metrics = await exchange(provider, fence, "GET", "/metrics")
            with pytest.raises(PathNotAdmitted):
                await provider.open(fence, "embed", "POST", "/v1/embeddings", {}, b"{}")
            with pytest.raises(PathNotAdmitted):
                await provider.open(fence, "props", "GET", "/props", {}, b"")
    assert status == 200, answer
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["choices"][0]["message"]["content"]
    assert 0 < answer["usage"]["completion_tokens"] <= MAX_TOKENS
    assert models_status == 200
    assert [model["id"] for model in models["data"]] == ["smol"]
    # Each of the two slots gets the specification's context: 1024 / 2.
    assert models["data"][0]["meta"]["n_ctx"] == 512
    assert metrics_status == 200
    assert b"llamacpp:prompt_tokens_total" in b"".join(metrics)


async def test_an_embedding_model_serves_embeddings(provider, embedding_model):
    job, limits = _job(embedding_model)
    assert job.capabilities == ("embeddings",)
    with trio.fail_after(60):
        async with kit.launched(provider, job, limits=limits) as fence:
            status, answer = await kit.request_json(
                provider,
                fence,
                "POST",
                "/v1/embeddings",
                {"model": "smol", "input": ["a red apple", "a green pear"]},
            )
            with pytest.raises(PathNotAdmitted):
                await provider.open(fence, "chat", "POST", "/v1/chat/completions", {}, b"{}")
    assert status == 200, answer
    vectors = [item["embedding"] for item in answer["data"]]
    assert len(vectors) == 2
    assert all(len(vector) == 576 for vector in vectors)  # SmolLM2 135M's embedding width
    assert vectors[0] != vectors[1]


@pytest.mark.slow
async def test_a_split_gguf_loads_from_its_first_part_and_answers(
    provider, smollm2_gguf, runtime_executable, tmp_path
):
    from ficc_core.testing.models import split_gguf

    folder = tmp_path / "model"
    parts = split_gguf(smollm2_gguf, folder, parts=3, stem="smol")
    files = []
    for part in parts:
        with part.open("rb") as file:
            sha = hashlib.file_digest(file, "sha256").hexdigest()
        files.append(ModelFile(path=part.name, size=part.stat().st_size, sha256=sha))
    manifest = ModelManifest(name="smol", format="gguf", files=files)
    record = ModelRecord(id="smol", revision=manifest.digest(), manifest=manifest)
    directory = JobInput(id="model", path=str(folder))  # every part under its own name
    job, limits = _job(((record, directory), runtime_executable))
    assert job.argv[job.argv.index("--model") + 1] == str(parts[0])
    with trio.fail_after(60):
        async with kit.launched(provider, job, limits=limits) as fence:
            status, answer = await kit.request_json(
                provider, fence, "POST", "/v1/chat/completions", _chat(stream=False)
            )
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"].strip()
