"""Golden translations: specifications in, ``vllm serve`` command lines out."""

from __future__ import annotations

import pytest
from ficc_adapter_vllm.adapter import VllmAdapter, VllmUnsupported

from ficc_core.schema import unstructure
from ficc_core.testing import AdapterCase, check_adapter

GIB = 1024**3
MODEL_DIR = "/var/lib/ficc/models/smollm2-135m-instruct"


def _job(cases, spec=None, record=None, where=None):
    where = where or cases.placement()
    spec = spec or cases.specification(where=where)
    return VllmAdapter().job(spec, record or cases.model_record(), where, (cases.model_input(),))


def _flag(job, name):
    return job.argv[job.argv.index(name) + 1]


def test_the_default_translation_is_this_exact_job(cases):
    # CPU placement, 16 GiB: 16 GiB - 2 GiB of weights - 1.6 GiB headroom of KV cache.
    assert unstructure(_job(cases)) == {
        "argv": [
            "/opt/vllm/bin/vllm",
            "serve",
            MODEL_DIR,
            "--uds",
            "{endpoint_socket}",
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "4096",
            "--max-num-seqs",
            "8",
            "--tensor-parallel-size",
            "1",
            "--kv-cache-memory-bytes",
            str(16 * GIB - 2 * GIB - (16 * GIB) // 10),
            "--disable-uvicorn-access-log",
            "--runner",
            "generate",
        ],
        "env": {
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "HOME": ".",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
        },
        "inputs": [{"id": "model", "path": MODEL_DIR}],
        "endpoint": {
            "paths": [
                "/health",
                "/metrics",
                "/tokenize",
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/models",
            ],
            "transport": "unix",
            "socket": "engine.sock",
            "version": 1,
        },
        "readiness": {"path": "/health", "timeout": 900.0, "interval": 1.0},
        "capabilities": ["chat", "completions", "streaming", "tokenize.vllm"],
    }


@pytest.mark.parametrize(
    ("context", "concurrency", "gpus", "parallelism", "weights", "tensor_parallel", "kv_cache"),
    [
        # One 24 GiB GPU, 2 GiB of weights: 24 - 2 - 2.4 GiB headroom.
        (8192, 16, (24 * GIB,), None, 2 * GIB, "1", 24 * GIB - 2 * GIB - (24 * GIB) // 10),
        # Two 80 GiB GPUs with parallelism 2: the 140 GiB of weights are split.
        (32768, 64, (80 * GIB, 80 * GIB), 2, 140 * GIB, "2", 80 * GIB - 70 * GIB - 8 * GIB),
        # Uneven reservations: the smallest one bounds every shard.
        (4096, 4, (40 * GIB, 20 * GIB), 2, 10 * GIB, "2", 20 * GIB - 5 * GIB - 2 * GIB),
        # A small GPU reservation gets at least 1 GiB of headroom.
        (2048, 1, (4 * GIB,), 1, GIB, "1", 4 * GIB - GIB - GIB),
    ],
)
def test_context_concurrency_gpus_and_parallelism_translate(
    cases, context, concurrency, gpus, parallelism, weights, tensor_parallel, kv_cache
):
    where = cases.placement(gpus=gpus)
    spec = cases.specification(
        context=context, concurrency=concurrency, where=where, parallelism=parallelism
    )
    job = _job(cases, spec, cases.model_record(weights=weights), where)
    assert _flag(job, "--max-model-len") == str(context)
    assert _flag(job, "--max-num-seqs") == str(concurrency)
    assert _flag(job, "--tensor-parallel-size") == tensor_parallel
    assert _flag(job, "--kv-cache-memory-bytes") == str(kv_cache)


def test_an_embedding_model_runs_the_pooling_runner_and_serves_embeddings(cases):
    job = _job(cases, record=cases.model_record(embedding=True))
    assert job.argv[-4:] == ("--runner", "pooling", "--convert", "embed")
    assert job.capabilities == ("embeddings",)
    assert "/v1/embeddings" in job.endpoint.paths
    assert "/v1/chat/completions" not in job.endpoint.paths


def test_the_engine_listens_on_the_attempts_unix_socket(cases):
    job = _job(cases)
    assert _flag(job, "--uds") == "{endpoint_socket}"
    assert job.endpoint.transport == "unix"
    assert "--host" not in job.argv and "--port" not in job.argv


def test_the_alias_is_the_served_model_name(cases):
    spec = cases.specification(alias="team-model:v2")
    assert _flag(_job(cases, spec), "--served-model-name") == "team-model:v2"


@pytest.mark.parametrize(
    ("options", "gpus", "field"),
    [
        ({"tensor_split": (0.5, 0.5)}, (GIB * 24, GIB * 24), "tensor_split"),
        ({"gpu_layers": 20}, (GIB * 24,), "gpu_layers"),
        ({"parallelism": 2}, (GIB * 24,), "parallelism"),
        ({"parallelism": 2}, (), "parallelism"),
        ({"prompt_cache_bytes": 1 << 30}, (GIB * 24,), "prompt_cache_bytes"),
    ],
)
def test_options_vllm_lacks_are_refused_naming_the_field(cases, options, gpus, field):
    where = cases.placement(gpus=gpus)
    with pytest.raises(VllmUnsupported) as caught:
        _job(cases, cases.specification(where=where, **options), where=where)
    assert caught.value.field == field


def test_a_gguf_model_is_refused(cases):
    with pytest.raises(VllmUnsupported, match="Hugging Face-format directories"):
        _job(cases, record=cases.model_record(gguf=True))


def test_a_reservation_too_small_for_the_weights_is_refused(cases):
    where = cases.placement(gpus=(8 * GIB,))
    spec = cases.specification(where=where)
    with pytest.raises(VllmUnsupported, match="no room for a KV cache") as caught:
        _job(cases, spec, cases.model_record(weights=7 * GIB), where)
    assert caught.value.field == "placements"


def test_the_adapter_passes_the_conformance_kit(cases):
    jobs = []
    for where, record, options in [
        (cases.placement(), cases.model_record(), {}),
        (cases.placement(), cases.model_record(embedding=True), {"context": 512}),
        (cases.placement(gpus=(24 * GIB, 24 * GIB)), cases.model_record(), {"parallelism": 2}),
    ]:
        spec = cases.specification(where=where, **options)
        jobs.append(
            AdapterCase(
                specification=spec,
                model_record=record,
                placement=where,
                inputs=(cases.model_input(),),
            )
        )
    check_adapter(VllmAdapter, cases=jobs)
