"""The executor conformance kit: async checks a provider's own tests call.

In the manner of trio's ``check_one_way_stream``, each check takes a *running*
provider (``await nursery.start(provider.run)``), launches the stand-in engine
(:mod:`ficc_core.testing.standin_engine`) through it and asserts what the
executor contract promises, observing it from the engine's side::

    from ficc_core.testing import executor_kit

    async def test_my_provider_conforms(my_provider):
        await executor_kit.check_executor_provider(my_provider)

Every check stops what it launched, even when it fails. A provider whose engines
need something more than the host's Python to run the stand-in (a container
image, mounts) passes its own ``job_factory``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import struct
import tempfile
import uuid
from contextlib import aclosing
from functools import partial
from pathlib import Path

import trio

from ..executor import (
    CHUNK_SIZE,
    BodyChunk,
    EndOfStream,
    ExecutorProvider,
    ResponseHead,
    StreamFailed,
)
from ..schema import JobInput, ResourceLimits
from .endpoint_checks import (
    check_cancel,
    check_endpoint_backpressure,
    check_fences_and_contract,
)
from .executor_support import (
    Exchange,
    JobFactory,
    exchange,
    job_from,
    launched,
    new_fence,
    refused,
    request_json,
    standin_job,
    wait_ended,
)

__all__ = [
    "CHECKS",
    "Exchange",
    "JobFactory",
    "check_cancel",
    "check_clean_stop",
    "check_endpoint_backpressure",
    "check_executor_provider",
    "check_exit_reported",
    "check_fences_and_contract",
    "check_input_upload",
    "check_limits",
    "check_logs",
    "check_network_isolation",
    "check_readiness",
    "check_tcp_transport",
    "exchange",
    "launched",
    "new_fence",
    "request_json",
    "standin_job",
]


# -- the checks ------------------------------------------------------------------------------


async def check_readiness(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """An attempt is ``starting`` until its probe answers 200; a silent one fails on time."""
    job = job_from(job_factory, ready_after=1.0)
    fence = new_fence()
    begin = trio.current_time()
    assert (await provider.launch(job, fence)).state == "starting"
    try:
        status = await provider.wait_ready(fence)
        assert status.state == "ready", status
        assert trio.current_time() - begin >= 1.0
    finally:
        with trio.CancelScope(shield=True):
            await provider.stop(fence, grace=2.0)
    job = job_from(job_factory, ready_after=3600.0, readiness_timeout=1.0)
    fence = new_fence()
    await provider.launch(job, fence)
    try:
        status = await provider.wait_ready(fence)
        assert status.state == "failed", status
        assert status.reason == "readiness_timeout", status
        assert "/health" in (status.message or "")
        status = await wait_ended(provider, fence, 30)
        assert status.state == "failed"
    finally:
        with trio.CancelScope(shield=True):
            await provider.stop(fence, grace=2.0)


async def check_exit_reported(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """An engine that exits on its own is reported with its status and log tail."""
    async with launched(provider, job_from(job_factory, exit_after=0.5)) as fence:
        status = await wait_ended(provider, fence, 30)
        assert status.state == "exited", status
        assert status.exit_code == 3, status
        assert status.reason == "exited", status
        assert any("listening" in line for line in status.log_tail), status.log_tail


def _host_addresses() -> list[str]:
    """The host's own non-loopback IPv4 addresses (targets that never leave the machine)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _index, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
            except OSError:
                continue  # an interface without an IPv4 address
            address = socket.inet_ntoa(answer[20:24])
            if not address.startswith("127."):
                found.append(address)
    return found


