"""The content-addressed blob store: partial files with durable offsets, verified publishing.

Layout under ``<data_dir>/blobs``::

    sha256/<hex>          published: its content was verified against <hex>
    partial/<hex>.part    being filled by an acquisition or uploads

A write lands in the partial file, is fsynced, and only then is its end recorded
in the store as the blob's ``durable_offset``. Bytes past the durable offset (a
write interrupted by a crash) are never trusted: the next write truncates them.
Publishing hashes the whole partial file in a worker thread and renames it into
place only when the digest matches, so nothing is ever published unverified.
Blobs are shared by every project; a row in ``blobs`` tracks each one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from ..errors import Conflict, FiccError, InvalidRequest
from ..store import Store, Transaction

#: Blob states, as stored and reported.
PARTIAL, VERIFYING, VERIFIED, FAILED = "partial", "verifying", "verified", "failed"

_HASH_CHUNK = 1 << 20
#: The most one pwrite hands the kernel. Single writes of 1 MiB were 2-5x slower to
#: land in the page cache than 256 KiB ones on the 2-core VM of docs/performance.md.
_WRITE_PIECE = 256 << 10


class DigestMismatch(FiccError):
    """The bytes of a complete file do not hash to the declared sha256."""

    status = 422
    code = "digest_mismatch"


class OffsetMismatch(Conflict):
    """A write did not start at the blob's durable offset."""

    code = "offset_mismatch"


@attrs.frozen
class BlobStatus:
    """What the store knows of one blob."""

    sha256: str
    size: int
    state: str
    durable_offset: int
    reason: str | None = None

    @property
    def verified(self) -> bool:
        """Whether the blob is published."""
        return self.state == VERIFIED


