"""Building blocks of the executor kit: the stand-in's job, fences, a launched attempt,
one request through the endpoint action. ``ficc_core.testing.executor_kit`` exports them.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import trio

from ..base.errors import FiccError
from ..executor import (
    AttemptStatus,
    BodyChunk,
    EndOfStream,
    ExecutorProvider,
    ResponseHead,
)
from ..schema import EndpointContract, Fence, Job, JobInput, ReadinessProbe, ResourceLimits
from .standin_engine import ROUTES

JobFactory = Callable[..., Job]


def standin_job(
    *,
    ready_after: float = 0.0,
    ignore_sigterm: bool = False,
    exit_after: float | None = None,
    readiness_timeout: float = 30.0,
    inputs: tuple[JobInput, ...] = (),
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Job:
    """A job that runs the stand-in engine with the given Python (default: this one).

    With ``port``, the engine listens on ``127.0.0.1:port`` in its own network
    namespace and the endpoint contract uses the TCP transport.
    """
    argv = [python, "-m", "ficc_core.testing.standin_engine"]
    if port is None:
        argv += ["--socket", "{endpoint_socket}"]
        endpoint = EndpointContract.unix(ROUTES)
    else:
        argv += ["--port", str(port)]
        endpoint = EndpointContract.tcp(port, ROUTES)
    argv += ["--ready-after", str(ready_after)]
    if ignore_sigterm:
        argv.append("--ignore-sigterm")
    if exit_after is not None:
        argv += ["--exit-after", str(exit_after)]
    return Job(
        argv=argv,
        env=env or {},
        inputs=inputs,
        endpoint=endpoint,
        readiness=ReadinessProbe(path="/health", timeout=readiness_timeout, interval=0.1),
        capabilities=("chat",),
    )


def new_fence(generation: int = 1) -> Fence:
    """A fresh fence with a random attempt ID."""
    return Fence(
        attempt_id=f"kit-{uuid.uuid4().hex[:12]}",
        generation=generation,
        plan_digest="sha256:" + "ab" * 32,
    )


@asynccontextmanager
async def launched(
    provider: ExecutorProvider,
    job: Job,
    *,
    limits: ResourceLimits | None = None,
    wait_ready: bool = True,
) -> AsyncIterator[Fence]:
    """Launch ``job``, wait until it is ready (asserting it is), and always stop it."""
    fence = new_fence()
    status = await provider.launch(job, fence, limits=limits)
    assert status.state == "starting", status
    try:
        if wait_ready:
            status = await provider.wait_ready(fence)
            assert status.state == "ready", status
        yield fence
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await provider.stop(fence, grace=2.0)


class Exchange(NamedTuple):
    """One finished request through the endpoint action."""

    status: int
    headers: dict[str, str]
    chunks: list[bytes]

    @property
    def body(self) -> bytes:
        """The whole response body."""
        return b"".join(self.chunks)


async def exchange(
    provider: ExecutorProvider, fence: Fence, method: str, path: str, payload: Any = None
) -> Exchange:
    """Send one request (a JSON ``payload``, if any) and read its whole answer."""
    stream_id = uuid.uuid4().hex
    body = b"" if payload is None else json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    await provider.open(fence, stream_id, method, path, headers, body)
    head, chunks = None, []
    while True:
        event = await provider.read(fence, stream_id)
        if isinstance(event, ResponseHead):
            head = event
        elif isinstance(event, BodyChunk):
            chunks.append(event.data)
        elif isinstance(event, EndOfStream) and head is not None:
            return Exchange(head.status, dict(head.headers), chunks)
        else:
            raise AssertionError(f"{method} {path} failed: {event}")


async def request_json(
    provider: ExecutorProvider, fence: Fence, method: str, path: str, payload: Any = None
) -> tuple[int, Any]:
    """Send one request through the endpoint action and decode its JSON answer."""
    answer = await exchange(provider, fence, method, path, payload)
    return answer.status, json.loads(answer.body) if answer.chunks else None


async def wait_ended(provider: ExecutorProvider, fence: Fence, seconds: float) -> AttemptStatus:
    with trio.fail_after(seconds):
        while True:
            status = await provider.status(fence)
            if not status.running:
                return status
            await trio.sleep(0.05)


def job_from(job_factory: JobFactory | None, **options: Any) -> Job:
    return (job_factory or standin_job)(**options)


async def refused(code: str, operation: Any) -> None:
    """Await ``operation`` and assert it is refused with the stable error ``code``."""
    try:
        await operation
    except FiccError as exc:
        assert exc.code == code, f"expected {code}, got {exc.code}: {exc.message}"
    else:
        raise AssertionError(f"expected a refusal with code {code}")
