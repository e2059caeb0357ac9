"""A running process provider with a short state directory (socket paths must fit)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from ficc_executor_process.provider import ProcessProvider


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def provider(state_dir: Path) -> AsyncIterator[ProcessProvider]:
    provider = ProcessProvider(state_dir=state_dir, stream_idle_timeout=30.0, default_grace=2.0)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(provider.run)
        yield provider
        nursery.cancel_scope.cancel()
