"""A controller served in the test's own trio run, for agent tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ficc_core.config import load_config
from ficc_core.controller.server import serve_http
from ficc_core.controller.service import Service, open_service


@asynccontextmanager
async def open_controller(tmp_path: Path, **settings) -> AsyncIterator[tuple[Service, str]]:
    """Serve a controller on 127.0.0.1 (OS-chosen port unless given); yield it and its URL."""
    overrides = {"data_dir": str(tmp_path / "data"), "port": 0, "heartbeat_interval": "100ms"}
    config = load_config(overrides={**overrides, **settings}, environ={})
    async with open_service(config, background=True) as service:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                lambda task_status: serve_http(
                    service, shutdown_trigger=stop.wait, task_status=task_status
                )
            )
            yield service, urls[0]
            stop.set()
            nursery.cancel_scope.cancel()
