"""A size-bounded log per attempt, with tail and follow, and the logs kept after it.

The engine's stdout and stderr are pumped into ``<dir>/log`` by the provider. When
that file reaches half the bound it becomes ``log.1`` (replacing the older one),
so the two never hold more than the bound and the newest lines are always kept.

When an attempt's directory is removed (the provider stops, or a new run clears
what an earlier one left), its log moves to the provider's ``logs/<key>/`` with a
small record of its fence (:class:`KeptLogs`), so the log of an attempt that ended
before the agent restarted is still served after it. Kept logs are bounded in age
and in total size, the oldest going first.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from ..schema import Fence

__all__ = ["KEPT_LOGS_MAX_AGE", "KEPT_LOGS_MAX_BYTES", "BoundedLog", "KeptLogs"]

log = logging.getLogger("ficc.executor")

#: The most bytes the kept logs of ended attempts hold together, per provider.
KEPT_LOGS_MAX_BYTES = 256 * 1024 * 1024
#: How long the log of an ended attempt is kept, in seconds (7 days).
KEPT_LOGS_MAX_AGE = 7 * 24 * 3600.0
#: The record beside a kept log: the attempt's fence and when its log was kept.
KEPT_RECORD = "kept.json"
_LOG_FILES = ("log.1", "log")


class BoundedLog:
    """The bounded log of one attempt.

    :param directory: the attempt's directory; the log lives in ``log`` and ``log.1``.
    :param max_bytes: the most bytes both files hold together.
    """

    def __init__(self, directory: Path, *, max_bytes: int = 4 * 1024 * 1024) -> None:
        self.path = directory / "log"
        self.previous = directory / "log.1"
        self.max_bytes = max_bytes
        self._changed = trio.lowlevel.ParkingLot()
        self._closed = False
        self._lock = trio.Lock()

    async def write(self, data: bytes | bytearray) -> None:
        """Append ``data``, rotating when the current file reaches half the bound."""
        async with self._lock:
            await trio.to_thread.run_sync(self._write, data)
        self._changed.unpark_all()

    def _write(self, data: bytes | bytearray) -> None:
        half = max(self.max_bytes // 2, 1)
        data = data[-half:]
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size + len(data) > half:
            if self.path.exists():
                os.replace(self.path, self.previous)
        with open(self.path, "ab") as file:
            file.write(data)

    async def pump(self, output: trio.abc.ReceiveStream | None, pumped: trio.Event) -> None:
        """Write everything ``output`` (the engine's stdout) gives until it ends; set ``pumped``."""
        try:
            if output is None:
                return
            async with output:
                while data := await output.receive_some(65536):
                    await self.write(data)
        finally:
            pumped.set()

    def close(self) -> None:
        """Mark the log complete: followers stop after the last line."""
        self._closed = True
        self._changed.unpark_all()

    def _read_all(self) -> bytes:
        chunks = []
        for path in (self.previous, self.path):
            try:
                chunks.append(path.read_bytes())
            except FileNotFoundError:
                pass
        return b"".join(chunks)

    async def tail(self, lines: int = 100) -> list[str]:
        """Return the last ``lines`` lines (decoded leniently)."""
        data = await trio.to_thread.run_sync(self._read_all)
        text = data.decode("utf-8", "replace").splitlines()
        return text[-lines:] if lines > 0 else []

    async def follow(self, tail: int | None = None) -> AsyncIterator[str]:
        """Yield every complete line from the start, then new ones, until closed.

        With ``tail``, start with only the last ``tail`` complete lines there are now
        (``log.1`` included), then the new ones: nothing is missed or repeated between.
        """
        position, generation_size, pending = 0, 0, b""
        if tail is not None:
            lines, position, generation_size = await trio.to_thread.run_sync(self._last_lines, tail)
            for text in lines:
                yield text
        while True:
            closed = self._closed
            data, position, generation_size = await trio.to_thread.run_sync(
                self._read_from, position, generation_size
            )
            pending += data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.decode("utf-8", "replace")
            if closed and not data:
                if pending:
                    yield pending.decode("utf-8", "replace")
                return
            if not data:
                with trio.move_on_after(0.5):
                    await self._changed.park()

    def _read_from(self, position: int, inode: int) -> tuple[bytes, int, int]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return b"", 0, 0
        if inode and stat.st_ino != inode:
            # Rotated: finish nothing from the old file (it is bounded anyway) and restart.
            position = 0
        with open(self.path, "rb") as file:
            file.seek(position)
            data = file.read(1024 * 1024)
        return data, position + len(data), stat.st_ino

    def _last_lines(self, tail: int) -> tuple[list[str], int, int]:
        """The last ``tail`` complete lines, and where (offset, inode) the next one starts."""
        try:
            previous = self.previous.read_bytes()
        except FileNotFoundError:
            previous = b""
        try:
            with open(self.path, "rb") as file:
                inode = os.fstat(file.fileno()).st_ino
                current = file.read()
        except FileNotFoundError:
            inode, current = 0, b""
        end = current.rfind(b"\n") + 1
        complete = (previous + current[:end]).split(b"\n")[:-1]
        kept = complete[-tail:] if tail > 0 else []
        return [line.decode("utf-8", "replace") for line in kept], end, inode


class KeptLogs:
    """The logs of ended attempts, kept on the node's disk across agent restarts.

    :param directory: where they live (``<provider state_dir>/logs``), one
        sub-directory per attempt key, holding ``log``, ``log.1`` and ``kept.json``.
    :param max_bytes: the most bytes they hold together; the oldest go first.
    :param max_age: seconds one is kept after its attempt's directory went.

    :meth:`keep`, :meth:`load` and :meth:`prune` block (call them from a worker
    thread); :meth:`fence` reads the index in memory and never blocks.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = KEPT_LOGS_MAX_BYTES,
        max_age: float = KEPT_LOGS_MAX_AGE,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._index: dict[str, tuple[Fence, Path]] = {}

    def keep(self, attempt_directory: Path, record: dict[str, object]) -> None:
        """Move the log of the attempt in ``attempt_directory`` (whose record is
        ``record``) here, replacing an older copy; nothing without a log or a fence."""
        from ..schema import Fence

        try:
            fence = Fence(
                attempt_id=str(record["attempt_id"]),
                generation=int(record["generation"]),  # type: ignore[call-overload]
                plan_digest=str(record["plan_digest"]),
            )
        except (KeyError, TypeError, ValueError):
            return
        logs = [attempt_directory / name for name in _LOG_FILES]
        if not any(path.exists() for path in logs):
            return
        kept = self.directory / attempt_directory.name
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(mode=0o700, parents=True)
        for path in logs:
            if path.exists():
                os.replace(path, kept / path.name)
        facts = {
            "attempt_id": fence.attempt_id,
            "generation": fence.generation,
            "plan_digest": fence.plan_digest,
            "kept_at": time.time(),
        }
        (kept / KEPT_RECORD).write_text(json.dumps(facts, sort_keys=True))
        self._index[fence.attempt_id] = (fence, kept)
        self.prune()

    def load(self) -> None:
        """Read what earlier runs kept into the index, pruning it first."""
        from ..schema import Fence

        self.prune()
        index: dict[str, tuple[Fence, Path]] = {}
        for kept, facts in self._entries():
            try:
                fence = Fence(
                    attempt_id=str(facts["attempt_id"]),
                    generation=int(facts["generation"]),
                    plan_digest=str(facts["plan_digest"]),
                )
            except (KeyError, TypeError, ValueError):
                continue
            index[fence.attempt_id] = (fence, kept)
        self._index = index

    def prune(self) -> None:
        """Drop kept logs older than ``max_age``, then the oldest until the rest fit
        ``max_bytes``."""
        now = time.time()
        entries = []
        for kept, facts in self._entries():
            at = facts.get("kept_at")
            at = float(at) if isinstance(at, int | float) else 0.0
            size = sum(_size(kept / name) for name in _LOG_FILES)
            entries.append((at, size, kept, facts))
        entries.sort(key=lambda entry: entry[0])
        total = sum(size for _, size, _, _ in entries)
        for at, size, kept, facts in entries:
            if now - at <= self.max_age and total <= self.max_bytes:
                continue
            shutil.rmtree(kept, ignore_errors=True)
            total -= size
            self._index.pop(str(facts.get("attempt_id")), None)
            log.info("dropped the kept log of attempt %s", facts.get("attempt_id"))

    def fence(self, attempt_id: str) -> Fence | None:
        """The fence of the attempt whose log is kept here, or None."""
        found = self._index.get(attempt_id)
        return None if found is None else found[0]

    def log(self, attempt_id: str) -> BoundedLog | None:
        """The kept log of ``attempt_id`` (complete: a follow ends after its last line)."""
        found = self._index.get(attempt_id)
        if found is None:
            return None
        kept = BoundedLog(found[1])
        kept.close()
        return kept

    def _entries(self) -> list[tuple[Path, dict[str, Any]]]:  # each record's JSON
        if not self.directory.is_dir():
            return []
        found = []
        for kept in self.directory.iterdir():
            try:
                facts = json.loads((kept / KEPT_RECORD).read_text())
            except (OSError, ValueError):
                facts = {}
            if not isinstance(facts, dict):
                facts = {}
            found.append((kept, facts))
        return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
