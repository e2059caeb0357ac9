"""The controller as one object: configuration, store, authentication, metrics.

The HTTP routes, the CLI and (later) federation transports all work through a
:class:`Service`; nothing reaches the store around it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs

from .auth import AuthService
from .config import Config
from .metrics import Metrics
from .store import Store, open_sqlite_store


@attrs.define
class Service:
    """Everything a running controller holds."""

    config: Config
    store: Store
    auth: AuthService
    metrics: Metrics


@asynccontextmanager
async def open_service(config: Config) -> AsyncIterator[Service]:
    """Open the store (running migrations) and yield the :class:`Service`; close on exit."""
    store = await open_sqlite_store(config.database_path, readers=config.store_read_threads)
    try:
        yield Service(
            config=config,
            store=store,
            auth=AuthService(store, session_lifetime=config.session_lifetime),
            metrics=Metrics(),
        )
    finally:
        await store.aclose()
