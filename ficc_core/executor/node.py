"""What a provider measures about its node and itself, shared by every provider."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ..schema import NodeResources


def package_digest(package_dir: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` over a package's Python sources (name and content, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(Path(package_dir).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()


def total_memory() -> int:
    """Physical memory of this node in bytes (``MemTotal``, else sysconf)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def measure_resources(state_dir: str | os.PathLike[str]) -> NodeResources:
    """CPU cores this process may use, physical memory, and free disk under ``state_dir``."""
    return NodeResources(
        cpus=len(os.sched_getaffinity(0)),
        memory_bytes=total_memory(),
        disk_free_bytes=shutil.disk_usage(state_dir).free,
    )
