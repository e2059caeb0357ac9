"""Room on the blob store's disk: a full disk is refused with a code, never left full.

Blob bytes are written only while a *reserve* file (``<blobs>/reserve``, its size
the ``storage_reserve`` setting) holds room on the same file system. When a write
meets a full disk (``ENOSPC`` or a quota's ``EDQUOT``), the caller truncates the
partial back to its durable offset and :meth:`Reserve.release` gives the reserved
bytes back, so the store (the SQLite database beside the blobs) can still record,
and a deletion can still run, on a disk nothing else has room on. Blob writes are
refused (:class:`InsufficientStorage`) until the reserve can be made again, that is
until space has been freed. Deleting always releases the reserve first when the
disk is nearly full: freeing space must always work.

Everything here blocks (file-system calls): run it in a worker thread.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from ..base.errors import FiccError

#: The reserve's file name inside the blob directory.
RESERVE_NAME = "reserve"

_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class InsufficientStorage(FiccError):
    """The disk of the blob store is full: nothing written past the durable offset stays."""

    status = 507
    code = "insufficient_storage"


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system (or a quota) has no room left."""
    return isinstance(exc, OSError) and exc.errno in _FULL


def free_bytes(path: Path) -> int:
    """Bytes free to an unprivileged writer on the file system of ``path``."""
    return shutil.disk_usage(path).free


def storage_refusal(
    offset: int, size: int, free: int, *, doing: str = "this upload"
) -> InsufficientStorage:
    """The refusal of a write that met (or would meet) a full disk, resuming from ``offset``."""
    return InsufficientStorage(
        f"the disk holding the blob store is full ({free} bytes free), so {doing} stopped "
        f"at byte {offset} of {size}, which is kept. Free space (delete models no service "
        "uses with DELETE /api/v1/models/{id}?evict=true, or grow the disk), then resume "
        f"from offset {offset}.",
        details={"offset": offset, "size": size, "free": free},
    )


class Reserve:
    """A file of reserved bytes beside the blobs, given back when the disk fills.

    :param size: bytes to hold; 0 turns the reserve off (blob writes are then
        refused only by the disk itself).
    """

    def __init__(self, directory: Path, size: int) -> None:
        self.path = Path(directory) / RESERVE_NAME
        self.size = size
        #: Uploads run at once, each in a worker thread: one makes the reserve, the
        #: others find it made (they shared one temporary name and raced for it).
        self._making = threading.Lock()

    def held(self) -> bool:
        """Whether the reserve is in place (always true when it is off)."""
        if not self.size:
            return True
        try:
            return self.path.stat().st_size >= self.size
        except FileNotFoundError:
            return False

    def ensure(self) -> bool:
        """Make the reserve if it is missing; False when the disk has no room for it."""
        if self.held():
            return True
        with self._making:
            return self.held() or self._make()

    def _make(self) -> bool:
        # Controllers sharing the blob directory each make theirs under a name of their own.
        temporary = self.path.with_name(f"{RESERVE_NAME}.new.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _allocate(fd, self.size)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            temporary.unlink(missing_ok=True)
            if is_disk_full(exc):
                return False
            raise
        os.close(fd)
        os.replace(temporary, self.path)
        return True

    def release(self) -> bool:
        """Give the reserved bytes back to the disk; return whether there were any."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    def status(self) -> dict[str, Any]:
        """What the reserve holds (for logs and details)."""
        return {"reserve": self.size, "reserve_held": self.held()}


def _allocate(fd: int, size: int) -> None:
    """Allocate ``size`` real bytes to ``fd`` (not a sparse file: the blocks must be taken)."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    piece = b"\0" * (1 << 20)
    written = 0
    while written < size:
        written += os.pwrite(fd, piece[: size - written], written)
