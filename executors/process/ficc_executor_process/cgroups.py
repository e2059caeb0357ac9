"""Per-attempt cgroups for memory, CPU and pids: cgroup v2 where writable, else v1.

Everything here is blocking file I/O; the provider calls it through
``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import attrs

CPU_PERIOD_US = 100_000
_ROOT = Path("/sys/fs/cgroup")


@attrs.frozen
class CgroupLayout:
    """Where this provider's cgroups live: one parent directory per controller.

    :ivar version: 2 (unified) or 1 (one hierarchy per controller).
    :ivar parents: controller name -> the provider's parent directory; with v2
        every controller maps to the same directory.
    """

    version: int
    parents: dict[str, Path]

    @property
    def controllers(self) -> frozenset[str]:
        """The controllers available: a subset of memory, cpu, pids."""
        return frozenset(self.parents)

    def paths(self, key: str) -> dict[str, Path]:
        """The attempt's cgroup directory per controller."""
        return {controller: parent / key for controller, parent in self.parents.items()}


def detect(name: str, root: Path = _ROOT) -> CgroupLayout | None:
    """Create (or reuse) this provider's parent cgroups; None when nothing is writable."""
    if (root / "cgroup.controllers").exists():
        parent = root / name
        try:
            parent.mkdir(exist_ok=True)
            available = (root / "cgroup.controllers").read_text().split()
            wanted = [c for c in ("memory", "cpu", "pids") if c in available]
            for controller in wanted:
                (root / "cgroup.subtree_control").write_text(f"+{controller}")
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError:
            return None
        return CgroupLayout(2, {c: parent for c in wanted})
    parents: dict[str, Path] = {}
    for controller in ("memory", "cpu", "pids"):
        parent = root / controller / name
        try:
            parent.mkdir(exist_ok=True)
        except OSError:
            continue
        parents[controller] = parent
    return CgroupLayout(1, parents) if parents else None


def create(
    layout: CgroupLayout,
    key: str,
    *,
    memory_bytes: int | None,
    cpus: float | None,
    pids: int | None,
) -> dict[str, Path]:
    """Create the attempt's cgroups with its limits; return them per controller."""
    paths = layout.paths(key)
    for path in set(paths.values()):
        path.mkdir(exist_ok=True)
    if "memory" in paths and memory_bytes is not None:
        path = paths["memory"]
        if layout.version == 2:
            (path / "memory.max").write_text(str(memory_bytes))
            _try_write(path / "memory.swap.max", "0")
        else:
            (path / "memory.limit_in_bytes").write_text(str(memory_bytes))
            _try_write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))
    if "cpu" in paths and cpus is not None:
        quota = max(int(cpus * CPU_PERIOD_US), 1000)
        if layout.version == 2:
            (paths["cpu"] / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (paths["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (paths["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
    if "pids" in paths and pids is not None:
        (paths["pids"] / "pids.max").write_text(str(pids))
    return paths


def procs_files(paths: dict[str, Path]) -> list[str]:
    """The ``cgroup.procs`` files a process writes its PID into to join."""
    return sorted({str(path / "cgroup.procs") for path in paths.values()})


def oom_killed(layout: CgroupLayout, paths: dict[str, Path]) -> bool:
    """Whether the kernel killed something in the attempt's memory cgroup."""
    path = paths.get("memory")
    if path is None:
        return False
    name = "memory.events" if layout.version == 2 else "memory.oom_control"
    try:
        for line in (path / name).read_text().splitlines():
            field, _, value = line.partition(" ")
            if field == "oom_kill" and int(value) > 0:
                return True
    except (OSError, ValueError):
        pass
    return False


def pids_in(paths: dict[str, Path]) -> set[int]:
    """Every PID still in the attempt's cgroups."""
    found: set[int] = set()
    for path in set(paths.values()):
        try:
            found.update(int(pid) for pid in (path / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            pass
    return found


def kill_and_remove(paths: dict[str, Path], *, timeout: float = 5.0) -> bool:
    """SIGKILL everything in the cgroups, then remove them; return whether all are gone."""
    deadline = time.monotonic() + timeout
    while True:
        pids = pids_in(paths)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        removed = True
        for path in set(paths.values()):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                removed = False
        if removed:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def leftovers(layout: CgroupLayout) -> list[str]:
    """Attempt cgroups found under the provider's parents (after a crash)."""
    keys: set[str] = set()
    for parent in layout.parents.values():
        try:
            keys.update(entry.name for entry in os.scandir(parent) if entry.is_dir())
        except OSError:
            pass
    return sorted(keys)


def remove_parents(layout: CgroupLayout) -> None:
    """Remove the provider's parent cgroups when they are empty (at shutdown)."""
    for parent in set(layout.parents.values()):
        try:
            parent.rmdir()
        except OSError:
            pass


def _try_write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass
