"""Helpers for tests that run engines under a real process provider.

Adapter and runtime test suites (and this package's own) use these instead of
building a provider by hand::

    @pytest.fixture
    async def provider():
        async with running_process_provider() as provider:
            yield provider
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

from .provider import ProcessProvider


@contextmanager
def short_state_dir(prefix: str = "fp-") -> Iterator[Path]:
    """A fresh directory under /tmp, short so engine socket paths fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def running_process_provider(
    state_dir: Path | None = None, **options: Any
) -> AsyncIterator[ProcessProvider]:
    """Start a :class:`ProcessProvider` (in ``state_dir`` or a fresh short one); stop it after.

    ``options`` go to the provider (defaults: ``stream_idle_timeout=30``, ``default_grace=5``).
    """
    options.setdefault("stream_idle_timeout", 30.0)
    options.setdefault("default_grace", 5.0)
    with short_state_dir() if state_dir is None else _given(state_dir) as directory:
        provider = ProcessProvider(state_dir=directory, **options)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(provider.run)
            yield provider
            nursery.cancel_scope.cancel()


@contextmanager
def _given(path: Path) -> Iterator[Path]:
    yield path
