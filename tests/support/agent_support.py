"""A controller served in the test's own trio run, and remote agents for it, for agent tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from ficc_core.agent import Agent
from ficc_core.config import load_config
from ficc_core.contributors import Node
from ficc_core.controller.server import serve_http
from ficc_core.controller.service import Service, open_service
from ficc_core.schema import Fence, GpuDevice

from .waiting import eventually


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


async def lease_carried(agent: Agent, fence: Fence, seconds: float) -> None:
    """Wait until renewals carried ``fence``'s lease ``seconds`` past its deadline now.

    A renewal sets the deadline to "now + the lease length", so a deadline that moved
    ``seconds`` on means at least that much time passed with the lease renewed all
    along. Fails at once if the lease runs out meanwhile.
    """
    (lease,) = [held for held in agent.leases() if held.fence == fence]
    target = lease.deadline + seconds
    with trio.fail_after(2 * seconds + 5):
        while lease.deadline < target:
            assert fence.attempt_id not in agent.expired, "the lease ran out"
            assert not lease.expiring, "the lease ran out"
            await trio.sleep(0.02)


async def heartbeats(service: Service, node_id: str, count: int) -> Node:
    """Wait until the controller recorded ``count`` more heartbeats of ``node_id``."""
    node = await service.contributors.get(node_id)
    seen = node.last_heartbeat
    with trio.fail_after(10 + count):
        while count:
            await trio.sleep(0.02)
            node = await service.contributors.get(node_id)
            if node.last_heartbeat != seen:
                seen, count = node.last_heartbeat, count - 1
    return node


async def _no_gpus() -> tuple[GpuDevice, ...]:
    return ()


def process_agent_maker(agent_dir: Path, node_id: str | None = None) -> Callable[[str], Agent]:
    """What :class:`RemoteAgent` calls to build its agent: one process provider, no GPUs."""
    from ficc_executor_process.provider import ProcessProvider

    def make(named: str) -> Agent:
        provider = ProcessProvider(state_dir=agent_dir / "p", default_grace=1.0)
        return Agent(
            node_id=node_id or named,
            providers={"process": provider},
            state_dir=agent_dir,
            gpu_query=_no_gpus,
            stop_grace=1.0,
        )

    return make


async def wait_connected(service: Service, node_id: str) -> None:
    """Wait until the controller lists ``node_id`` as connected."""
    while (await service.contributors.get(node_id)).state != "connected":  # noqa: ASYNC110
        await trio.sleep(0.05)


async def controller_missed(caplog: pytest.LogCaptureFixture, dials: int = 2) -> None:
    """Wait until a remote agent failed ``dials`` dials of its controller (from its log).

    Needs ``caplog.set_level(logging.WARNING, logger="ficc.agent")`` before the agent runs.
    """

    def failed() -> int:
        return sum("unreachable" in record.getMessage() for record in caplog.records)

    seen = failed()
    with trio.fail_after(30):
        await eventually(lambda: failed() >= seen + dials, None, every=0.05)
