"""A local runtime image built without any registry, and a running container provider.

The image is a tiny root file system (``FROM scratch`` / ``ADD rootfs.tar /``,
built with ``--timestamp 0`` so its digest is stable); the stand-in engine runs
on the host's Python and virtual environment, bind-mounted read-only at the same
absolute paths.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from ficc_executor_container.provider import ContainerProvider

IMAGE = "localhost/ficc-standin:test"
REPOSITORY = Path(__file__).resolve().parents[3]
#: What the stand-in needs from the host: libc and friends, the interpreter, the venv.
MOUNTS = sorted({"/usr", sys.base_prefix, str(REPOSITORY)})


def _rootfs_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:

        def add(name: str, *, kind: bytes = tarfile.DIRTYPE, target: str = "", data: bytes = b""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mtime = kind, target, 0
            info.mode = 0o755 if kind != tarfile.REGTYPE else 0o644
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for directory in ("usr", "etc", "tmp", "proc", "sys", "dev", "run", "ficc", "root"):
            add(directory)
        for link in ("bin", "lib", "lib64", "sbin"):
            add(link, kind=tarfile.SYMTYPE, target=f"usr/{link}")
        add("etc/passwd", kind=tarfile.REGTYPE, data=b"root:x:0:0:root:/root:/bin/sh\n")
        add("etc/group", kind=tarfile.REGTYPE, data=b"root:x:0:\n")
    return buffer.getvalue()


@pytest.fixture(scope="session")
def standin_image() -> Iterator[str]:
    """Build (once per session) the local image; yield its ID ``sha256:<hex>``."""
    context = Path(tempfile.mkdtemp(prefix="ficc-image-"))
    try:
        (context / "rootfs.tar").write_bytes(_rootfs_tar())
        (context / "Containerfile").write_text("FROM scratch\nADD rootfs.tar /\n")
        subprocess.run(
            ["podman", "build", "--timestamp", "0", "-q", "-t", IMAGE, str(context)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        image = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Id}}", IMAGE],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    finally:
        shutil.rmtree(context, ignore_errors=True)
    yield f"sha256:{image}"


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def options(state_dir: Path) -> dict:
    """How the tests configure the provider (also used by the provider-host subprocess)."""
    return {
        "state_dir": str(state_dir),
        "images": {"standin": IMAGE},
        "runtime": "runc",
        "mounts": MOUNTS,
        "default_grace": 2.0,
    }


@pytest.fixture
async def provider(options: dict, standin_image: str) -> AsyncIterator[ContainerProvider]:
    provider = ContainerProvider(**options)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await nursery.start(provider.run)
        yield provider
        nursery.cancel_scope.cancel()
