"""Golden translation tests: a table of specifications and the exact SGLang command each gives."""

from __future__ import annotations

import pytest
from ficc_example_sglang import SGLangAdapter, TranslationError
from ficc_example_sglang.adapter import ENGINE_PORT

from ficc_core import EndpointContract, Job
from ficc_core.testing import make_case

GIB = 1024**3
MODEL_DIR = "/var/lib/ficc/models/small-model"
PREFIX = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL_DIR]
ENDPOINT = ["--host", "127.0.0.1", "--port", "30000", "--enable-metrics"]


def case(**options):
    return make_case("sglang", model_format="hf-directory", image_executable="python3", **options)


def flags(job: Job) -> list[str]:
    """The argv after the model path."""
    assert job.argv[: len(PREFIX)] == tuple(PREFIX)
    return list(job.argv[len(PREFIX) :])


def common(context: int = 4096, requests: int = 2) -> list[str]:
    """The flags every job has: alias, context, concurrency, the endpoint and metrics."""
    return [
        "--served-model-name",
        "small-model",
        "--context-length",
        str(context),
        "--max-running-requests",
        str(requests),
        *ENDPOINT,
    ]


GOLDEN = [
    pytest.param({}, None, common(), id="cpu-only defaults"),
    pytest.param(
        {"context": 32768, "concurrency": 64},
        None,
        common(context=32768, requests=64),
        id="long context, many requests",
    ),
    pytest.param(
        {"gpu_memory_bytes": [60 * GIB]},
        80 * GIB,
        [*common(), "--mem-fraction-static", "0.75"],
        id="one GPU, three quarters reserved",
    ),
    pytest.param(
        {"gpu_memory_bytes": [70 * GIB, 40 * GIB], "parallelism": 2, "concurrency": 16},
        80 * GIB,
        [*common(requests=16), "--tp-size", "2", "--mem-fraction-static", "0.50"],
        id="tensor parallel over two GPUs, the smaller reservation rules",
    ),
    pytest.param(
        {"gpu_memory_bytes": [10 * GIB, 10 * GIB], "parallelism": 2},
        None,
        [*common(), "--tp-size", "2"],
        id="device memory unknown: SGLang picks the fraction",
    ),
    pytest.param(
        {"embedding": True, "gpu_memory_bytes": [GIB]},
        3 * GIB,
        [*common(), "--mem-fraction-static", "0.33", "--is-embedding"],
        id="embedding model",
    ),
]


@pytest.mark.parametrize(("options", "device_memory", "expected"), GOLDEN)
def test_specification_translates_to_the_exact_sglang_flags(options, device_memory, expected):
    c = case(**options)
    job = SGLangAdapter(device_memory_bytes=device_memory).job(
        c.specification, c.model_record, c.placement, c.inputs
    )
    assert flags(job) == expected


def test_the_model_directory_is_the_one_declared_input():
    c = case()
    job = SGLangAdapter().job(c.specification, c.model_record, c.placement, c.inputs)
    assert job.inputs == c.inputs
    assert job.argv[job.argv.index("--model-path") + 1] == c.inputs[0].path == MODEL_DIR


def test_a_chat_model_gets_chat_and_streaming_over_tcp_on_the_attempt_loopback():
    c = case()
    job = SGLangAdapter().job(c.specification, c.model_record, c.placement, c.inputs)
    assert job.endpoint == EndpointContract.tcp(
        ENGINE_PORT, ["/health", "/metrics", "/v1/chat/completions", "/v1/models"]
    )
    assert job.capabilities == ("chat", "streaming")
    assert job.readiness.path == "/health"
    assert job.env == {"HF_HUB_OFFLINE": "1"}


def test_an_embedding_model_gets_only_embeddings():
    c = case(embedding=True)
    job = SGLangAdapter().job(c.specification, c.model_record, c.placement, c.inputs)
    assert job.endpoint.paths == ("/health", "/metrics", "/v1/embeddings", "/v1/models")
    assert job.capabilities == ("embeddings",)


def test_a_gguf_model_is_refused_with_a_reason():
    c = make_case("sglang", model_format="gguf")
    with pytest.raises(TranslationError, match="Hugging Face-format directories"):
        SGLangAdapter().job(c.specification, c.model_record, c.placement, c.inputs)


def test_more_parallelism_than_reserved_gpus_is_refused():
    c = case(gpu_memory_bytes=[GIB], parallelism=2)
    with pytest.raises(TranslationError, match="parallelism 2 needs as many GPUs"):
        SGLangAdapter().job(c.specification, c.model_record, c.placement, c.inputs)


def test_a_reservation_beyond_the_device_is_refused():
    c = case(gpu_memory_bytes=[2 * GIB])
    with pytest.raises(TranslationError, match="not a usable share"):
        SGLangAdapter(device_memory_bytes=GIB).job(
            c.specification, c.model_record, c.placement, c.inputs
        )
