"""A size-bounded log per attempt, with tail and follow.

The engine's stdout and stderr are pumped into ``<dir>/log`` by the provider. When
that file reaches half the bound it becomes ``log.1`` (replacing the older one),
so the two never hold more than the bound and the newest lines are always kept.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import trio

__all__ = ["BoundedLog"]


class BoundedLog:
    """The bounded log of one attempt.

    :param directory: the attempt's directory; the log lives in ``log`` and ``log.1``.
    :param max_bytes: the most bytes both files hold together.
    """

    def __init__(self, directory: Path, *, max_bytes: int = 4 * 1024 * 1024) -> None:
        self.path = directory / "log"
        self.previous = directory / "log.1"
        self.max_bytes = max_bytes
        self._changed = trio.lowlevel.ParkingLot()
        self._closed = False
        self._lock = trio.Lock()

    async def write(self, data: bytes) -> None:
        """Append ``data``, rotating when the current file reaches half the bound."""
        async with self._lock:
            await trio.to_thread.run_sync(self._write, data)
        self._changed.unpark_all()

    def _write(self, data: bytes) -> None:
        half = max(self.max_bytes // 2, 1)
        data = data[-half:]
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size + len(data) > half:
            if self.path.exists():
                os.replace(self.path, self.previous)
        with open(self.path, "ab") as file:
            file.write(data)

    async def pump(self, output: trio.abc.ReceiveStream | None, pumped: trio.Event) -> None:
        """Write everything ``output`` (the engine's stdout) gives until it ends; set ``pumped``."""
        try:
            if output is None:
                return
            async with output:
                while data := await output.receive_some(65536):
                    await self.write(data)
        finally:
            pumped.set()

    def close(self) -> None:
        """Mark the log complete: followers stop after the last line."""
        self._closed = True
        self._changed.unpark_all()

    def _read_all(self) -> bytes:
        chunks = []
        for path in (self.previous, self.path):
            try:
                chunks.append(path.read_bytes())
            except FileNotFoundError:
                pass
        return b"".join(chunks)

    async def tail(self, lines: int = 100) -> list[str]:
        """Return the last ``lines`` lines (decoded leniently)."""
        data = await trio.to_thread.run_sync(self._read_all)
        text = data.decode("utf-8", "replace").splitlines()
        return text[-lines:] if lines > 0 else []

    async def follow(self, tail: int | None = None) -> AsyncIterator[str]:
        """Yield every complete line from the start, then new ones, until closed.

        With ``tail``, start with only the last ``tail`` complete lines there are now
        (``log.1`` included), then the new ones: nothing is missed or repeated between.
        """
        position, generation_size, pending = 0, 0, b""
        if tail is not None:
            lines, position, generation_size = await trio.to_thread.run_sync(self._last_lines, tail)
            for line in lines:
                yield line
        while True:
            closed = self._closed
            data, position, generation_size = await trio.to_thread.run_sync(
                self._read_from, position, generation_size
            )
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
            if closed and not data:
                if pending:
                    yield pending.decode("utf-8", "replace")
                return
            if not data:
                with trio.move_on_after(0.5):
                    await self._changed.park()

    def _read_from(self, position: int, inode: int) -> tuple[bytes, int, int]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return b"", 0, 0
        if inode and stat.st_ino != inode:
            # Rotated: finish nothing from the old file (it is bounded anyway) and restart.
            position = 0
        with open(self.path, "rb") as file:
            file.seek(position)
            data = file.read(1024 * 1024)
        return data, position + len(data), stat.st_ino

    def _last_lines(self, tail: int) -> tuple[list[str], int, int]:
        """The last ``tail`` complete lines, and where (offset, inode) the next one starts."""
        try:
            previous = self.previous.read_bytes()
        except FileNotFoundError:
            previous = b""
        try:
            with open(self.path, "rb") as file:
                inode = os.fstat(file.fileno()).st_ino
                current = file.read()
        except FileNotFoundError:
            inode, current = 0, b""
        end = current.rfind(b"\n") + 1
        complete = (previous + current[:end]).split(b"\n")[:-1]
        kept = complete[-tail:] if tail > 0 else []
        return [line.decode("utf-8", "replace") for line in kept], end, inode
