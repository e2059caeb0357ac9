"""The adapter kit's vocabulary: cases, builders for their arguments, the kit's error.

A case is one call of ``adapter.job(...)``; :func:`make_case` builds one from a few
keywords. ``ficc_core.testing.adapter_kit`` exports every name here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ..schema import (
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


class AdapterConformanceError(AssertionError):
    """An adapter broke the adapter contract; the message says which rule, for which case."""


def _inputs(inputs: Iterable[JobInput]) -> tuple[JobInput, ...]:
    return tuple(inputs)


@attrs.frozen(kw_only=True)
class AdapterCase:
    """One call of ``adapter.job(...)``: its four arguments and a name for messages."""

    specification: Specification
    model_record: ModelRecord
    placement: Placement
    inputs: tuple[JobInput, ...] = attrs.field(converter=_inputs)
    name: str = "case"

    def call(self, adapter: Any) -> Any:
        """Call ``adapter.job`` with this case's arguments."""
        return adapter.job(self.specification, self.model_record, self.placement, self.inputs)


_DIGEST = "sha256:" + "0" * 64


def make_placement(
    *,
    cpus: float = 4.0,
    memory_bytes: int = 8 * 1024**3,
    gpu_memory_bytes: Sequence[int] = (),
    node_id: str = "node-1",
) -> Placement:
    """One node's reservation; each entry of ``gpu_memory_bytes`` reserves one GPU."""
    return Placement(
        node_id=node_id,
        limits=ResourceLimits(
            cpus=cpus,
            memory_bytes=memory_bytes,
            gpus=[
                GpuRequest(index=index, memory_bytes=size)
                for index, size in enumerate(gpu_memory_bytes)
            ],
        ),
    )


def make_specification(
    engine: str,
    *,
    placement: Placement | None = None,
    alias: str = "small-model",
    image_executable: str = "engine",
    context: int = 4096,
    concurrency: int = 2,
    **options: Any,
) -> Specification:
    """A one-replica service of model ``model-1`` on ``placement`` (a process runtime).

    ``options`` are the optional specification fields (``gpu_layers``,
    ``tensor_split``, ``parallelism``, ``request_deadline``, ``prompt_cache_bytes``).
    """
    return Specification(
        alias=alias,
        model_id="model-1",
        engine=engine,
        runtime=Runtime(
            executor_provider="process",
            package_digest=_DIGEST,
            image_digest=_DIGEST,
            isolation="process",
        ),
        image_executable=image_executable,
        context=context,
        concurrency=concurrency,
        placements=[placement or make_placement()],
        **options,
    )


def make_case(
    engine: str,
    *,
    model_format: str = "gguf",
    image_executable: str = "engine",
    context: int = 4096,
    concurrency: int = 2,
    cpus: float = 4.0,
    memory_bytes: int = 8 * 1024**3,
    gpu_memory_bytes: Sequence[int] = (),
    gpu_layers: int | None = None,
    tensor_split: Sequence[float] | None = None,
    parallelism: int | None = None,
    embedding: bool = False,
    name: str | None = None,
) -> AdapterCase:
    """Build a plausible case: a one-replica service of a small model on one node.

    ``model_format`` is ``"gguf"`` (one file input, ``/models/.../model.gguf``) or
    ``"hf-directory"`` (one directory input holding ``config.json``). Each entry
    of ``gpu_memory_bytes`` reserves one GPU with that much memory.
    """
    sha = "1" * 64
    if model_format == "gguf":
        manifest = ModelManifest.gguf(
            "Small model", ModelFile(path="model.gguf", size=1024, sha256=sha)
        )
        reference = JobInput(
            id="model", path="/var/lib/ficc/blobs/sha256/" + sha, digest="sha256:" + sha
        )
    elif model_format == "hf-directory":
        manifest = ModelManifest.hf_directory(
            "Small model",
            [
                ModelFile(path="config.json", size=10, sha256=sha),
                ModelFile(path="model.safetensors", size=1024, sha256="2" * 64),
            ],
        )
        reference = JobInput(id="model", path="/var/lib/ficc/models/small-model")
    else:
        raise ValueError(f'model_format must be "gguf" or "hf-directory", got {model_format!r}')
    placement = make_placement(
        cpus=cpus, memory_bytes=memory_bytes, gpu_memory_bytes=gpu_memory_bytes
    )
    specification = make_specification(
        engine,
        placement=placement,
        alias="small-model",
        image_executable=image_executable,
        context=context,
        concurrency=concurrency,
        gpu_layers=gpu_layers,
        tensor_split=tensor_split,
        parallelism=parallelism,
    )
    record = ModelRecord(
        id="model-1",
        revision=manifest.digest(),
        manifest=manifest,
        metadata=ModelMetadata(architecture="llama", context_length=8192, embedding=embedding),
    )
    return AdapterCase(
        specification=specification,
        model_record=record,
        placement=placement,
        inputs=(reference,),
        name=name or f"{model_format}, context {context}, concurrency {concurrency}",
    )
