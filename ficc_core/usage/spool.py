"""The usage spool: every usage record on disk the moment it is made, until it is stored.

The usage writer (:mod:`.ledger`) keeps records in memory for up to
``usage_flush_interval``; a controller killed with SIGKILL would lose them. So each
record is also appended to this controller's spool file in ``data_dir/usage-spool``
with one ``os.write`` (the page cache: it survives the process being killed, not the
machine crashing). A record is its row of plain values (strings, numbers, None) as a
pickle: about 150 bytes, encoded in about 2 µs, five times faster than JSON; it is
read back by an unpickler that loads no class, so a spool file can only hold values.
Before each batch write the spool moves on to a new segment; once the write succeeded
the older segments are deleted.

Each controller process names its spool ``<controller id>.<random>`` and holds an
exclusive ``flock`` on ``<name>.lock`` for its life. At start a controller replays every
spool in the folder whose lock it can take (its owner is gone: the kernel released the
lock when the process died), inserting the records not yet stored (each carries its
``record_id``, unique in ``inference_usage``), then deletes that spool. The data
directory is one machine's (a lock on a network file system is not to be relied on).
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pickle
import re
import secrets
from itertools import count
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger("ficc.inference.usage")

#: The spool folder inside the data directory.
FOLDER = "usage-spool"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
_PROTOCOL = 5


class UsageSpool:
    """One controller process's spool (see the module docs).

    :param folder: the spool folder (``data_dir/usage-spool``).
    :param owner: the controller's ID, the start of the spool's name.
    """

    def __init__(self, folder: Path, owner: str) -> None:
        self.folder = folder
        self.name = f"{_UNSAFE.sub('_', owner)[:80]}.{secrets.token_hex(4)}"
        self._ids = count(1)
        self._segments = count(1)
        self._fd = -1
        self._lock_fd = -1
        self._current: Path | None = None
        self._bytes = 0
        self._sealed: list[Path] = []
        self._failing = False

    # -- on the event loop ---------------------------------------------------------

    def next_id(self) -> str:
        """A new record's ID, unique across controllers and runs."""
        return f"{self.name}.{next(self._ids)}"

    def append(self, row: tuple[Any, ...]) -> None:
        """Write one record's row (plain values, about 150 bytes pickled) to the current
        segment: one ``os.write`` to the page cache, a few microseconds. A failure (a full
        disk) is logged, never raised: the record is still in memory and written to the
        store. After :meth:`close`, nothing is written."""
        if self._fd < 0:
            return
        try:
            self._bytes += os.write(self._fd, pickle.dumps(row, _PROTOCOL))
        except OSError as exc:
            if not self._failing:
                self._failing = True
                log.warning("cannot write the usage spool %s: %s", self._current, exc)
        else:
            self._failing = False

    async def seal(self) -> None:
        """Move on to a new segment (when the current one holds records): what is in
        memory now is all in sealed segments, deleted by :meth:`drop_sealed`."""
        if self._bytes == 0 or self._current is None:
            return
        fd, path = await trio.to_thread.run_sync(self._new_segment)
        old, self._fd = self._fd, fd
        self._sealed.append(self._current)
        self._current, self._bytes = path, 0
        await trio.to_thread.run_sync(os.close, old)

    async def drop_sealed(self) -> None:
        """Delete the sealed segments: their records are in the store."""
        sealed, self._sealed = self._sealed, []
        if sealed:
            await trio.to_thread.run_sync(_unlink, sealed)

    # -- blocking: in a worker thread ------------------------------------------------

    def open(self) -> None:
        """Create the folder, take this spool's lock and open its first segment."""
        self.folder.mkdir(parents=True, exist_ok=True)
        lock = self.folder / f"{self.name}.lock"
        lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._lock_fd = lock_fd
        self._fd, self._current = self._new_segment()

    def close(self, *, remove: bool) -> None:
        """Close the spool; ``remove`` (everything is stored) deletes its files too."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove:
            paths = [*self._sealed, *([self._current] if self._current else [])]
            _unlink([*paths, self.folder / f"{self.name}.lock"])
            self._sealed = []
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _new_segment(self) -> tuple[int, Path]:
        path = self.folder / f"{self.name}.{next(self._segments):06d}.spool"
        return os.open(path, _FLAGS, 0o600), path

    def orphans(self) -> list[Orphan]:
        """The spools in the folder whose owner is gone (their lock taken, now held)."""
        found = []
        for lock_path in sorted(self.folder.glob("*.lock")):
            name = lock_path.name.removesuffix(".lock")
            if name == self.name:
                continue
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:  # another controller replayed it meanwhile
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its controller runs
                os.close(fd)
                continue
            found.append(Orphan(self.folder, name, fd))
        return found


class Orphan:
    """A spool left by a controller that is gone, locked by this one while replayed."""

    def __init__(self, folder: Path, name: str, lock_fd: int) -> None:
        self.folder, self.name, self._lock_fd = folder, name, lock_fd
        self.segments = sorted(folder.glob(f"{_glob_escape(name)}.*.spool"))

    def rows(self, width: int) -> list[tuple[Any, ...]]:
        """Its records' rows (tuples of ``width`` plain values); the end of a segment
        after a record cut short by the kill, or anything else, is skipped."""
        rows = []
        for path in self.segments:
            data = io.BytesIO(path.read_bytes())
            while data.tell() < len(data.getbuffer()):
                try:
                    row = _Values(data).load()
                except Exception as exc:  # cut short or damaged: the rest is unreadable
                    log.warning("skipped the end of the usage spool %s: %r", path, exc)
                    break
                if isinstance(row, tuple) and len(row) == width:
                    rows.append(row)
                else:
                    log.warning("skipped a record of the usage spool %s: %r", path, row)
        return rows

    def remove(self) -> None:
        """Delete its segments, then its lock (so no one replays it again)."""
        _unlink([*self.segments, self.folder / f"{self.name}.lock"])
        os.close(self._lock_fd)

    def release(self) -> None:
        """Keep it for the next start (the store refused its records)."""
        os.close(self._lock_fd)


class _Values(pickle.Unpickler):
    """Loads plain values only: no class, no function, so nothing runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the usage spool holds values, not {module}.{name}")


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _unlink(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
