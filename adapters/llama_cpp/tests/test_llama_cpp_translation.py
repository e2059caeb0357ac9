"""Golden translations: a specification in, the exact llama-server job out."""

from __future__ import annotations

import pytest
from ficc_adapter_llama_cpp.adapter import LlamaCppAdapter, LlamaCppUnsupported

from ficc_core import (
    GpuRequest,
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

SHA = "5" * 64
BLOB = f"/var/lib/ficc/blobs/sha256/{SHA}"
MODEL_INPUT = JobInput(id="model", path=BLOB, digest=f"sha256:{SHA}")
DIGEST = "sha256:" + "0" * 64
GIB = 1024**3


def _record(*, embedding: bool = False, model_format: str = "gguf") -> ModelRecord:
    if model_format == "gguf":
        manifest = ModelManifest.gguf(
            "SmolLM2 135M", ModelFile(path="smollm2.Q4_1.gguf", size=98_362_496, sha256=SHA)
        )
    else:
        manifest = ModelManifest.hf_directory(
            "SmolLM2 135M", [ModelFile(path="config.json", size=10, sha256=SHA)]
        )
    return ModelRecord(
        id="smollm2",
        revision=manifest.digest(),
        manifest=manifest,
        metadata=ModelMetadata(architecture="llama", context_length=8192, embedding=embedding),
    )


def _placement(cpus: float = 2.0, gpus: int = 0) -> Placement:
    limits = ResourceLimits(
        cpus=cpus,
        memory_bytes=4 * GIB,
        gpus=[GpuRequest(index=index, memory_bytes=24 * GIB) for index in range(gpus)],
    )
    return Placement(node_id="node-1", limits=limits)


def _spec(placement: Placement, **options) -> Specification:
    settings = {
        "alias": "smol",
        "model_id": "smollm2",
        "engine": "llama_cpp",
        "runtime": Runtime(
            executor_provider="process",
            package_digest=DIGEST,
            image_digest=DIGEST,
            isolation="process",
        ),
        "image_executable": "llama-server",
        "context": 4096,
        "concurrency": 1,
        "placements": [placement],
    }
    settings.update(options)
    return Specification(**settings)


def _translate(placement=None, record=None, inputs=(MODEL_INPUT,), **options):
    placement = placement or _placement()
    return LlamaCppAdapter().job(
        _spec(placement, **options), record or _record(), placement, inputs
    )


HEAD = ["llama-server", "--model", BLOB, "--host", "{endpoint_socket}"]
TAIL = ["--metrics", "--no-webui"]
CHAT_PATHS = (
    "/apply-template",
    "/health",
    "/metrics",
    "/tokenize",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
)

GOLDEN = [
    pytest.param(
        {"context": 4096, "concurrency": 1},
        _placement(cpus=2),
        False,
        [*HEAD, "--ctx-size", "4096", "--parallel", "1", "--threads", "2",
         "--n-gpu-layers", "0", "--alias", "smol", *TAIL],
        id="cpu, one slot",
    ),
    pytest.param(
        {"context": 2048, "concurrency": 4},
        _placement(cpus=1.5),
        False,
        [*HEAD, "--ctx-size", "8192", "--parallel", "4", "--threads", "2",
         "--n-gpu-layers", "0", "--alias", "smol", *TAIL],
        id="cpu, four slots share a pool of 4 x 2048, fractional cpus round up",
    ),
    pytest.param(
        {"context": 512, "concurrency": 2},
        _placement(cpus=0.25),
        False,
        [*HEAD, "--ctx-size", "1024", "--parallel", "2", "--threads", "1",
         "--n-gpu-layers", "0", "--alias", "smol", *TAIL],
        id="a quarter cpu still gets one thread",
    ),
    pytest.param(
        {"context": 8192, "concurrency": 2, "gpu_layers": 99},
        _placement(cpus=8, gpus=1),
        False,
        [*HEAD, "--ctx-size", "16384", "--parallel", "2", "--threads", "8",
         "--n-gpu-layers", "99", "--alias", "smol", *TAIL],
        id="one gpu, every layer offloaded",
    ),
    pytest.param(
        {"context": 8192, "concurrency": 1},
        _placement(cpus=8, gpus=1),
        False,
        [*HEAD, "--ctx-size", "8192", "--parallel", "1", "--threads", "8",
         "--alias", "smol", *TAIL],
        id="one gpu, gpu_layers absent: llama-server's own default",
    ),
    pytest.param(
        {"context": 32768, "concurrency": 8, "gpu_layers": 80, "tensor_split": [3, 1]},
        _placement(cpus=16, gpus=2),
        False,
        [*HEAD, "--ctx-size", "262144", "--parallel", "8", "--threads", "16",
         "--n-gpu-layers", "80", "--tensor-split", "3,1", "--alias", "smol", *TAIL],
        id="two gpus, tensor split 3:1",
    ),
    pytest.param(
        {"context": 4096, "concurrency": 2, "gpu_layers": 40, "tensor_split": [0.6, 0.25, 0.15]},
        _placement(cpus=4, gpus=3),
        False,
        [*HEAD, "--ctx-size", "8192", "--parallel", "2", "--threads", "4",
         "--n-gpu-layers", "40", "--tensor-split", "0.6,0.25,0.15", "--alias", "smol", *TAIL],
        id="three gpus, fractional shares",
    ),
    pytest.param(
        {"context": 512, "concurrency": 4},
        _placement(cpus=2),
        True,
        [*HEAD, "--ctx-size", "2048", "--parallel", "4", "--threads", "2",
         "--n-gpu-layers", "0", "--alias", "smol", "--embedding", *TAIL],
        id="embedding model",
    ),
    pytest.param(
        {"context": 2048, "concurrency": 2, "prompt_cache_bytes": (512 << 20) + 1},
        _placement(cpus=2),
        False,
        [*HEAD, "--ctx-size", "4096", "--parallel", "2", "--threads", "2",
         "--n-gpu-layers", "0", "--alias", "smol", "--cache-ram", "512", *TAIL],
        id="a host prompt cache, in whole MiB rounded down",
    ),
    pytest.param(
        {"context": 2048, "concurrency": 2, "prompt_cache_bytes": 0},
        _placement(cpus=2),
        False,
        [*HEAD, "--ctx-size", "4096", "--parallel", "2", "--threads", "2",
         "--n-gpu-layers", "0", "--alias", "smol", "--cache-ram", "0", *TAIL],
        id="no host prompt cache",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("options", "placement", "embedding", "argv"), GOLDEN)
def test_golden_translation(options, placement, embedding, argv):
    job = _translate(placement, _record(embedding=embedding), **options)
    assert list(job.argv) == argv
    assert job.inputs == (MODEL_INPUT,)
    assert job.env == {}
    assert job.endpoint.transport == "unix"
    assert job.endpoint.socket == "engine.sock"  # llama-server needs the .sock suffix
    assert job.readiness.path == "/health"


def test_a_chat_model_serves_chat_streaming_and_completions_on_their_routes():
    job = _translate()
    # Its prompts can be counted first (the gateway's context refusal).
    assert job.capabilities == ("chat", "completions", "streaming", "tokenize.llama_cpp")
    assert job.endpoint.paths == CHAT_PATHS
    assert "--embedding" not in job.argv


def test_an_embedding_model_serves_embeddings_only():
    job = _translate(record=_record(embedding=True))
    assert job.capabilities == ("embeddings",)
    assert job.endpoint.paths == ("/health", "/metrics", "/v1/embeddings", "/v1/models")
    assert LlamaCppAdapter().capabilities(_record(embedding=True)) == ("embeddings",)


def test_the_executable_is_the_specifications_image_executable():
    job = _translate(image_executable="/opt/venv/bin/ficc-llama-server")
    assert job.argv[0] == "/opt/venv/bin/ficc-llama-server"


def test_the_translation_is_deterministic():
    assert _translate().digest() == _translate().digest()


@pytest.mark.parametrize(
    ("options", "placement", "field"),
    [
        ({"gpu_layers": 10}, _placement(gpus=0), "gpu_layers"),
        ({"tensor_split": [1, 1]}, _placement(gpus=0), "tensor_split"),
        ({"gpu_layers": 10, "tensor_split": [1, 1, 1]}, _placement(gpus=2), "tensor_split"),
        ({"parallelism": 2}, _placement(gpus=2), "parallelism"),
    ],
)
def test_what_the_placement_or_llama_cpp_cannot_do_is_refused(options, placement, field):
    with pytest.raises(LlamaCppUnsupported) as refused:
        _translate(placement, **options)
    assert refused.value.field == field
    assert str(refused.value).startswith(f"{field}: ")


def test_zero_gpu_layers_on_a_cpu_placement_is_fine_and_parallelism_one_is_fine():
    job = _translate(gpu_layers=0, parallelism=1)
    assert job.argv[job.argv.index("--n-gpu-layers") + 1] == "0"


def test_a_model_that_is_not_gguf_is_refused():
    with pytest.raises(LlamaCppUnsupported, match="loads GGUF models"):
        _translate(record=_record(model_format="hf-directory"))


@pytest.mark.parametrize(
    "inputs",
    [(), (MODEL_INPUT, JobInput(id="extra", path="/var/lib/ficc/blobs/extra"))],
    ids=["none", "two"],
)
def test_a_gguf_model_needs_exactly_one_input(inputs):
    with pytest.raises(LlamaCppUnsupported, match="exactly one input"):
        _translate(inputs=inputs)


def test_an_input_whose_digest_is_not_the_models_file_is_refused():
    wrong = JobInput(id="model", path=BLOB, digest="sha256:" + "6" * 64)
    with pytest.raises(LlamaCppUnsupported, match="digest"):
        _translate(inputs=(wrong,))


def test_translation_does_no_io_and_starts_nothing(monkeypatch):
    # The simple proof, independent of the conformance kit: every way to touch a file,
    # a socket or a process raises while the adapter translates.
    import builtins
    import io
    import os
    import socket
    import subprocess

    def forbidden(*_args, **_kwargs):
        raise AssertionError("the adapter did I/O or started a process")

    for owner, name in [
        (builtins, "open"), (io, "open"), (os, "open"), (os, "stat"), (os, "lstat"),
        (os, "listdir"), (os, "scandir"), (os, "fork"), (os, "posix_spawn"), (os, "system"),
        (os.path, "exists"), (socket, "socket"), (socket, "getaddrinfo"),
        (subprocess, "Popen"), (subprocess, "run"),
    ]:  # fmt: skip
        monkeypatch.setattr(owner, name, forbidden)
    job = _translate(_placement(cpus=4, gpus=2), gpu_layers=99, tensor_split=[1, 1])
    embedding_job = _translate(record=_record(embedding=True))
    monkeypatch.undo()
    assert job.argv[0] == "llama-server" and "--embedding" in embedding_job.argv


def _split_record(parts: int = 3) -> ModelRecord:
    files = [
        ModelFile(path=f"q4/big-{n:05d}-of-{parts:05d}.gguf", size=10 + n, sha256=f"{n}" * 64)
        for n in (2, 3, 1)  # listed out of order: the adapter hands llama.cpp part 1
    ]
    manifest = ModelManifest(name="big", format="gguf", files=files)
    return ModelRecord(id="big", revision=manifest.digest(), manifest=manifest)


def test_a_split_gguf_is_loaded_from_its_first_part_inside_the_directory_input():
    tree = JobInput(id="model", path="/var/lib/ficc/blobs/trees/" + "a" * 64)
    job = _translate(record=_split_record(), inputs=(tree,))
    model = job.argv[job.argv.index("--model") + 1]
    assert model == f"{tree.path}/q4/big-00001-of-00003.gguf"
    assert job.inputs == (tree,)  # the whole directory is admitted, every part beside part 1


def test_a_split_gguf_refuses_a_single_file_input():
    with pytest.raises(LlamaCppUnsupported, match="needs a directory input") as refused:
        _translate(record=_split_record(), inputs=(MODEL_INPUT,))
    assert refused.value.field == "immutable_input_references"
