"""Receiving one response body into a model file's private partial, fast and durably.

A worker thread reads the body straight into 1 MiB buffers (blocking TLS reads,
no event loop in the way); two more threads feed each buffer to the file's sha256
and write it to the partial, in order (:mod:`~ficc_core.models.pipeline`), past
the page cache where the file system allows (direct writes, see
:class:`~ficc_core.models.partials.PartialWriter`).
Meanwhile a task on the event loop makes those bytes durable: once
:data:`SYNC_BYTES` are written past the durable offset it fsyncs, and only then
records the end of what the fsync covered as the partial's durable offset. The
thread goes on receiving during the fsync (one fsync covers whatever was written
before it began, so a disk with slow flushes gets fewer, larger ones, never an
unsynced offset), and waits when :data:`MAX_UNSYNCED` bytes are written past
the durable offset: that bounds what a crash can lose (it is fetched again from
the durable offset).

Whatever the thread has received is written before it stops: at the body's end,
when the connection drops or times out, and when the caller is cancelled (a
pause aborts the connection, and the bytes that arrived before are kept), and
every byte written is made durable before :func:`receive_into_blob` returns or
raises.
"""

from __future__ import annotations

import threading
from typing import Any

import outcome
import trio

from ..base.errors import FiccError
from ..http1.client import Http1Connection
from .blob_records import FileRef
from .blobs import BlobStore
from .fetch import FetchError, Response
from .partials import DIRECT_ALIGN, PartialWriter
from .pipeline import Pipeline
from .space import is_disk_full

#: Bytes read from the connection per write to the partial file.
READ_BYTES = 1 << 20
#: Bytes written past the durable offset that start an fsync (fewer only at the end).
SYNC_BYTES = 4 << 20
#: Bytes written past the durable offset before receiving waits for an fsync to end.
MAX_UNSYNCED = 16 << 20


class _Stopped(Exception):
    """The task making bytes durable failed; the receiving thread stops."""


class _Progress:
    """What the receiving thread and the task that makes its bytes durable share."""

    def __init__(self, offset: int) -> None:
        self._changed = threading.Condition()
        self._token = trio.lowlevel.current_trio_token()
        self.written = offset
        self.durable = offset
        self.receiving = True
        self.halted = False
        self._wake: trio.Event | None = None

    # -- the receiving thread ----------------------------------------------------

    def wrote(self, end: int) -> None:
        """``end`` is written; wait while too much is unsynced."""
        with self._changed:
            self.written = end
            wake, self._wake = self._wake, None
        if wake is not None:
            self._token.run_sync_soon(wake.set)
        with self._changed:
            while self.written - self.durable >= MAX_UNSYNCED and not self.halted:
                self._changed.wait()
            if self.halted:
                raise _Stopped

    # -- the event loop ----------------------------------------------------------

    async def unsynced(self) -> int | None:
        """Wait until :data:`SYNC_BYTES` are written past the durable offset, or the
        thread has stopped with any; return their end.

        None once the thread has stopped and everything written is durable.
        """
        while True:
            with self._changed:
                if self.written - self.durable >= SYNC_BYTES:
                    return self.written
                if not self.receiving:
                    return self.written if self.written > self.durable else None
                self._wake = wake = trio.Event()
            await wake.wait()

    def synced(self, end: int) -> None:
        """``end`` is durable."""
        with self._changed:
            self.durable = end
            self._changed.notify_all()

    def finish(self) -> None:
        """The thread has returned."""
        with self._changed:
            self.receiving = False
            wake, self._wake = self._wake, None
        if wake is not None:
            wake.set()

    def halt(self) -> None:
        """Making bytes durable failed: the thread must stop."""
        with self._changed:
            self.halted = True
            self._changed.notify_all()


def _receive(
    body: Http1Connection,
    writer: PartialWriter,
    progress: _Progress,
    digest: Any,
    skip: int,
) -> int:
    """In the worker thread: skip ``skip`` bytes, then hash and write the rest of the body.

    Returns where the body ended; raises ``FetchError`` for a failed read (after
    writing what arrived before it) or a body longer than the declared size.
    """
    buffer = bytearray(READ_BYTES)
    view = memoryview(buffer)
    while skip:
        count = body.readinto(view[: min(skip, READ_BYTES)])
        if not count:
            return writer.written
        skip -= count

    def write(piece: memoryview) -> None:
        writer.write(piece)
        progress.wrote(writer.written)

    received = writer.written
    with Pipeline(READ_BYTES, digest, write, name="ficc-receive") as pipeline:
        while received < writer.size:
            # Each piece ends on an aligned offset, so that after an unaligned start
            # (a resumed partial) every later piece can be written directly.
            want = min(READ_BYTES - received % DIRECT_ALIGN, writer.size - received)
            piece_buffer = pipeline.take()
            if piece_buffer is None:
                break  # writing failed: leaving the pipeline raises its failure
            filled, error = body.fill(memoryview(piece_buffer)[:want])
            pipeline.put(piece_buffer, filled)
            received += filled
            if error is not None:
                pipeline.close()
                raise error
            if filled < want:
                break
        else:
            if body.readinto(view[:1]):
                pipeline.close()
                raise FetchError(
                    f"the server sent more than the declared size of {writer.size} bytes",
                    code="longer_than_declared",
                )
    return writer.written


async def receive_into_blob(
    response: Response, blobs: BlobStore, ref: FileRef, offset: int, skip: int, digest: Any
) -> int:
    """Write ``response``'s body into the partial of ``ref`` from ``offset``; return its end.

    The caller holds the file's lock; ``offset`` is its durable offset and
    ``digest`` a sha256 object fed the bytes before it (it is fed the rest).
    ``skip`` leading body bytes are dropped (a server that ignored ``Range``).
    Every byte written is durable when this returns or raises: the end returned
    is the partial's durable offset.

    :raises FetchError: the read failed or the body is longer than declared.
    :raises FiccError: ``write_failed``, making bytes durable failed;
        :class:`~ficc_core.models.blobs.FileVerified`, the content was verified
        through another model meanwhile; ``model_not_found``, the model is gone.
    """
    progress = _Progress(offset)
    failures: list[FiccError] = []
    async with blobs.open_writer(ref, offset) as writer:

        async def make_durable() -> None:
            # An admitted write always completes, even while pausing.
            with trio.CancelScope(shield=True):
                while await progress.unsynced() is not None:
                    try:
                        progress.synced(await blobs.commit(ref, writer))
                    except (FiccError, OSError) as exc:
                        failures.append(
                            exc
                            if isinstance(exc, FiccError)
                            else await _write_failure(exc, blobs, ref, progress.durable)
                        )
                        progress.halt()
                        response.abort()
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(make_durable)
            try:
                received = await response.run_sync(
                    lambda body: outcome.capture(_receive, body, writer, progress, digest, skip)
                )
            finally:
                progress.finish()
    # A pause aborted the read: that is the cancellation, not a failed fetch.
    await trio.lowlevel.checkpoint_if_cancelled()
    if failures:
        raise failures[0]
    if isinstance(received, outcome.Error) and isinstance(received.error, OSError):
        raise await _write_failure(received.error, blobs, ref, progress.durable)
    return received.unwrap()


async def _write_failure(exc: OSError, blobs: BlobStore, ref: FileRef, durable: int) -> FiccError:
    """``write_failed``, or ``insufficient_storage`` (the reserve released) on a full disk."""
    if is_disk_full(exc):
        return await blobs.disk_full(durable, ref.size, doing="this acquisition")
    return FiccError(f"writing failed: {exc}", code="write_failed")
