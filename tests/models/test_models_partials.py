"""Writing a partial: direct writes for the aligned part, the page cache for the rest."""

from __future__ import annotations

import errno
import mmap
import os
import time

import pytest

from ficc_core.models import partials
from ficc_core.models.blob_records import PARTIAL, FileRef, Partial
from ficc_core.models.partials import DIRECT_ALIGN, PartialWriter

from ..support.models_support import Writes

KiB = 1 << 10


def _pieces(content: bytes, start: int, piece: int) -> list[mmap.mmap]:
    """``content[start:]`` in page-aligned buffers, each ending on an aligned offset
    (as the receiving thread sizes them)."""
    buffers, at = [], start
    while at < len(content):
        size = min(piece - at % DIRECT_ALIGN, len(content) - at)
        buffer = mmap.mmap(-1, piece)
        buffer[:size] = content[at : at + size]
        buffers.append((buffer, size))
        at += size
    return buffers


@pytest.fixture
def writes(monkeypatch):
    return Writes(monkeypatch)


def test_aligned_pieces_go_past_the_page_cache_and_the_ends_through_it(tmp_path, writes):
    content = os.urandom(300 * KiB + 123)
    path = tmp_path / "f.part"
    start = 5000  # a resumed partial's durable offset: not on a page
    path.write_bytes(content[:start] + b"junk past the durable offset")
    writer = PartialWriter(path, start, len(content), direct=True)
    try:
        assert writer.direct
        for buffer, size in _pieces(content, start, 64 * KiB):
            writer.write(memoryview(buffer)[:size])
        assert writer.sync() == len(content)
    finally:
        writer.close()
    assert path.read_bytes() == content
    # The first piece (unaligned start) and the tail under a page went through the
    # page cache; everything between them was written directly, page-aligned.
    direct = writes.direct()
    assert direct and all(not off % DIRECT_ALIGN and not n % DIRECT_ALIGN for off, n in direct)
    first_end = start - start % DIRECT_ALIGN + 64 * KiB
    assert direct[0][0] == first_end
    assert sum(n for _, n in direct) == (len(content) // DIRECT_ALIGN) * DIRECT_ALIGN - first_end
    buffered = writes.buffered()
    assert buffered[0] == (start, first_end - start)
    assert buffered[-1] == (len(content) - 123, 123)


def test_a_writer_that_is_not_direct_writes_everything_through_the_page_cache(tmp_path, writes):
    content = os.urandom(64 * KiB)
    writer = PartialWriter(tmp_path / "f.part", 0, len(content))
    try:
        assert not writer.direct
        ((buffer, size),) = _pieces(content, 0, 64 * KiB)
        writer.write(memoryview(buffer)[:size])
        writer.sync()
    finally:
        writer.close()
    assert not writes.direct() and (tmp_path / "f.part").read_bytes() == content


def test_a_refused_direct_write_falls_back_to_the_page_cache_and_loses_nothing(
    tmp_path, monkeypatch
):
    content = os.urandom(256 * KiB)
    writes = Writes(monkeypatch)
    real_pwrite = os.pwrite
    refused = []

    def refuse_the_second_direct_write(fd, data, offset):
        if fd in writes.direct_fds and offset > 0:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    writer = PartialWriter(tmp_path / "f.part", 0, len(content), direct=True)
    monkeypatch.setattr(partials.os, "pwrite", refuse_the_second_direct_write)
    try:
        for buffer, size in _pieces(content, 0, 64 * KiB):
            writer.write(memoryview(buffer)[:size])
        assert not writer.direct
        assert writer.sync() == len(content)
    finally:
        writer.close()
    assert refused == [64 * KiB]
    assert (tmp_path / "f.part").read_bytes() == content


def test_other_failures_of_a_direct_write_are_raised(tmp_path, monkeypatch):
    writes = Writes(monkeypatch)
    real_pwrite = os.pwrite

    def disk_full(fd, data, offset):
        if fd in writes.direct_fds:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    writer = PartialWriter(tmp_path / "f.part", 0, 64 * KiB, direct=True)
    monkeypatch.setattr(partials.os, "pwrite", disk_full)
    try:
        ((buffer, size),) = _pieces(os.urandom(64 * KiB), 0, 64 * KiB)
        with pytest.raises(OSError) as raised:
            writer.write(memoryview(buffer)[:size])
        assert raised.value.errno == errno.ENOSPC
        assert writer.written == 0
    finally:
        writer.close()


def test_a_file_system_that_refuses_direct_opens_gets_buffered_writes(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(partials.os, "open", no_direct)
    content = os.urandom(128 * KiB)
    writer = PartialWriter(tmp_path / "f.part", 0, len(content), direct=True)
    try:
        assert not writer.direct
        for buffer, size in _pieces(content, 0, 64 * KiB):
            writer.write(memoryview(buffer)[:size])
        writer.sync()
    finally:
        writer.close()
    assert (tmp_path / "f.part").read_bytes() == content


def _partial(model_id: str, size: int, durable: int, state=PARTIAL) -> Partial:
    return Partial(FileRef(model_id, 0, "ab" * 32, size), state, durable)


def test_tidying_touches_only_partials_idle_past_the_bound(tmp_path):
    now = time.time()
    old = now - 600
    live, idle = _partial("live", 8, 8), _partial("idle", 8, 8)
    lost = _partial("lost", 8, 6)
    for partial, held, modified in ((live, 8, now), (idle, 8, old), (lost, 2, old)):
        path = tmp_path / partials.partial_name(partial.ref)
        path.write_bytes(b"x" * held)
        os.utime(path, (modified, modified))
    writing, stale = tmp_path / "first.write", tmp_path / "gone.part"
    writing.write_bytes(b"x")  # a first write under way: no row records it yet
    stale.write_bytes(b"x")
    os.utime(stale, (old, old))
    recorded = [(live, False), (idle, False), (lost, False)]
    updated = {("live", 0): old, ("idle", 0): old, ("lost", 0): old}
    complete, lost_refs, done = partials.sweep_partials(
        tmp_path, recorded, before=now - 300, updated=updated
    )
    assert complete == [idle.ref] and lost_refs == [lost.ref] and done == []
    assert writing.exists() and not stale.exists()
    # A row written within the bound is live whatever its file's time, and so is one
    # this controller holds busy.
    updated[("idle", 0)] = now
    assert partials.sweep_partials(
        tmp_path, recorded, before=now - 300, updated=updated, busy={("lost", 0)}
    ) == ([], [], [])
    # Without a bound (a lone controller's start), every one.
    complete, lost_refs, _ = partials.sweep_partials(tmp_path, recorded, updated=updated)
    assert complete == [live.ref, idle.ref] and lost_refs == [lost.ref]
    assert not writing.exists()
