"""Golden translations: specifications in, ``ollama serve`` jobs with bootstrap requests out."""

from __future__ import annotations

import pytest
from ficc_adapter_ollama.adapter import OllamaAdapter, OllamaUnsupported

from ficc_core.schema import unstructure
from ficc_core.testing import AdapterCase, check_adapter

SHA = "ab" * 32
DIGEST = "sha256:" + SHA
BLOB_PATH = "/var/lib/ficc/blobs/sha256/" + SHA

GIB = 1024**3


def _job(cases, spec=None, record=None, where=None, inputs=None):
    where = where or cases.placement()
    spec = spec or cases.specification(where=where)
    return OllamaAdapter().job(
        spec, record or cases.model_record(), where, inputs or (cases.model_input(),)
    )


def test_the_default_translation_is_this_exact_job(cases):
    assert unstructure(_job(cases)) == {
        "argv": ["/usr/bin/ollama", "serve"],
        "env": {
            "HOME": ".",
            "OLLAMA_CONTEXT_LENGTH": "4096",
            "OLLAMA_HOST": "127.0.0.1:11434",
            "OLLAMA_KEEP_ALIVE": "-1",
            "OLLAMA_MAX_LOADED_MODELS": "1",
            "OLLAMA_MODELS": "models",
            "OLLAMA_NUM_PARALLEL": "2",
        },
        "inputs": [{"id": "model", "path": BLOB_PATH, "digest": DIGEST}],
        "endpoint": {
            "paths": [
                "/api/blobs/" + DIGEST,
                "/api/create",
                "/api/version",
                "/v1/chat/completions",
                "/v1/completions",
                "/v1/models",
            ],
            "transport": "tcp",
            "socket": "engine.sock",
            "port": 11434,
            "version": 1,
        },
        "readiness": {"path": "/api/version", "timeout": 600.0, "interval": 0.5},
        "capabilities": ["chat", "completions", "streaming", "tools"],
        "bootstrap": [
            {
                "path": "/api/blobs/" + DIGEST,
                "method": "POST",
                "input_id": "model",
                "expect": [200, 201],
                "timeout": 600.0,
            },
            {
                "path": "/api/create",
                "method": "POST",
                "body": {
                    "model": "smollm2",
                    "files": {"SmolLM2-135M-Instruct.Q4_1.gguf": DIGEST},
                    "parameters": {"num_ctx": 4096, "num_thread": 4, "num_gpu": 0},
                    "stream": False,
                },
                "expect": [200],
                "timeout": 600.0,
            },
        ],
    }


def test_the_default_translation_has_a_stable_digest(cases):
    assert _job(cases).digest() == _job(cases).digest()
    assert _job(cases).digest() != _job(cases, cases.specification(context=8192)).digest()


@pytest.mark.parametrize(
    ("context", "concurrency", "cpus", "gpus", "gpu_layers", "env", "parameters"),
    [
        # CPU only: no layers offloaded, threads from the CPU reservation.
        (2048, 1, 2.0, (), None, ("2048", "1"), {"num_ctx": 2048, "num_thread": 2, "num_gpu": 0}),
        # A fractional CPU reservation rounds down (never below one thread).
        (4096, 4, 2.5, (), None, ("4096", "4"), {"num_ctx": 4096, "num_thread": 2, "num_gpu": 0}),
        (512, 1, 0.5, (), None, ("512", "1"), {"num_ctx": 512, "num_thread": 1, "num_gpu": 0}),
        # With a GPU and no gpu_layers, Ollama decides how many layers fit.
        (8192, 8, 8.0, (24 * GIB,), None, ("8192", "8"), {"num_ctx": 8192, "num_thread": 8}),
        # gpu_layers becomes num_gpu, with or without GPUs.
        (
            32768,
            16,
            16.0,
            (80 * GIB, 80 * GIB),
            99,
            ("32768", "16"),
            {"num_ctx": 32768, "num_thread": 16, "num_gpu": 99},
        ),
        (4096, 2, 4.0, (), 0, ("4096", "2"), {"num_ctx": 4096, "num_thread": 4, "num_gpu": 0}),
    ],
)
def test_context_concurrency_and_gpus_translate(
    cases, context, concurrency, cpus, gpus, gpu_layers, env, parameters
):
    where = cases.placement(cpus=cpus, gpus=gpus)
    spec = cases.specification(
        context=context, concurrency=concurrency, where=where, gpu_layers=gpu_layers
    )
    job = _job(cases, spec, where=where)
    assert (job.env["OLLAMA_CONTEXT_LENGTH"], job.env["OLLAMA_NUM_PARALLEL"]) == env
    assert job.bootstrap[1].body["parameters"] == parameters


