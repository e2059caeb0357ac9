"""The receive pipeline: hashing and writing in threads of their own, in order, bounded."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from ficc_core.models import pipeline as pipeline_module
from ficc_core.models.pipeline import Pipeline


def _pieces(count: int, size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


def test_every_piece_is_hashed_and_written_in_the_order_received() -> None:
    pieces = _pieces(40, 4096)
    written: list[bytes] = []
    digest = hashlib.sha256()
    with Pipeline(4096, digest, lambda view: written.append(bytes(view)), name="t") as flow:
        for piece in pieces:
            buffer = flow.take()
            assert buffer is not None
            buffer[: len(piece)] = piece
            flow.put(buffer, len(piece))
    assert written == pieces
    assert digest.hexdigest() == hashlib.sha256(b"".join(pieces)).hexdigest()
    assert not [t for t in threading.enumerate() if t.name.startswith("t-")]


def test_a_failed_write_stops_receiving_and_is_raised() -> None:
    written: list[int] = []

    def write(view: memoryview) -> None:
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        written.append(len(view))

    taken = 0
    with pytest.raises(OSError, match="No space left"):
        with Pipeline(1024, hashlib.sha256(), write, name="t") as flow:
            while (buffer := flow.take()) is not None:
                taken += 1
                assert taken < 1000, "receiving never learnt that writing failed"
                flow.put(buffer, 1024)
    assert written == [1024, 1024, 1024]
    # It learnt within the pool's bound of the failure.
    assert taken <= 4 + pipeline_module.BUFFERS
    assert not [t for t in threading.enumerate() if t.name.startswith("t-")]


def test_a_slow_writer_holds_receiving_to_the_pool() -> None:
    """Back-pressure: at most BUFFERS pieces are ever taken ahead of what is written."""
    release = threading.Event()
    written: list[int] = []

    def write(view: memoryview) -> None:
        release.wait(10)
        written.append(len(view))

    flow = Pipeline(16, hashlib.sha256(), write, name="t")
    ahead = 0
    try:
        while ahead < pipeline_module.BUFFERS:
            buffer = flow.take()
            assert buffer is not None
            flow.put(buffer, 16)
            ahead += 1
        # The pool is dry now: another take would wait for the writer.
        assert flow._free.empty()
        assert written == []
    finally:
        release.set()
        flow.close()
    assert written == [16] * pipeline_module.BUFFERS