def _status(row: dict[str, Any]) -> BlobStatus:
    return BlobStatus(
        sha256=row["sha256"],
        size=row["size"],
        state=row["state"],
        durable_offset=row["durable_offset"],
        reason=row["reason"],
    )


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
    while another syncs. Nothing is recorded here: see :meth:`BlobStore.commit`.
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


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobStore:
    """Blobs on disk plus their rows in the :class:`~ficc_core.store.Store`."""

    def __init__(self, root: Path, store: Store, *, hash_threads: int = 2) -> None:
        self.root = Path(root)
        self.store = store
        self._published = self.root / "sha256"
        self._partial = self.root / "partial"
        self._published.mkdir(parents=True, exist_ok=True)
        self._partial.mkdir(parents=True, exist_ok=True)
        self._hash_limiter = trio.CapacityLimiter(hash_threads)
        self._io_limiter = trio.CapacityLimiter(4)
        self._locks: dict[str, trio.Lock] = {}

    # -- paths and rows ---------------------------------------------------------

    def published_path(self, sha256: str) -> Path:
        """Where a verified blob lives."""
        return self._published / sha256

    def partial_path(self, sha256: str) -> Path:
        """Where a blob being filled lives."""
        return self._partial / f"{sha256}.part"

    def tree_path(self, files: Mapping[str, tuple[str, int]]) -> Path:
        """Where the directory model made of ``files`` (path -> (sha256, size)) is assembled."""
        from ..agent.staging import tree_listing

        return self.root / "trees" / tree_listing(files)[1]

    async def assemble_tree(self, files: Mapping[str, tuple[str, int]]) -> Path:
        """Assemble a directory model from published blobs (hard links); return its root.

        Every blob must be published (verified). The same files give the same tree,
        built once; engines on this machine read it in place, as they read a GGUF blob.
        """
        from ..agent.staging import assemble_tree, tree_listing

        listing, name = tree_listing(files)
        root = self.root / "trees" / name
        if await trio.to_thread.run_sync(root.is_dir):
            return root
        sources = {}
        for path, sha256, _size in listing:
            source = self.published_path(sha256)
            if not await trio.to_thread.run_sync(source.is_file):
                raise FiccError(
                    f"the model file {path} (sha256 {sha256}) is not in the blob store",
                    code="blob_missing",
                    status=409,
                )
            sources[path] = source
        await trio.to_thread.run_sync(lambda: root.parent.mkdir(parents=True, exist_ok=True))
        await trio.to_thread.run_sync(assemble_tree, root, sources)
        return root

    async def remove_tree(self, files: Mapping[str, tuple[str, int]]) -> None:
        """Remove the assembled tree of ``files``, if there is one."""
        root = self.tree_path(files)
        await trio.to_thread.run_sync(lambda: shutil.rmtree(root, ignore_errors=True))

    def lock(self, sha256: str) -> trio.Lock:
        """The lock that serialises every write and verification of one blob."""
        lock = self._locks.get(sha256)
        if lock is None:
            lock = self._locks[sha256] = trio.Lock()
        return lock

    @staticmethod
    def ensure_row(tx: Transaction, sha256: str, size: int, *, published: bool) -> None:
        """Record a blob a manifest declares (inside the registering transaction)."""
        row = tx.fetch_one("SELECT size, state FROM blobs WHERE sha256 = ?", (sha256,))
        if row is not None:
            if row["size"] != size:
                raise Conflict(
                    f"blob {sha256} is already known with size {row['size']}, not {size}",
                    code="blob_size_conflict",
                    details={"sha256": sha256, "known_size": row["size"], "declared": size},
                )
            if published and row["state"] != VERIFIED:
                tx.execute(
                    "UPDATE blobs SET state = ?, durable_offset = size, reason = NULL,"
                    " updated_at = ? WHERE sha256 = ?",
                    (VERIFIED, time.time(), sha256),
                )
            return
        tx.execute(
            "INSERT INTO blobs (sha256, size, state, durable_offset, updated_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                sha256,
                size,
                VERIFIED if published else PARTIAL,
                size if published else 0,
                time.time(),
            ),
        )

    async def status(self, sha256: str) -> BlobStatus:
        """Return the blob's row."""
        row = await self.store.read(
            lambda tx: tx.fetch_one("SELECT * FROM blobs WHERE sha256 = ?", (sha256,))
        )
        if row is None:
            raise FiccError(f"blob {sha256} is not recorded", code="blob_unknown", status=404)
        return _status(row)

    async def _set(self, sha256: str, **fields: Any) -> None:
        assignments = ", ".join(f"{name} = ?" for name in fields)

        def write(tx: Transaction) -> None:
            tx.execute(
                f"UPDATE blobs SET {assignments}, updated_at = ? WHERE sha256 = ?",
                (*fields.values(), time.time(), sha256),
            )

        await self.store.write(write)

    # -- writing ----------------------------------------------------------------

    async def write(self, sha256: str, offset: int, data: bytes) -> BlobStatus:
        """Append ``data`` at ``offset``, which must be the durable offset; fsync; record it.

        The caller holds :meth:`lock`. Returns the new status.
        """
        current = await self.status(sha256)
        if current.verified:
            raise Conflict(
                f"blob {sha256} is already verified",
                code="file_verified",
                details={"offset": current.size},
            )
        if offset != current.durable_offset:
            raise OffsetMismatch(
                f"writes must start at the durable offset {current.durable_offset}, not {offset}",
                details={"offset": current.durable_offset},
            )
        end = offset + len(data)
        if end > current.size:
            raise InvalidRequest(
                f"this write would end at byte {end}, beyond the declared size {current.size}",
                code="beyond_declared_size",
                details={"offset": current.durable_offset, "size": current.size},
            )
        path = self.partial_path(sha256)

        def append() -> None:
            writer = PartialWriter(path, offset, current.size)
            try:
                writer.write(data)
                writer.sync()
            finally:
                writer.close()

        await trio.to_thread.run_sync(append, limiter=self._io_limiter)
        await self._set(sha256, durable_offset=end, state=PARTIAL, reason=None)
        return attrs.evolve(current, durable_offset=end, state=PARTIAL, reason=None)

    @asynccontextmanager
    async def open_writer(self, sha256: str, offset: int) -> AsyncIterator[PartialWriter]:
        """Open the blob's partial file to stream into from ``offset``, its durable offset.

        For a writer that appends many pieces from a worker thread (an acquisition):
        what it writes becomes durable, and is recorded, only through :meth:`commit`.
        The caller holds :meth:`lock` throughout.
        """
        current = await self.status(sha256)
        if current.verified or offset != current.durable_offset:
            raise OffsetMismatch(
                f"blob {sha256} is {current.state} at {current.durable_offset}, not at {offset}",
                details={"offset": current.durable_offset},
            )
        writer = await trio.to_thread.run_sync(
            PartialWriter, self.partial_path(sha256), offset, current.size, limiter=self._io_limiter
        )
        try:
            yield writer
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(writer.close)

    async def commit(self, sha256: str, writer: PartialWriter) -> int:
        """fsync what ``writer`` has written, then record its end as the durable offset."""
        end = await trio.to_thread.run_sync(writer.sync, limiter=self._io_limiter)
        await self._set(sha256, durable_offset=end, state=PARTIAL, reason=None)
        return end

    async def partial_digest(self, sha256: str, length: int) -> Any:
        """Return a sha256 object fed the first ``length`` bytes of the partial file."""
        if not length:
            return hashlib.sha256()
        return await trio.to_thread.run_sync(
            hash_file,
            hashlib.sha256(),
            self.partial_path(sha256),
            length,
            limiter=self._hash_limiter,
        )

    async def reset(self, sha256: str, reason: str | None = None) -> None:
        """Discard a partial blob (offset back to 0), recording ``reason`` as failed if given."""
        path = self.partial_path(sha256)
        await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        if reason is None:
            await self._set(sha256, durable_offset=0, state=PARTIAL, reason=None)
        else:
            await self._set(sha256, durable_offset=0, state=FAILED, reason=reason)

    async def mark_failed(self, sha256: str, reason: str, *, discard: bool = False) -> None:
        """Record why filling a blob failed; ``discard`` also drops its partial bytes."""
        if discard:
            await self.reset(sha256, reason)
        else:
            await self._set(sha256, state=FAILED, reason=reason)

    async def verify_and_publish(self, sha256: str, *, digest: str | None = None) -> BlobStatus:
        """Hash the full-length partial file off the event loop and publish it if it matches.

        The caller holds :meth:`lock`. On a mismatch the partial file is discarded,
        the blob is marked failed with the reason, and :class:`DigestMismatch` is raised.
        Once started, verification finishes even if the caller is cancelled (a pause,
        a client hanging up), so a blob is never left half-way between states.

        :param digest: the hex sha256 of the file's bytes as the caller wrote them,
            every one, in this lock (an acquisition hashes while it receives): then
            the file is not read again.
        """
        with trio.CancelScope(shield=True):
            return await self._verify_and_publish(sha256, digest)

    async def _verify_and_publish(self, sha256: str, digest: str | None) -> BlobStatus:
        current = await self.status(sha256)
        if current.verified:
            return current
        if current.durable_offset != current.size:
            raise Conflict(
                f"blob {sha256} has {current.durable_offset} of {current.size} bytes; "
                "it can be verified only when complete",
                code="file_incomplete",
                details={"offset": current.durable_offset},
            )
        await self._set(sha256, state=VERIFYING)
        path = self.partial_path(sha256)
        if current.size == 0:
            await trio.to_thread.run_sync(path.touch)
        try:
            actual = digest or await trio.to_thread.run_sync(
                sha256_file, path, current.size, limiter=self._hash_limiter
            )
        except OSError as exc:
            await self.reset(sha256, f"the partial file could not be read: {exc}")
            raise FiccError(
                f"blob {sha256} could not be verified: {exc}", code="blob_unreadable"
            ) from None
        if actual != sha256:
            reason = f"the content hashes to sha256 {actual}, not the declared {sha256}"
            await self.reset(sha256, reason)
            raise DigestMismatch(reason, details={"expected": sha256, "actual": actual})

        def publish() -> None:
            os.replace(path, self.published_path(sha256))
            _fsync_directory(self._published)

        await trio.to_thread.run_sync(publish)
        await self._set(sha256, state=VERIFIED, durable_offset=current.size, reason=None)
        return attrs.evolve(current, state=VERIFIED, durable_offset=current.size, reason=None)

    async def is_published(self, sha256: str) -> bool:
        """Whether a verified file for ``sha256`` exists on disk."""
        return await trio.to_thread.run_sync(self.published_path(sha256).is_file)

    async def remove(self, sha256: str) -> None:
        """Delete a blob's files and row (the caller checked nothing references it)."""

        def unlink() -> None:
            self.published_path(sha256).unlink(missing_ok=True)
            self.partial_path(sha256).unlink(missing_ok=True)

        await trio.to_thread.run_sync(unlink)
        await self.store.write(
            lambda tx: tx.execute("DELETE FROM blobs WHERE sha256 = ?", (sha256,))
        )
        self._locks.pop(sha256, None)
