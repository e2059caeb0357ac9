"""Specifications, model records and inputs for the vllm adapter's tests.

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

GIB = 1024**3
MODEL_DIR = "/var/lib/ficc/models/smollm2-135m-instruct"


def model_record(*, weights: int = 2 * GIB, embedding: bool = False, gguf: bool = False):
    """A registered Hugging Face directory (``weights`` bytes of safetensors), or a GGUF."""
    if gguf:
        manifest = ModelManifest.gguf(
            "Small model", ModelFile(path="model.gguf", size=1024, sha256="1" * 64)
        )
    else:
        manifest = ModelManifest.hf_directory(
            "Small model",
            [
                ModelFile(path="config.json", size=700, sha256="1" * 64),
                ModelFile(path="tokenizer.json", size=2_000_000, sha256="2" * 64),
                ModelFile(
                    path="model-00001-of-00002.safetensors", size=weights // 2, sha256="3" * 64
                ),
                ModelFile(
                    path="model-00002-of-00002.safetensors",
                    size=weights - weights // 2,
                    sha256="4" * 64,
                ),
            ],
        )
    return ModelRecord(
        id="model-1",
        revision=manifest.digest(),
        manifest=manifest,
        metadata=ModelMetadata(architecture="llama", context_length=8192, embedding=embedding),
    )


def model_input(path: str = MODEL_DIR) -> JobInput:
    """The admitted model directory."""
    return JobInput(id="model", path=path)


def placement(
    *, cpus: float = 8.0, memory: int = 16 * GIB, gpus: tuple[int, ...] = ()
) -> Placement:
    """One node, with one GPU reservation per entry of ``gpus`` (its memory in bytes)."""
    return make_placement(cpus=cpus, memory_bytes=memory, gpu_memory_bytes=gpus)


def specification(
    *,
    executable: str = "/opt/vllm/bin/vllm",
    alias: str = "smollm2",
    context: int = 4096,
    concurrency: int = 8,
    where: Placement | None = None,
    **options: object,
) -> Specification:
    """A one-replica vllm service of :func:`model_record`."""
    return make_specification(
        "vllm",
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
