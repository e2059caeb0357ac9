"""The bytes of a private partial file: writing them (blocking, for worker threads).

:class:`~ficc_core.models.blobs.BlobStore` decides what may be written and records
what is durable; this module only moves bytes. A :class:`PartialWriter` appends
from the partial's durable offset (truncating anything past it, which was never
acknowledged) and fsyncs on request. Hashing is :mod:`~ficc_core.base.digests`'
(:func:`~ficc_core.base.digests.hash_file` feeds a file's prefix to a hash, so that an
acquisition resumed at an offset goes on hashing from there).
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from .blob_records import PARTIAL, VERIFYING, FileRef, Partial

#: The most one buffered pwrite hands the kernel. Single writes of 1 MiB were 2-5x
#: slower to land in the page cache than 256 KiB ones on the 2-core VM of
#: docs/performance.md.
_WRITE_PIECE = 256 << 10

#: What a direct write's file offset, length and memory must be multiples of: a
#: page, which covers every logical block size Linux disks have (512 and 4096).
DIRECT_ALIGN = 4096


class PartialWriter:
    """Appends to a partial file from worker threads (blocking calls).

    Opening truncates the file to ``offset``, its durable offset: anything past it
    was never acknowledged. :meth:`write` appends; :meth:`sync` makes everything
    written before it durable and returns where that ends. One thread may write
    while another syncs. Nothing is recorded here: see
    :meth:`~ficc_core.models.blobs.BlobStore.commit`.
    """

    def __init__(self, path: Path, offset: int, size: int, *, direct: bool = False) -> None:
        self.size = size
        #: Where the next write lands.
        self.written = offset
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        #: A second descriptor of the same file for direct writes; None where the
        #: file system refuses them (tmpfs before Linux 6.6, some FUSE and network
        #: file systems), which then get buffered writes.
        self._direct: int | None = None
        try:
            os.ftruncate(self._fd, offset)
            if direct and hasattr(os, "O_DIRECT"):
                try:
                    self._direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
                except OSError:
                    self._direct = None
        except OSError:
            os.close(self._fd)
            raise

    @property
    def direct(self) -> bool:
        """Whether aligned writes go straight to the disk."""
        return self._direct is not None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``; never past the declared size.

        On a direct writer, where the file offset is a multiple of
        :data:`DIRECT_ALIGN` the whole multiples of it at the start of ``data`` are
        written directly: the caller passes memory that starts on a page (an
        ``mmap``'s, as :class:`~ficc_core.models.pipeline.Pipeline` gives). The rest
        (an unaligned start or end) goes through the page cache, as a writer that
        is not direct writes everything.
        """
        view = memoryview(data)
        if self.written + len(view) > self.size:
            raise OSError(f"a write ending at {self.written + len(view)} is past {self.size}")
        if self._direct is not None and not self.written % DIRECT_ALIGN:
            aligned = view[: len(view) - len(view) % DIRECT_ALIGN]
            view = view[self._write_direct(self._direct, aligned) :]
        while view:
            count = os.pwrite(self._fd, view[:_WRITE_PIECE], self.written)
            view = view[count:]
            self.written += count

    def _write_direct(self, direct: int, view: memoryview) -> int:
        """Write ``view`` (aligned) past the page cache through the descriptor ``direct``;
        return how much of it was written."""
        done = 0
        while done < len(view):
            try:
                count = os.pwrite(direct, view[done:], self.written)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # Opened but refused (an alignment this file system wants larger, or
                # memory that does not start on a page): buffered from here on.
                os.close(direct)
                self._direct = None
                return done
            done += count
            self.written += count
            if count % DIRECT_ALIGN:
                break  # a short write left the offset unaligned: buffered for the rest
        return done

    def sync(self) -> int:
        """fsync; return the end of what is now durable."""
        end = self.written
        os.fsync(self._fd)
        return end

    def cut_back(self, offset: int) -> None:
        """Truncate the file to ``offset`` (its durable offset): a write that failed
        part-way (a full disk) must not keep the blocks it took."""
        os.ftruncate(self._fd, offset)
        self.written = offset

    def close(self) -> None:
        """Close the file (what was not synced is not durable)."""
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        os.close(self._fd)


def partial_name(ref: FileRef) -> str:
    """The file name of one model file's private partial."""
    return f"{ref.sha256}.{ref.model_id}.{ref.index}.part"


def sweep_partials(
    directory: Path,
    recorded: Sequence[tuple[Partial, bool]],
    *,
    before: float = math.inf,
    updated: Mapping[tuple[str, int], float] | None = None,
    busy: Collection[tuple[str, int]] = (),
) -> tuple[list[FileRef], list[FileRef], list[FileRef]]:
    """Tidy the partial files against what the store recorded (blocking).

    ``recorded`` holds each partial with whether its content is verified meanwhile
    (:func:`~ficc_core.models.repository.list_partials`). Returns the files complete but not yet
    verified, those whose file lost bytes (shorter than the durable offset) and
    those verified meanwhile. A file of a partial taken over from before partials
    were private is renamed to its owner's name; a file no row owns is removed.

    Only idle partials are touched: one whose row was last written (``updated``, by
    model ID and index) or whose file was last modified after ``before``, or that is
    ``busy`` here, may be in the middle of an upload or a verification through this
    or another controller sharing the directory, and is left alone; so is a file no
    row owns yet that was modified after ``before`` (a first write under way).
    """
    complete, lost, done = [], [], []
    owned = set()
    updated = updated or {}
    for partial, verified in recorded:
        ref, durable_offset = partial.ref, partial.durable_offset
        path = directory / partial_name(ref)
        owned.add(path.name)
        key = (ref.model_id, ref.index)
        if key in busy or updated.get(key, -math.inf) > before or _modified(path) > before:
            continue
        if verified:
            done.append(ref)
            continue
        legacy = directory / f"{ref.sha256}.part"
        if durable_offset and not path.exists() and legacy.exists():
            os.replace(legacy, path)
        held = path.stat().st_size if path.exists() else 0
        if held < durable_offset:
            lost.append(ref)
        elif durable_offset == ref.size and partial.state in (PARTIAL, VERIFYING):
            complete.append(ref)
    for name in os.listdir(directory):
        if name not in owned and _modified(directory / name) <= before:
            (directory / name).unlink(missing_ok=True)
    return complete, lost, done


def _modified(path: Path) -> float:
    """When ``path`` was last written (-inf when it is gone)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return -math.inf
