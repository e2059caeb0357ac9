"""A running process provider with a short state directory (socket paths must fit)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from ficc_executor_process.provider import ProcessProvider
from ficc_executor_process.testing import running_process_provider, short_state_dir


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with short_state_dir() as path:
        yield path


@pytest.fixture
async def provider(state_dir: Path) -> AsyncIterator[ProcessProvider]:
    async with running_process_provider(state_dir, default_grace=2.0) as provider:
        yield provider