async def check_network_isolation(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """From inside the engine, no listener of the host is reachable: not on loopback, not on
    any of the host's own addresses.

    Every target is this machine, so nothing leaves it even if isolation were broken.
    """
    accepted = 0

    async def count(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        # Listening on every host address, on a port the OS chooses.
        [listener] = await nursery.start(partial(trio.serve_tcp, count, 0, host="0.0.0.0"))
        port = listener.socket.getsockname()[1]
        async with launched(provider, job_from(job_factory)) as fence:
            targets = [["127.0.0.1", port], ["localhost", port]]
            targets += [[address, port] for address in _host_addresses()]
            status, answer = await request_json(
                provider, fence, "POST", "/connect", {"targets": targets}
            )
            assert status == 200
            for target, result in zip(targets, answer["results"], strict=True):
                assert result != "connected", f"the engine reached {target}"
        nursery.cancel_scope.cancel()
    assert accepted == 0, "the host's loopback listener accepted a connection from the engine"


async def check_limits(
    provider: ExecutorProvider,
    *,
    job_factory: JobFactory | None = None,
    cpu_quota: bool = True,
) -> None:
    """Exceeding the memory limit kills the engine with reason ``memory_limit``; CPU is capped."""
    limits = ResourceLimits(cpus=0.25, memory_bytes=256 * 1024 * 1024, pids=64)
    if cpu_quota:
        async with launched(provider, job_from(job_factory), limits=limits) as fence:
            code, answer = await request_json(provider, fence, "POST", "/burn", {"seconds": 1.0})
            assert code == 200
            # A quarter of one CPU for one second, with slack for the scheduler's period.
            assert answer["cpu_seconds"] < 0.5, answer
    async with launched(provider, job_from(job_factory), limits=limits) as fence:
        stream_id = uuid.uuid4().hex
        body = json.dumps({"bytes": 1024 * 1024 * 1024}).encode()
        await provider.open(fence, stream_id, "POST", "/alloc", {}, body)
        with trio.fail_after(30):
            event = await provider.read(fence, stream_id)
        assert isinstance(event, StreamFailed | EndOfStream) or (
            isinstance(event, ResponseHead) and event.status >= 500
        ), event
        status = await wait_ended(provider, fence, 30)
        assert status.state == "exited", status
        assert status.reason == "memory_limit", status
        assert "memory limit" in (status.message or ""), status


async def check_input_upload(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """Only an admitted input *file* can be streamed to the engine, by the executor itself."""
    folder = Path(await trio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="ficc-kit-")))
    try:
        blob = folder / "model.gguf"
        content = os.urandom(300_000)
        await trio.to_thread.run_sync(blob.write_bytes, content)
        inputs = (JobInput(id="model", path=str(blob)), JobInput(id="folder", path=str(folder)))
        async with launched(provider, job_from(job_factory, inputs=inputs)) as fence:
            await provider.open(fence, "up", "POST", "/echo", {}, b"", input_id="model")
            data = b""
            while not isinstance(event := await provider.read(fence, "up"), EndOfStream):
                assert not isinstance(event, StreamFailed), event
                if isinstance(event, BodyChunk):
                    data += event.data
            refusals = [
                ("POST", "other", b""),
                ("POST", "folder", b""),
                ("POST", "model", b"extra"),
                ("GET", "model", b""),
            ]
            for method, input_id, body in refusals:
                await refused(
                    "input_not_admitted",
                    provider.open(fence, "x", method, "/echo", {}, body, input_id=input_id),
                )
    finally:
        await trio.to_thread.run_sync(shutil.rmtree, folder, True)
    answer = json.loads(data)
    assert answer["body_length"] == len(content)
    assert answer["body_sha256"] == hashlib.sha256(content).hexdigest()
    assert answer["headers"]["content-type"] == "application/octet-stream"


async def check_tcp_transport(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """An engine on ``127.0.0.1:<port>`` in its own namespace is reachable only via the action.

    Two attempts use the same port at once (each namespace has its own loopback),
    and neither can reach the host's loopback listener.
    """
    accepted = 0

    async def count(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, count, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        job = job_from(job_factory, port=port)
        async with launched(provider, job) as first, launched(provider, job) as second:
            # Both answer, on the same port number, at the same time.
            assert (await request_json(provider, first, "GET", "/health"))[0] == 200
            assert (await request_json(provider, second, "GET", "/health"))[0] == 200
            status, answer = await request_json(
                provider, first, "POST", "/connect", {"targets": [["127.0.0.1", 1]]}
            )
            assert status == 200 and answer["results"][0] != "connected"
            stream_id = uuid.uuid4().hex
            await provider.open(first, stream_id, "GET", "/stream", {}, b"")
            assert isinstance(await provider.read(first, stream_id), ResponseHead)
            chunk = await provider.read(first, stream_id)
            assert isinstance(chunk, BodyChunk) and len(chunk.data) <= CHUNK_SIZE
            await provider.cancel(first, stream_id)
        nursery.cancel_scope.cancel()
    # The engines listened on the same port number as the host listener, in their own
    # namespaces: the readiness probes and requests above never reached the host's.
    assert accepted == 0


async def check_logs(provider: ExecutorProvider, *, job_factory: JobFactory | None = None) -> None:
    """The engine's output is in its log: tail gives the last lines, follow streams them."""
    async with launched(provider, job_from(job_factory)) as fence:
        await request_json(provider, fence, "POST", "/log", {"lines": 50})
        with trio.fail_after(10):
            while True:
                tail = await provider.logs(fence, tail=20)
                if "standin log line 49" in tail:
                    break
                await trio.sleep(0.05)
        assert len(await provider.logs(fence, tail=5)) == 5
        followed: list[str] = []
        with trio.fail_after(10):
            async for line in provider.follow_logs(fence):
                followed.append(line)
                if line == "standin log line 49":
                    break
        assert any("listening" in line for line in followed)
        # With a tail, a follow starts with the last lines there are, then the new ones.
        with trio.fail_after(10):
            async with aclosing(provider.follow_logs(fence, tail=2)) as tailed:
                first = [await anext(tailed), await anext(tailed)]
                now = await provider.logs(fence, tail=100)
                assert any(now[i : i + 2] == first for i in range(len(now) - 1)), first
                assert now.index(first[0]) > now.index("standin log line 49") - 2, first
                await request_json(provider, fence, "POST", "/log", {"lines": 1})
                while await anext(tailed) != "standin log line 0":
                    pass


async def check_clean_stop(
    provider: ExecutorProvider, *, job_factory: JobFactory | None = None
) -> None:
    """``stop`` ends the engine (SIGTERM, then SIGKILL after the grace) and closes its endpoint."""
    async with launched(provider, job_from(job_factory)) as fence:
        status = await provider.stop(fence, grace=5.0)
        assert status.state == "stopped", status
        await refused("engine_unavailable", provider.open(fence, "x", "GET", "/health", {}, b""))
    async with launched(provider, job_from(job_factory, ignore_sigterm=True)) as fence:
        begin = trio.current_time()
        status = await provider.stop(fence, grace=1.0)
        assert status.state == "stopped", status
        assert 1.0 <= trio.current_time() - begin < 15
        assert any("ignoring SIGTERM" in line for line in status.log_tail), status.log_tail


#: Every check of the kit, in the order :func:`check_executor_provider` runs them.
#: A provider's own tests can parametrize over this to report each check apart.
CHECKS = (
    check_readiness,
    check_exit_reported,
    check_network_isolation,
    check_fences_and_contract,
    check_endpoint_backpressure,
    check_cancel,
    check_input_upload,
    check_logs,
    check_tcp_transport,
    check_clean_stop,
    check_limits,
)


async def check_executor_provider(
    provider: ExecutorProvider,
    *,
    job_factory: JobFactory | None = None,
) -> None:
    """Run every check of the kit against one running provider."""
    for check in CHECKS:
        await check(provider, job_factory=job_factory)
