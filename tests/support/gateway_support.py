"""Fixtures for the gateway tests: a real controller, embedded agent, engines and hypercorn.

:func:`gateway_env` opens a controller (real SQLite, background tasks), runs the
embedded agent with the real process provider, serves the API with hypercorn on
an OS-chosen loopback port; its :class:`Gateway` (``service.gateway``) has the
test's options. Tests launch stand-in engines through
the agent and publish :class:`LiveService` views by hand (the reconciler does
that in production).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio.testing

from ficc_core.agent import Agent
from ficc_core.agent.embedded import run_embedded_agent
from ficc_core.config import load_config
from ficc_core.controller.server import serve_http
from ficc_core.controller.service import Service, open_service
from ficc_core.gateway import Gateway
from ficc_core.gateway.request import Request
from ficc_core.routing.live import LiveReplica, LiveService
from ficc_core.schema import Fence, Job
from ficc_core.testing.executor_kit import new_fence, request_json, standin_job

ALIAS = "standin-chat"


@attrs.define
class GatewayEnv:
    """One running controller with its embedded agent, for one test."""

    service: Service
    agent: Agent
    gateway: Gateway
    url: str
    admin_token: str
    project_id: str
    fences: list[Fence] = attrs.field(factory=list)

    @property
    def node_id(self) -> str:
        return self.agent.node_id

    def base_url(self, service_id: str | None = None) -> str:
        """The OpenAI ``base_url`` of a service, or of the project endpoint."""
        if service_id is None:
            return f"{self.url}/v1"
        return f"{self.url}/api/v1/inference/{service_id}/v1"

    async def launch(self, job: Job | None = None, *, generation: int = 1, **limits: Any) -> Fence:
        """Launch a stand-in engine (or ``job``) on the embedded agent; wait until it is ready."""
        fence = new_fence(generation)
        await self.agent.launch("process", job or standin_job(), fence, **limits)
        status = await self.agent.providers["process"].wait_ready(fence)
        assert status.state == "ready", status
        self.fences.append(fence)
        return fence

    def replica(self, fence: Fence, index: int = 0, node_id: str | None = None) -> LiveReplica:
        return LiveReplica(index=index, node_id=node_id or self.node_id, fence=fence)

    def publish(
        self,
        service_id: str,
        fences: Sequence[Fence | LiveReplica],
        *,
        generation: int = 1,
        admission: str = "serving",
        concurrency: int = 4,
        request_deadline: float | None = None,
        capabilities: tuple[str, ...] = ("chat", "streaming"),
        project_id: str | None = None,
        alias: str = ALIAS,
        **fields: Any,
    ) -> LiveService:
        """Publish a service view whose replicas are ``fences`` (or ready-made replicas);
        ``fields``: more of the view's (``names``, ``fallbacks``, ``context_length``...)."""
        replicas = tuple(
            item if isinstance(item, LiveReplica) else self.replica(item, index)
            for index, item in enumerate(fences)
        )
        view = LiveService(
            id=service_id,
            project_id=project_id or self.project_id,
            alias=alias,
            generation=generation,
            admission=admission,  # type: ignore[arg-type]
            concurrency=concurrency,
            request_deadline=request_deadline,
            capabilities=capabilities,
            replicas=replicas,
            **fields,
        )
        self.service.live.publish(view)
        return view

    async def token(self, service_id: str | None = None, **kwargs: Any) -> tuple[str, str]:
        """An invoke credential (bound to ``service_id`` when given): (credential id, token)."""
        kwargs.setdefault("generated_name", "name" not in kwargs)  # names are unique
        record, token = await self.service.auth.create_credential(
            kwargs.pop("project", "default"),
            name=kwargs.pop("name", "invoke"),
            scopes=frozenset(kwargs.pop("scopes", {"inference:invoke"})),
            service_id=service_id,
            **kwargs,
        )
        return record.id, token

    async def engine_stats(self, fence: Fence) -> dict[str, Any]:
        """The stand-in's ``/stats``, read through the agent's endpoint action."""
        status, stats = await request_json(self.agent, fence, "GET", "/stats")  # type: ignore[arg-type]
        assert status == 200
        return stats

    async def steer(self, fence: Fence, **how: Any) -> None:
        """Change how the stand-in of ``fence`` answers chats (``head_delay``,
        ``first_delay``, ``status`` and ``body``; none: the defaults again)."""
        status, _ = await request_json(self.agent, fence, "POST", "/steer", how)  # type: ignore[arg-type]
        assert status == 200

    async def chats_seen(self, fence: Fence) -> int:
        """How many chat requests the stand-in of ``fence`` received."""
        return (await self.engine_stats(fence))["chat_requests"]

    async def kill_engine(self, fence: Fence) -> None:
        """SIGKILL the stand-in engine of ``fence`` (as if it crashed)."""
        stats = await self.engine_stats(fence)
        os.kill(stats["pid"], signal.SIGKILL)

    def http(self, token: str, **kwargs: Any) -> httpx.AsyncClient:
        """An httpx client with the token, for raw HTTP checks."""
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=kwargs.pop("timeout", 30),
            **kwargs,
        )


@asynccontextmanager
async def gateway_env(
    tmp_path: Path, *, clock: trio.testing.MockClock | None = None, **gateway_options: Any
) -> AsyncIterator[GatewayEnv]:
    """A controller with an embedded agent and hypercorn; see the module docs.

    :param clock: the test's ``idle_clock``: once everything is up it stops following
        real time and jumps ahead whenever the process is idle.
    """
    agent_dir = tempfile.mkdtemp(prefix="fg-", dir="/tmp")  # short: engine socket paths
    config = load_config(
        overrides={
            "data_dir": str(tmp_path / "data"),
            "agent_dir": agent_dir,
            "port": 0,
            "heartbeat_interval": "1s",
        },
        environ={},
    )
    try:
        async with open_service(
            config, background=True, gateway_options=gateway_options
        ) as service:
            created = await service.auth.bootstrap()
            assert created is not None
            project = await service.auth.get_project("default")
            gateway = service.gateway
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(run_embedded_agent, service)
                assert agent is not None, "the process provider is not installed"
                urls = await nursery.start(partial(serve_http, service, shutdown_trigger=stop.wait))
                if clock is not None:
                    clock.rate, clock.autojump_threshold = 0.0, 0.1
                yield GatewayEnv(
                    service=service,
                    agent=agent,
                    gateway=gateway,
                    url=urls[0],
                    admin_token=created["token"],
                    project_id=project.id,
                )
                stop.set()
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(agent_dir, ignore_errors=True)


def routing_request(
    view: LiveService,
    *,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
    payload: bytes = b"",
) -> Request:
    """A request to ``view`` as the router sees it (no actor: routing never reads it)."""
    return Request(
        service_id=view.id,
        path=path,
        actor=None,  # type: ignore[arg-type]
        view=view,
        headers=headers or {},
        started=0.0,
        deadline=float("inf"),
        payload=payload,
    )


def sse_events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as a string)."""
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chat(stream: bool = False, *, deltas: int = 8, interval: float = 0.0, **extra: Any) -> dict:
    """A chat completion body for the stand-in."""
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "say some words please"}],
        "stream": stream,
        "standin_deltas": deltas,
        "standin_interval": interval,
        **extra,
    }
