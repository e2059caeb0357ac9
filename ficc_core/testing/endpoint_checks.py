"""The executor kit's checks of the endpoint action: backpressure, cancel, fences and the
endpoint contract, each observed from the stand-in engine's side.
"""

from __future__ import annotations

import json
import time

import trio

from ..base.errors import FiccError
from ..executor import (
    CHUNK_SIZE,
    QUEUE_CHUNKS,
    BodyChunk,
    EndOfStream,
    ExecutorProvider,
    ResponseHead,
    StreamFailed,
)
from ..schema import Fence
from .executor_support import (
    JobFactory,
    job_from,
    launched,
    new_fence,
    refused,
    request_json,
)


async def check_endpoint_backpressure(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """A reader that does not read holds at most four chunks and blocks the engine's writes.

    Chunks are never larger than 64 KiB, and cancelling a blocked stream is seen
    by the engine at once.
    """
    async with launched(provider, job_from(job_factory)) as fence:
        stream_id = "backpressure"
        await provider.open(fence, stream_id, "GET", "/stream", {}, b"")
        head = await provider.read(fence, stream_id)
        assert isinstance(head, ResponseHead) and head.status == 200, head
        written = await _settled_stream_bytes(provider, fence)
        # Four queued chunks plus what the kernel buffers: bounded, and no longer growing.
        assert written < 8 * 1024 * 1024, written
        held = getattr(getattr(provider, "streams", None), "held", None)
        if held is not None:
            assert held(fence, stream_id) <= QUEUE_CHUNKS
        for _ in range(QUEUE_CHUNKS * 4):
            event = await provider.read(fence, stream_id)
            assert isinstance(event, BodyChunk), event
            assert 0 < len(event.data) <= CHUNK_SIZE
        # Reading let the engine write again.
        assert await _settled_stream_bytes(provider, fence) > written
        await _assert_cancel_seen(provider, fence, stream_id, within=0.1)


async def _settled_stream_bytes(provider: ExecutorProvider, fence: Fence) -> int:
    previous = -1
    with trio.fail_after(20):
        while True:
            await trio.sleep(0.3)
            _, stats = await request_json(provider, fence, "GET", "/stats")
            if stats["stream_bytes"] == previous and previous > 0:
                return previous
            previous = stats["stream_bytes"]


async def _assert_cancel_seen(
    provider: ExecutorProvider, fence: Fence, stream_id: str, *, within: float
) -> float:
    _, before = await request_json(provider, fence, "GET", "/stats")
    begin = time.time()
    await provider.cancel(fence, stream_id)
    with trio.fail_after(10):
        while True:
            _, stats = await request_json(provider, fence, "GET", "/stats")
            if stats["disconnects"] > before["disconnects"]:
                break
            await trio.sleep(0.01)
    latency = stats["last_disconnect_at"] - begin
    assert latency <= within, f"the engine saw the cancel after {latency * 1000:.0f} ms"
    try:
        await provider.read(fence, stream_id)
    except FiccError as exc:
        assert exc.code == "unknown_stream", exc.code
    else:
        raise AssertionError("a cancelled stream can still be read")
    return latency


async def check_cancel(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None, within: float = 0.1
) -> float:
    """``cancel`` closes the engine connection: the engine sees it within ``within`` seconds."""
    async with launched(provider, job_from(job_factory)) as fence:
        await provider.open(fence, "slow", "GET", "/slow", {}, b"")
        assert isinstance(await provider.read(fence, "slow"), ResponseHead)
        assert isinstance(await provider.read(fence, "slow"), BodyChunk)
        return await _assert_cancel_seen(provider, fence, "slow", within=within)


async def check_fences_and_contract(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """Stale and unknown fences, paths outside the contract and extra headers are refused."""
    async with launched(provider, job_from(job_factory)) as fence:
        stale = Fence(
            attempt_id=fence.attempt_id,
            generation=fence.generation + 1,
            plan_digest=fence.plan_digest,
        )
        other_plan = Fence(
            attempt_id=fence.attempt_id,
            generation=fence.generation,
            plan_digest="sha256:" + "cd" * 32,
        )
        unknown = new_fence()
        await provider.open(fence, "s1", "GET", "/slow", {}, b"")
        await refused("stale_fence", provider.read(stale, "s1"))
        await refused("stale_fence", provider.read(other_plan, "s1"))
        await refused("stale_fence", provider.open(stale, "s2", "GET", "/health", {}, b""))
        await refused("stale_fence", provider.cancel(stale, "s1"))
        await refused("stale_fence", provider.status(stale))
        await refused("unknown_attempt", provider.read(unknown, "s1"))
        await refused("unknown_stream", provider.read(fence, "never-opened"))
        await refused("path_not_admitted", provider.open(fence, "s3", "GET", "/admin", {}, b""))
        await refused("path_not_admitted", provider.open(fence, "s4", "GET", "/../etc", {}, b""))
        await refused("path_not_admitted", provider.open(fence, "s5", "DELETE", "/health", {}, b""))
        await provider.cancel(fence, "s1")
        headers = {
            "Authorization": "Bearer secret",
            "Cookie": "session=1",
            "X-Forwarded-For": "10.0.0.1",
            "Content-Type": "application/json",
            "X-Request-Id": "r-1",
        }
        await provider.open(fence, "echo", "POST", "/echo", headers, b"{}")
        data = b""
        while not isinstance(event := await provider.read(fence, "echo"), EndOfStream):
            assert not isinstance(event, StreamFailed), event
            if isinstance(event, BodyChunk):
                data += event.data
        seen = json.loads(data)["headers"]
        assert "authorization" not in seen and "cookie" not in seen
        assert "x-forwarded-for" not in seen
        assert seen["x-request-id"] == "r-1"
