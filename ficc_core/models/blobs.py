"""The content-addressed blob store: private partials with durable offsets, shared verified blobs.

Layout under ``<data_dir>/blobs``::

    sha256/<hex>                          published: its content was verified against <hex>
    partial/<hex>.<model>.<index>.part    being filled for one file of one model

A partial belongs to the model file that fills it (by uploads or an acquisition):
no other model, in this project or another, reads or writes it, so nobody can
spoil or observe another's progress. Content is shared only once verified: a
published blob serves every model that declares its sha256.

A write lands in the partial file, is fsynced, and only then is its end recorded
in the store as the partial's ``durable_offset``. Bytes past the durable offset
(a write interrupted by a crash) are never trusted: the next write truncates them.
Publishing checks the sha256 of the whole partial (hashed in a worker thread, or
by an acquisition as it was received: :mod:`~ficc_core.models.download`) and
renames it into place only when it matches, so nothing is ever published
unverified. The bytes themselves are written by :mod:`~ficc_core.models.partials`
and hashed by :mod:`~ficc_core.base.digests`; the records this store returns (and its
errors) are in :mod:`~ficc_core.models.blob_records`, its rows are read and
written by :mod:`~ficc_core.models.repository`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ..base.digests import assemble_tree, hash_file, rename_durably, sha256_file, tree_listing
from ..base.errors import Conflict, FiccError, InvalidRequest, NotFound
from ..store import Store, Transaction
from ..store.outage import is_store_failure
from . import repository
from .blob_records import (
    FAILED,
    PARTIAL,
    VERIFIED,
    VERIFYING,
    BlobState,
    BlobStatus,
    DigestMismatch,
    FileRef,
    FileVerified,
    OffsetMismatch,
    Partial,
    error_record,
)
from .partials import PartialWriter, partial_name, sweep_partials
from .space import InsufficientStorage, Reserve, free_bytes, is_disk_full, storage_refusal

log = logging.getLogger("ficc.models.blobs")

#: Seconds between the touches that keep a partial being verified live (see
#: :meth:`BlobStore.recover`); the idle bound of tidying must be well above it.
HEARTBEAT = 30.0

#: Free bytes under which a store write that failed is put down to a full disk.
_NEARLY_FULL = 1 << 20


class BlobStore:
    """Blobs on disk plus their rows in the :class:`~ficc_core.store.Store`."""

    def __init__(
        self, root: Path, store: Store, *, hash_threads: int = 2, reserve: int = 0
    ) -> None:
        self.root = Path(root)
        self.store = store
        self._published = self.root / "sha256"
        self._partial = self.root / "partial"
        self._published.mkdir(parents=True, exist_ok=True)
        self._partial.mkdir(parents=True, exist_ok=True)
        self._hash_limiter = trio.CapacityLimiter(hash_threads)
        self._io_limiter = trio.CapacityLimiter(4)
        self._locks: dict[tuple[str, int], trio.Lock] = {}
        #: Room held on the blobs' disk for the store and deletions (:mod:`.space`),
        #: taken by the first blob write (a controller that writes none holds none).
        self.reserve = Reserve(self.root, reserve)

    # -- paths and rows ---------------------------------------------------------

    def published_path(self, sha256: str) -> Path:
        """Where a verified blob lives."""
        return self._published / sha256

    def partial_path(self, ref: FileRef) -> Path:
        """Where the private partial of one model file lives."""
        return self._partial / partial_name(ref)

    def tree_path(self, files: Mapping[str, tuple[str, int]]) -> Path:
        """Where the directory model made of ``files`` (path -> (sha256, size)) is assembled."""
        return self.root / "trees" / tree_listing(files)[1]

    async def assemble_tree(self, files: Mapping[str, tuple[str, int]]) -> Path:
        """Assemble a directory model from published blobs (hard links); return its root.

        Every blob must be published (verified). The same files give the same tree,
        built once; engines on this machine read it in place, as they read a GGUF blob.
        """
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

    def lock(self, ref: FileRef) -> trio.Lock:
        """The lock that serialises every write and verification of one model file."""
        key = (ref.model_id, ref.index)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = trio.Lock()
        return lock

    @staticmethod
    def ensure_row(tx: Transaction, sha256: str, size: int, *, published: bool) -> None:
        """Record a blob a manifest declares (inside the registering transaction)."""
        known = repository.find_blob(tx, sha256)
        if known is not None:
            if known.size != size:
                raise Conflict(
                    f"blob {sha256} is already known with size {known.size}, not {size}",
                    code="blob_size_conflict",
                    details={"sha256": sha256, "known_size": known.size, "declared": size},
                )
            if published and not known.verified:
                repository.mark_blob_verified(tx, sha256, now=time.time())
            return
        blob = (
            BlobStatus(sha256, size, VERIFIED, size)
            if published
            else BlobStatus(sha256, size, PARTIAL, 0)
        )
        repository.insert_blob(tx, blob, now=time.time())

    async def status(self, ref: FileRef) -> BlobStatus:
        """Return the file's status: verified content, else its own partial's."""
        status = await self.store.read(lambda tx: repository.file_status(tx, ref))
        if status is None:
            raise FiccError(f"blob {ref.sha256} is not recorded", code="blob_unknown", status=404)
        return status

    async def _record(
        self, ref: FileRef, state: BlobState, durable_offset: int, error: FiccError | None = None
    ) -> BlobStatus:
        partial = Partial(
            ref, state, durable_offset, None if error is None else error_record(error)
        )
        # Only while the model file exists: a model deleted during a write leaves
        # nothing behind (its file is swept on the next start).
        now = time.time()
        if not await self.store.write(lambda tx: repository.record_partial(tx, partial, now=now)):
            raise NotFound(
                f"model {ref.model_id!r} was deleted",
                code="model_not_found",
                details={"id": ref.model_id},
            )
        return partial.status

    # -- writing ----------------------------------------------------------------

    async def write(self, ref: FileRef, offset: int, data: bytes) -> BlobStatus:
        """Append ``data`` at ``offset``, which must be the durable offset; fsync; record it.

        The caller holds :meth:`lock`. Returns the new status. Content verified in the
        meantime (through another model) raises :class:`FileVerified`; the partial,
        useless now, is discarded.
        """
        current = await self._writable(ref, offset)
        end = offset + len(data)
        if end > current.size:
            raise InvalidRequest(
                f"this write would end at byte {end}, beyond the declared size {current.size}",
                code="beyond_declared_size",
                details={"offset": current.durable_offset, "size": current.size},
            )
        path = self.partial_path(ref)
        await self._need_room(offset, current.size)

        def append() -> None:
            writer = PartialWriter(path, offset, current.size)
            try:
                writer.write(data)
                writer.sync()
            except OSError as exc:
                if is_disk_full(exc):
                    writer.cut_back(offset)  # give the disk back what this write took
                raise
            finally:
                writer.close()

        try:
            await trio.to_thread.run_sync(append, limiter=self._io_limiter)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise await self.disk_full(offset, current.size) from None
        return await self._record_durable(ref, end)

    # -- room on the disk (see ficc_core.models.space) ---------------------------

    async def _need_room(self, offset: int, size: int, *, doing: str = "this upload") -> None:
        """Refuse a blob write while the reserve cannot be held (the disk is still full)."""
        if not await trio.to_thread.run_sync(self.reserve.ensure, limiter=self._io_limiter):
            free = await trio.to_thread.run_sync(free_bytes, self.root)
            raise storage_refusal(offset, size, free, doing=doing)

    async def disk_full(
        self, offset: int, size: int, *, doing: str = "this upload"
    ) -> InsufficientStorage:
        """A write met a full disk: give the reserve back (so the store can still write
        and deletions run) and return the refusal, resuming from ``offset``."""
        released = await trio.to_thread.run_sync(self.reserve.release)
        free = await trio.to_thread.run_sync(free_bytes, self.root)
        log.warning(
            "the disk of the blob store is full: %s stopped at its durable offset %d of %d "
            "(%s; %d bytes free); blob writes are refused until space is freed",
            doing,
            offset,
            size,
            "reserve released" if released else "no reserve was held",
            free,
        )
        return storage_refusal(offset, size, free, doing=doing)

    async def make_room(self) -> None:
        """Before a deletion's store write: on a nearly full disk, release the reserve.

        Freeing space must always work, and the store's write (a SQLite journal beside
        the blobs) needs room first. The reserve is made again by the next blob write.
        """
        size = self.reserve.size
        if size and await trio.to_thread.run_sync(free_bytes, self.root) < size:
            await trio.to_thread.run_sync(self.reserve.release)

    async def cut_back(self, ref: FileRef) -> int:
        """Truncate the file's partial to its recorded durable offset; return that offset.

        After a write that met a full disk: the bytes past the durable offset were
        never acknowledged, and keeping them would keep the disk full.
        """
        offset = (await self.status(ref)).durable_offset
        path = self.partial_path(ref)

        def truncate() -> None:
            try:
                if path.stat().st_size > offset:
                    os.truncate(path, offset)
            except FileNotFoundError:
                pass

        await trio.to_thread.run_sync(truncate, limiter=self._io_limiter)
        return offset

    async def _unverified(self, ref: FileRef) -> BlobStatus:
        current = await self.status(ref)
        if current.verified:
            await self.discard(ref)
            raise FileVerified(
                f"the content of this file (sha256 {ref.sha256}) is already verified",
                details={"offset": current.size},
            )
        return current

    async def _writable(self, ref: FileRef, offset: int) -> BlobStatus:
        current = await self._unverified(ref)
        if offset != current.durable_offset:
            raise OffsetMismatch(
                f"writes must start at the durable offset {current.durable_offset}, not {offset}",
                details={"offset": current.durable_offset},
            )
        return current

    async def _record_durable(self, ref: FileRef, end: int) -> BlobStatus:
        """Record ``end``, just fsynced, as the durable offset (unless the model is gone)."""
        try:
            return await self._record(ref, PARTIAL, end)
        except NotFound:
            path = self.partial_path(ref)
            await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
            raise
        except Exception as exc:
            # The partial took the last free bytes before the store (a SQLite file
            # beside the blobs) could record them: the same full disk.
            if not is_store_failure(exc) or not await self._disk_nearly_full():
                raise
            durable = await self.cut_back(ref)
            raise await self.disk_full(durable, ref.size) from exc

    async def _disk_nearly_full(self) -> bool:
        return await trio.to_thread.run_sync(free_bytes, self.root) < _NEARLY_FULL

    @asynccontextmanager
    async def open_writer(self, ref: FileRef, offset: int) -> AsyncIterator[PartialWriter]:
        """Open the file's partial to stream into from ``offset``, its durable offset.

        For a writer that appends many pieces from a worker thread (an acquisition):
        what it writes becomes durable, and is recorded, only through :meth:`commit`.
        The caller holds :meth:`lock` throughout.
        """
        await self._writable(ref, offset)
        await self._need_room(offset, ref.size, doing="this acquisition")
        writer = await trio.to_thread.run_sync(
            functools.partial(PartialWriter, self.partial_path(ref), offset, ref.size, direct=True),
            limiter=self._io_limiter,
        )
        try:
            yield writer
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(writer.close)

    async def commit(self, ref: FileRef, writer: PartialWriter) -> int:
        """fsync what ``writer`` has written, then record its end as the durable offset.

        Content verified meanwhile (through another model) raises :class:`FileVerified`
        and a model deleted meanwhile ``model_not_found``; either way the partial is gone.
        """
        end = await trio.to_thread.run_sync(writer.sync, limiter=self._io_limiter)
        await self._unverified(ref)
        await self._record_durable(ref, end)
        return end

    async def partial_digest(self, ref: FileRef, length: int) -> Any:
        """Return a sha256 object fed the first ``length`` bytes of the file's partial."""
        if not length:
            return hashlib.sha256()
        return await trio.to_thread.run_sync(
            hash_file,
            hashlib.sha256(),
            self.partial_path(ref),
            length,
            limiter=self._hash_limiter,
        )

    async def reset(self, ref: FileRef, error: FiccError | None = None) -> None:
        """Discard the file's partial (offset back to 0), recording ``error`` as failed if given."""
        path = self.partial_path(ref)
        await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        await self._record(ref, PARTIAL if error is None else FAILED, 0, error)

    async def mark_failed(self, ref: FileRef, error: FiccError, *, discard: bool = False) -> None:
        """Record why filling a file failed; ``discard`` also drops its partial bytes."""
        if discard:
            await self.reset(ref, error)
        else:
            current = await self.status(ref)
            await self._record(ref, FAILED, current.durable_offset, error)

    async def discard(self, ref: FileRef) -> None:
        """Forget the file's partial: its bytes and its row (the model is gone, or verified)."""
        path = self.partial_path(ref)
        await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        await self.store.write(lambda tx: repository.delete_partial(tx, ref))
        lock = self._locks.get((ref.model_id, ref.index))
        if lock is not None and not lock.locked():
            del self._locks[(ref.model_id, ref.index)]

    async def verify_and_publish(self, ref: FileRef, *, digest: str | None = None) -> BlobStatus:
        """Hash the full-length partial off the event loop and publish it if it matches.

        The caller holds :meth:`lock`. On a mismatch the partial file is discarded,
        the file is marked failed with the reason, and :class:`DigestMismatch` is raised.
        Once started, verification finishes even if the caller is cancelled (a pause,
        a client hanging up), so a file is never left half-way between states.

        :param digest: the hex sha256 of the file's bytes as the caller wrote them,
            every one, in this lock (an acquisition hashes while it receives): then
            the file is not read again.
        """
        with trio.CancelScope(shield=True):
            status = await self._verify_and_publish(ref, digest)
        return status

    async def _verify_and_publish(self, ref: FileRef, digest: str | None) -> BlobStatus:
        current = await self.status(ref)
        if current.verified:
            await self.discard(ref)
            return current
        if current.durable_offset != current.size:
            raise Conflict(
                f"this file has {current.durable_offset} of {current.size} bytes; "
                "it can be verified only when complete",
                code="file_incomplete",
                details={"offset": current.durable_offset, "size": current.size},
            )
        await self._record(ref, VERIFYING, current.size)
        path = self.partial_path(ref)
        if current.size == 0:
            await trio.to_thread.run_sync(path.touch)
        try:
            actual = digest or await self._hash_live(path, current.size)
        except OSError as exc:
            error = FiccError(f"the partial file could not be read: {exc}", code="blob_unreadable")
            await self.reset(ref, error)
            raise error from None
        if actual != ref.sha256:
            mismatch = DigestMismatch(
                f"the content hashes to sha256 {actual}, not the declared {ref.sha256}",
                details={"expected": ref.sha256, "actual": actual},
            )
            await self.reset(ref, mismatch)
            raise mismatch
        await self._publish(ref, path)
        return BlobStatus(ref.sha256, ref.size, VERIFIED, ref.size)

    async def _hash_live(self, path: Path, size: int) -> str:
        """Hash the partial, touching its file meanwhile so that it stays live.

        A long verification writes nothing: the touches (every :data:`HEARTBEAT`
        seconds) tell another controller's tidying that it is under way.
        """
        async with trio.open_nursery() as nursery:

            async def heartbeat() -> None:
                while True:
                    await trio.sleep(HEARTBEAT)
                    await trio.to_thread.run_sync(_touch, path)

            nursery.start_soon(heartbeat)
            try:
                return await trio.to_thread.run_sync(
                    sha256_file, path, size, limiter=self._hash_limiter
                )
            finally:
                nursery.cancel_scope.cancel()

    async def _publish(self, ref: FileRef, path: Path) -> None:
        # Published through another model meanwhile: the same bytes, kept.
        target = self.published_path(ref.sha256)
        await trio.to_thread.run_sync(lambda: rename_durably(path, target, unless_present=True))

        now = time.time()

        def write(tx: Transaction) -> list[FileRef]:
            repository.mark_blob_verified(tx, ref.sha256, now=now)
            repository.delete_partial(tx, ref)
            return repository.partials_of(tx, ref.sha256)

        others = await self.store.write(write)
        # Other models' partials of this content are useless now. One busy with a write
        # (its lock held) discards its own when it next looks; never wait for it here.
        for other in others:
            lock = self.lock(other)
            if not lock.locked():
                async with lock:
                    await self.discard(other)

    async def is_published(self, sha256: str) -> bool:
        """Whether a verified file for ``sha256`` exists on disk."""
        return await trio.to_thread.run_sync(self.published_path(sha256).is_file)

    async def remove(self, sha256: str) -> None:
        """Delete a blob's published file and row (the caller checked nothing references it)."""
        await trio.to_thread.run_sync(lambda: self.published_path(sha256).unlink(missing_ok=True))
        await self.store.write(lambda tx: repository.delete_blob(tx, sha256))

    async def recover(self, *, idle: float = 0.0) -> list[FileRef]:
        """Tidy the partials; return the complete ones that still need verifying.

        A partial that holds every byte but is not verified was cut by a crash between
        its last write and verification, or during verification: the caller verifies
        those. Partials of content verified meanwhile are removed, and one whose file
        lost bytes starts over (see :func:`~ficc_core.models.partials.sweep_partials`).

        :param idle: touch only partials neither written (row or file) nor locked here
            for this many seconds: an upload or verification under way through another
            controller sharing the blob directory is left alone. 0: every one (a lone
            controller's start).
        """
        now = time.time()

        def read(tx: Transaction) -> Any:
            return repository.list_partials(tx), repository.partial_updates(tx)

        recorded, updated = await self.store.read(read)
        busy = {key for key, lock in self._locks.items() if lock.locked()}
        complete, lost, done = await trio.to_thread.run_sync(
            functools.partial(
                sweep_partials,
                self._partial,
                recorded,
                before=now - idle if idle else math.inf,
                updated=updated,
                busy=busy,
            )
        )
        log.info(
            "tidied the partials idle over %gs: %d complete to verify, %d lost bytes, "
            "%d verified meanwhile",
            idle,
            len(complete),
            len(lost),
            len(done),
        )
        for ref in lost:
            async with self.lock(ref):
                await self.reset(ref)
        for ref in done:
            async with self.lock(ref):
                await self.discard(ref)
        return complete


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except FileNotFoundError:
        pass
