"""The bytes of a private partial file: writing and hashing them (blocking, for worker threads).

:class:`~ficc_core.models.blobs.BlobStore` decides what may be written and records
what is durable; this module only moves bytes. A :class:`PartialWriter` appends
from the partial's durable offset (truncating anything past it, which was never
acknowledged) and fsyncs on request; :func:`hash_file` feeds a file's prefix to a
hash, so that an acquisition resumed at an offset goes on hashing from there.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HASH_CHUNK = 1 << 20
#: The most one pwrite hands the kernel. Single writes of 1 MiB were 2-5x slower to
#: land in the page cache than 256 KiB ones on the 2-core VM of docs/performance.md.
_WRITE_PIECE = 256 << 10


def sha256_file(path: Path, length: int, progress: Callable[[int], None] | None = None) -> str:
    """Return the hex sha256 of the first ``length`` bytes of ``path`` (blocking)."""
    return hash_file(hashlib.sha256(), path, length, progress).hexdigest()


def hash_file(
    digest: Any, path: Path, length: int, progress: Callable[[int], None] | None = None
) -> Any:
    """Feed the first ``length`` bytes of ``path`` to the hashlib object ``digest``; return it."""
    remaining = length
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(_HASH_CHUNK)
        view = memoryview(buffer)
        while remaining > 0:
            read = handle.readinto(view[: min(_HASH_CHUNK, remaining)])
            if not read:
                break
            digest.update(view[:read])
            remaining -= read
            if progress is not None:
                progress(length - remaining)
    if remaining:
        raise OSError(f"{path} is shorter than {length} bytes")
    return digest


class PartialWriter:
    """Appends to a partial file from worker threads (blocking calls).

    Opening truncates the file to ``offset``, its durable offset: anything past it
    was never acknowledged. :meth:`write` appends; :meth:`sync` makes everything
    written before it durable and returns where that ends. One thread may write
    while another syncs. Nothing is recorded here: see
    :meth:`~ficc_core.models.blobs.BlobStore.commit`.
    """

    def __init__(self, path: Path, offset: int, size: int) -> None:
        self.size = size
        #: Where the next write lands.
        self.written = offset
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            os.ftruncate(self._fd, offset)
        except OSError:
            os.close(self._fd)
            raise

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``; never past the declared size."""
        view = memoryview(data)
        if self.written + len(view) > self.size:
            raise OSError(f"a write ending at {self.written + len(view)} is past {self.size}")
        while view:
            count = os.pwrite(self._fd, view[:_WRITE_PIECE], self.written)
            view = view[count:]
            self.written += count

    def sync(self) -> int:
        """fsync; return the end of what is now durable."""
        end = self.written
        os.fsync(self._fd)
        return end

    def close(self) -> None:
        """Close the file (what was not synced is not durable)."""
        os.close(self._fd)