def test_an_embedding_model_gets_embeddings_and_no_chat(cases):
    job = _job(cases, record=cases.model_record(embedding=True))
    assert job.capabilities == ("embeddings",)
    assert "/v1/embeddings" in job.endpoint.paths
    assert "/v1/chat/completions" not in job.endpoint.paths
    assert "/v1/completions" not in job.endpoint.paths


def test_a_model_without_chat_template_gets_chat_without_tools(cases):
    assert _job(cases, record=cases.model_record(chat_template=False)).capabilities == (
        "chat",
        "completions",
        "streaming",
    )


def test_the_blob_upload_carries_only_the_admitted_input(cases):
    job = _job(cases)
    upload, create = job.bootstrap
    assert upload.input_id == "model" and upload.body is None
    assert upload.path == f"/api/blobs/{DIGEST}"
    assert create.input_id is None
    assert [item.id for item in job.inputs] == ["model"]


def test_the_created_file_is_named_after_the_manifests_gguf_file(cases):
    job = _job(cases, record=cases.model_record(path="weights/small-q4.gguf"))
    assert job.bootstrap[1].body["files"] == {"small-q4.gguf": DIGEST}


def test_the_alias_names_the_created_model(cases):
    job = _job(cases, cases.specification(alias="team-model:v2"))
    assert job.bootstrap[1].body["model"] == "team-model:v2"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"tensor_split": (0.5, 0.5)}, "tensor_split"),
        ({"parallelism": 2}, "parallelism"),
        ({"prompt_cache_bytes": 0}, "prompt_cache_bytes"),
    ],
)
def test_options_ollama_lacks_are_refused_naming_the_field(cases, options, field):
    with pytest.raises(OllamaUnsupported) as caught:
        _job(cases, cases.specification(**options))
    assert caught.value.field == field


def test_a_hugging_face_directory_is_refused(cases):
    with pytest.raises(OllamaUnsupported, match="serves GGUF models"):
        _job(cases, record=cases.model_record(hf_directory=True))


def test_a_split_gguf_is_refused_naming_the_llama_cpp_adapter(cases):
    from ficc_core import ModelFile, ModelManifest, ModelRecord

    parts = [ModelFile(path=f"m-{n:05d}-of-00002.gguf", size=1, sha256=SHA) for n in (1, 2)]
    manifest = ModelManifest(name="m", format="gguf", files=parts)
    record = ModelRecord(id="m", revision=manifest.digest(), manifest=manifest)
    with pytest.raises(OllamaUnsupported, match="split GGUF of 2 parts") as caught:
        _job(cases, record=record)
    assert caught.value.field == "model_id"
    assert "llama_cpp" in str(caught.value)


def test_an_input_without_digest_is_refused(cases):
    with pytest.raises(OllamaUnsupported, match="with its digest"):
        _job(cases, inputs=(cases.model_input(digest=None),))


def test_the_adapter_passes_the_conformance_kit(cases):
    jobs = []
    for where, record, options in [
        (cases.placement(), cases.model_record(), {}),
        (cases.placement(cpus=1.0), cases.model_record(embedding=True), {"context": 512}),
        (
            cases.placement(gpus=(24 * GIB,)),
            cases.model_record(),
            {"gpu_layers": 20, "concurrency": 8},
        ),
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
    check_adapter(OllamaAdapter, cases=jobs)
