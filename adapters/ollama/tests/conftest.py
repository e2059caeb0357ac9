"""Specifications, model records and inputs for the ollama adapter's tests.

Tests run with ``--import-mode=importlib``, so a sibling module cannot be imported by
name: the ``cases`` fixture hands this module to a test instead.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest

from ficc_core import (
    JobInput,
    ModelFile,
    ModelManifest,
    ModelMetadata,
    ModelRecord,
    Placement,
    Specification,
)
from ficc_core.testing import make_placement, make_specification

SHA = "ab" * 32
DIGEST = "sha256:" + SHA
BLOB_PATH = "/var/lib/ficc/blobs/sha256/" + SHA


def model_record(
    *,
    path: str = "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: str = SHA,
    embedding: bool = False,
    chat_template: bool = True,
    hf_directory: bool = False,
) -> ModelRecord:
    """A registered model: one GGUF file, or a Hugging Face directory."""
    if hf_directory:
        manifest = ModelManifest.hf_directory(
            "Small model",
            [
                ModelFile(path="config.json", size=10, sha256="1" * 64),
                ModelFile(path="model.safetensors", size=1024, sha256="2" * 64),
            ],
        )
    else:
        manifest = ModelManifest.gguf("Small model", ModelFile(path=path, size=1024, sha256=sha256))
    return ModelRecord(
        id="model-1",
        revision=manifest.digest(),
        manifest=manifest,
        metadata=ModelMetadata(
            architecture="llama",
            context_length=8192,
            chat_template=chat_template,
            embedding=embedding,
        ),
    )


def model_input(path: str = BLOB_PATH, digest: str | None = DIGEST) -> JobInput:
    """The admitted GGUF file of :func:`model_record`."""
    return JobInput(id="model", path=path, digest=digest)


def placement(*, cpus: float = 4.0, gpus: tuple[int, ...] = ()) -> Placement:
    """One node, with one GPU reservation per entry of ``gpus`` (its memory in bytes)."""
    return make_placement(cpus=cpus, gpu_memory_bytes=gpus)


def specification(
    *,
    executable: str = "/usr/bin/ollama",
    alias: str = "smollm2",
    context: int = 4096,
    concurrency: int = 2,
    where: Placement | None = None,
    **options: object,
) -> Specification:
    """A one-replica ollama service of :func:`model_record`."""
    return make_specification(
        "ollama",
        placement=where or placement(),
        alias=alias,
        image_executable=executable,
        context=context,
        concurrency=concurrency,
        **options,
    )


@pytest.fixture
def cases() -> ModuleType:
    """This module: builders for specifications, model records, placements and inputs."""
    return sys.modules[__name__]


@pytest.fixture
async def provider() -> AsyncIterator[Any]:
    """A running process provider (engines in their own network namespace)."""
    from ficc_executor_process.testing import running_process_provider

    async with running_process_provider(stream_idle_timeout=60.0) as provider:
        yield provider
