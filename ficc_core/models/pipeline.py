"""Hashing and writing beside receiving: a body's pieces pass through two more threads.

The thread that receives a body (decrypting TLS) would otherwise also hash every
piece and copy it into the page cache, one after the other, on one core. Here
it only receives: each filled buffer goes to a thread that feeds the file's
sha256, then to a thread that writes it to the partial and reports the end
written, then back to a small pool of buffers. The three run at once on
different buffers (``ssl``, ``hashlib`` and ``os.pwrite`` release the GIL for
pieces this size), so a machine with a core to spare receives at the speed of
the slowest stage, not of their sum. The digest is fed and the file written in
the order received.

The buffers are anonymous memory maps, so each starts on a page: the writing
stage may hand them to a direct writer
(:class:`~ficc_core.models.partials.PartialWriter`). The pool bounds memory
(:data:`BUFFERS` x the buffer size) and carries
back-pressure: when writing waits (too much unsynced, see
:class:`~ficc_core.models.download._Progress`), the pool runs dry and receiving
waits too. A failure in writing stops the stages; the receiving thread learns
of it when it next asks for a buffer, and :meth:`Pipeline.close` reports it.
Whatever was received before a stop is still hashed and written.
"""

from __future__ import annotations

import mmap
import queue
import threading
from collections.abc import Callable
from typing import Any

#: Buffers in flight between the three stages.
BUFFERS = 6

_END = None


class Pipeline:
    """Receive into :meth:`take`'s buffers, hand them back filled with :meth:`put`.

    Use as a context manager from the receiving thread: leaving it drains both
    stages, joins their threads and raises a failure either stage met (the first).
    """

    def __init__(
        self, size: int, digest: Any, write: Callable[[memoryview], None], name: str
    ) -> None:
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        for _ in range(BUFFERS):
            # Anonymous maps start on a page, as a direct write's memory must.
            self._free.put(mmap.mmap(-1, size))
        self._to_hash: queue.SimpleQueue[tuple[mmap.mmap, int] | None] = queue.SimpleQueue()
        self._to_write: queue.SimpleQueue[tuple[mmap.mmap, int] | None] = queue.SimpleQueue()
        self._digest = digest
        self._write = write
        #: The first failure of either stage; once set, later pieces are dropped.
        self.error: BaseException | None = None
        self._closed = False
        self._threads = [
            threading.Thread(target=self._hashing, name=f"{name}-hash", daemon=True),
            threading.Thread(target=self._writing, name=f"{name}-write", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def take(self) -> mmap.mmap | None:
        """A free buffer to receive into; None once a stage has failed (stop receiving)."""
        buffer = self._free.get()
        if self.error is not None:
            self._free.put(buffer)
            return None
        return buffer

    def put(self, buffer: mmap.mmap, filled: int) -> None:
        """``buffer`` holds ``filled`` received bytes: hash and write them."""
        if filled:
            self._to_hash.put((buffer, filled))
        else:
            self._free.put(buffer)

    def close(self) -> None:
        """Hash and write everything put so far, stop both threads and raise a failure.

        Only the first call does anything.
        """
        if self._closed:
            return
        self._closed = True
        self._to_hash.put(_END)
        for thread in self._threads:
            thread.join()
        if self.error is not None:
            raise self.error

    # -- the two stages ------------------------------------------------------------

    def _hashing(self) -> None:
        update = self._digest.update
        while (item := self._to_hash.get()) is not _END:
            if self.error is None:
                try:
                    update(memoryview(item[0])[: item[1]])
                except BaseException as exc:  # reported by close()
                    self.error = exc
            self._to_write.put(item)
        self._to_write.put(_END)

    def _writing(self) -> None:
        while (item := self._to_write.get()) is not _END:
            buffer, filled = item
            if self.error is None:
                try:
                    self._write(memoryview(buffer)[:filled])
                except BaseException as exc:  # reported by close()
                    self.error = exc
            self._free.put(buffer)
