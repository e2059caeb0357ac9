"""The endpoint action relayed over a node's connection: open/read/cancel, backpressure,
leases that never wait behind a stream, peer loss without replay."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.executor.types import BodyChunk, EndOfStream, ResponseHead, StreamFailed
from ficc_core.schema import Fence
from ficc_core.testing.executor_kit import new_fence, standin_job

from ..support.agent_support import (
    lease_carried,
    open_controller,
    process_agent_maker,
    wait_connected,
)
from ..support.waiting import eventually


@pytest.fixture
def agent_dir():
    path = Path(tempfile.mkdtemp(prefix="fy-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _request(endpoint, fence, method, path, body=b"", headers=None):
    stream_id = f"r-{time.monotonic_ns()}"
    await endpoint.open(fence, stream_id, method, path, headers or {}, body)
    status, data = 0, b""
    while True:
        event = await endpoint.read(fence, stream_id)
        if isinstance(event, ResponseHead):
            status = event.status
        elif isinstance(event, BodyChunk):
            assert len(event.data) <= 64 * 1024
            data += event.data
        elif isinstance(event, EndOfStream):
            return status, data
        else:
            raise AssertionError(event)


async def _stats(endpoint, fence) -> dict:
    status, data = await _request(endpoint, fence, "GET", "/stats")
    assert status == 200
    return json.loads(data)


async def _launched(service, agent, node="gpu-1") -> Fence:
    fence = new_fence()
    await service.contributors.launch(node, "process", standin_job(), fence)
    assert (await agent.providers["process"].wait_ready(fence)).state == "ready"
    return fence


@pytest.mark.deadline(70)
async def test_the_controller_reaches_a_remote_engine_through_the_relayed_endpoint(
    tmp_path, agent_dir
):
    from ficc_core.base.errors import FiccError

    with trio.fail_after(60):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                agent = await nursery.start(
                    RemoteAgent(url, token, process_agent_maker(agent_dir)).run
                )
                await wait_connected(service, "gpu-1")
                fence = await _launched(service, agent)
                endpoint = service.contributors.endpoint("gpu-1")

                # A body larger than one frame travels in pieces and arrives whole.
                body = bytes(range(256)) * 1200  # 300 KiB
                status, data = await _request(
                    endpoint,
                    fence,
                    "POST",
                    "/echo",
                    body,
                    {"content-type": "application/json", "authorization": "Bearer x"},
                )
                echoed = json.loads(data)
                assert status == 200
                assert echoed["body_length"] == len(body)
                assert echoed["body_sha256"] == hashlib.sha256(body).hexdigest()
                assert "authorization" not in echoed["headers"]

                # The node's refusals arrive as the provider's own errors.
                for code, call in [
                    ("path_not_admitted", endpoint.open(fence, "a", "GET", "/admin", {}, b"")),
                    (
                        "stale_fence",
                        endpoint.open(
                            Fence(
                                attempt_id=fence.attempt_id,
                                generation=fence.generation + 1,
                                plan_digest=fence.plan_digest,
                            ),
                            "b",
                            "GET",
                            "/health",
                            {},
                            b"",
                        ),
                    ),
                    ("unknown_attempt", endpoint.open(new_fence(), "c", "GET", "/health", {}, b"")),
                    ("unknown_stream", endpoint.read(fence, "never-opened")),
                ]:
                    with pytest.raises(FiccError) as refused:
                        await call
                    assert refused.value.code == code

                # cancel closes the engine connection before it returns.
                await endpoint.open(fence, "slow", "GET", "/slow", {}, b"")
                assert isinstance(await endpoint.read(fence, "slow"), ResponseHead)
                assert isinstance(await endpoint.read(fence, "slow"), BodyChunk)
                before = (await _stats(endpoint, fence))["disconnects"]
                begin = time.time()
                await endpoint.cancel(fence, "slow")
                while (stats := await _stats(endpoint, fence))["disconnects"] == before:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                assert stats["last_disconnect_at"] - begin < 0.2
                with pytest.raises(FiccError) as gone:
                    await endpoint.read(fence, "slow")
                assert gone.value.code == "unknown_stream"
                assert endpoint.open_streams == 0
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_a_stalled_reader_blocks_the_engine_while_leases_keep_renewing(tmp_path, agent_dir):
    with trio.fail_after(60):
        async with open_controller(tmp_path, lease_duration="1s") as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                fence = await _launched(service, agent)
                endpoint = service.contributors.endpoint("gpu-1")

                # One read is held open (the engine answers /burn after 3 s) ...
                held: list = []

                async def held_read() -> None:
                    await endpoint.open(fence, "burn", "POST", "/burn", {}, b'{"seconds": 3}')
                    held.append(await endpoint.read(fence, "burn"))

                nursery.start_soon(held_read)
                # ... and another stream's reader stalls after the head.
                await endpoint.open(fence, "bulk", "GET", "/stream", {}, b"")
                assert isinstance(await endpoint.read(fence, "bulk"), ResponseHead)
                # Three and a half lease lengths pass with every renewal arriving.
                await lease_carried(agent, fence, 3.5)
                assert agent.expired == []
                assert (await agent.status(fence)).running
                with trio.fail_after(5):
                    await eventually(lambda: held, None, every=0.05)
                assert isinstance(held[0], ResponseHead) and held[0].status == 200

                # Bounded: four events on the controller, the agent waits for credit,
                # and the engine's writes are blocked while renewals keep arriving.
                assert endpoint.held(fence, "bulk") <= 4
                written = (await _stats(endpoint, fence))["stream_bytes"]
                await lease_carried(agent, fence, 0.5)
                assert (await _stats(endpoint, fence))["stream_bytes"] == written
                assert written < 8 * 1024 * 1024
                print("stalled relayed stream: engine wrote", written, "bytes")
                for _ in range(32):
                    event = await endpoint.read(fence, "bulk")
                    assert isinstance(event, BodyChunk) and 0 < len(event.data) <= 65536
                await endpoint.cancel(fence, "bulk")
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_peer_loss_fails_open_streams_at_once_and_cancels_them_on_the_agent(
    tmp_path, agent_dir
):
    with trio.fail_after(60):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(
                    url, token, process_agent_maker(agent_dir), backoff_initial=0.1
                )
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                fence = await _launched(service, agent)
                endpoint = service.contributors.endpoint("gpu-1")
                local = agent.providers["process"]
                before = (await _stats(local, fence))["disconnects"]
                await endpoint.open(fence, "slow", "GET", "/slow", {}, b"")
                assert isinstance(await endpoint.read(fence, "slow"), ResponseHead)
                await eventually(lambda: remote.relay.open_streams == 1, None, every=0.01)

                # The controller drops the connection (as a network failure would).
                service.contributors.drop_connection("gpu-1")
                with trio.fail_after(2):
                    while True:
                        event = await endpoint.read(fence, "slow")
                        if not isinstance(event, BodyChunk):
                            break
                assert isinstance(event, StreamFailed) and event.code == "peer_lost"
                with pytest.raises(Exception) as refused:
                    await endpoint.open(fence, "again", "GET", "/health", {}, b"")
                assert getattr(refused.value, "code", None) == "node_unavailable"

                # The agent cancelled the engine request; nothing was replayed.
                with trio.fail_after(5):
                    while (await _stats(local, fence))["disconnects"] == before:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                assert (await _stats(local, fence))["streams_open"] == 0

                # It reconnects; the new connection's endpoint works.
                await eventually(lambda: remote.sessions >= 2, None, every=0.05)
                await wait_connected(service, "gpu-1")
                status, _ = await _request(
                    service.contributors.endpoint("gpu-1"), fence, "GET", "/health"
                )
                assert status == 200
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(130)
async def test_a_long_stream_and_many_small_requests_pass_the_relay_whole(tmp_path, agent_dir):
    """What the relay carries arrives as the local endpoint gives it (figures: bench/)."""
    with trio.fail_after(120):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                fence = await _launched(service, agent)
                endpoints = {
                    "local": agent.providers["process"],
                    "relay": service.contributors.endpoint("gpu-1"),
                }
                for name, endpoint in endpoints.items():
                    # 16 MiB of an endless stream, in frames of at most 64 KiB.
                    await endpoint.open(fence, f"bulk-{name}", "GET", "/stream", {}, b"")
                    assert isinstance(await endpoint.read(fence, f"bulk-{name}"), ResponseHead)
                    total = 0
                    while total < 16 * 1024 * 1024:
                        event = await endpoint.read(fence, f"bulk-{name}")
                        assert isinstance(event, BodyChunk) and 0 < len(event.data) <= 65536
                        total += len(event.data)
                    await endpoint.cancel(fence, f"bulk-{name}")
                    # Fifty small requests, one after the other, each answered whole.
                    for _ in range(50):
                        status, data = await _request(endpoint, fence, "GET", "/health")
                        assert status == 200 and data
                relay = endpoints["relay"]
                assert relay.open_streams == 0
                with trio.fail_after(5):
                    await eventually(lambda: not remote.relay.open_streams, None, every=0.05)
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_the_embedded_agent_offers_the_same_endpoint(tmp_path):
    from ficc_core.agent.embedded import run_embedded_agent

    agent_dir = Path(tempfile.mkdtemp(prefix="fz-", dir="/tmp"))
    try:
        with trio.fail_after(60):
            async with open_controller(tmp_path, agent_dir=str(agent_dir)) as (service, _):
                async with trio.open_nursery() as nursery:
                    agent = await nursery.start(run_embedded_agent, service)
                    fence = new_fence()
                    await service.contributors.launch("local", "process", standin_job(), fence)
                    await agent.providers["process"].wait_ready(fence)
                    endpoint = service.contributors.endpoint("local")
                    status, data = await _request(endpoint, fence, "POST", "/echo", b"hello")
                    assert status == 200 and json.loads(data)["body_length"] == 5
                    nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(agent_dir, ignore_errors=True)


async def _reconnected(service, node_id: str, previous: str):
    """Wait for the reconciliation of a connection other than ``previous``."""
    while True:
        result = service.contributors.reconciled.get(node_id)
        if result is not None and result.connection_id != previous:
            return result
        await trio.sleep(0.05)


@pytest.mark.deadline(70)
async def test_a_reconnecting_agent_is_reconciled_adopting_wanted_and_stopping_the_rest(
    tmp_path, agent_dir
):
    with trio.fail_after(60):
        async with open_controller(tmp_path) as (service, url):
            registry = service.contributors
            _, token = await registry.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(
                    url, token, process_agent_maker(agent_dir), backoff_initial=0.1
                )
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                first = await _reconnected(service, "gpu-1", "")
                assert first.adopted == () and first.stop == ()

                wanted = await _launched(service, agent)
                stale = await _launched(service, agent)
                given_up = await _launched(service, agent)
                vanished = await _launched(service, agent)
                unknown = new_fence()
                await agent.launch("process", standin_job(), unknown)  # not through the controller
                await registry.store.write(
                    lambda tx: tx.execute(
                        "UPDATE node_assignments SET generation = 2 WHERE attempt_id = ?",
                        (stale.attempt_id,),
                    )
                )
                assert await registry.give_up("gpu-1", given_up.attempt_id)
                await agent.stop(vanished, 1.0)  # gone from the node behind the controller's back

                registry.drop_connection("gpu-1")
                result = await _reconnected(service, "gpu-1", first.connection_id)
                assert result.adopted == (wanted.attempt_id,)
                assert {fence.attempt_id for fence in result.stop} == {
                    stale.attempt_id,
                    given_up.attempt_id,
                    unknown.attempt_id,
                }
                assert result.missing == (vanished.attempt_id,)
                await eventually(
                    lambda: [lease.fence for lease in agent.leases()] == [wanted], None, every=0.05
                )
                assert (await agent.status(wanted)).state == "ready"
                rows = {row.attempt_id: row for row in await registry.assignments("gpu-1")}
                assert rows[wanted.attempt_id].wanted
                assert rows[vanished.attempt_id].reason == "not_reported"
                assert rows[given_up.attempt_id].reason == "given_up"
                nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_an_abandoned_relayed_stream_expires_on_both_sides(tmp_path, agent_dir):
    from ficc_core.base.errors import FiccError

    with trio.fail_after(60):
        async with open_controller(tmp_path) as (service, url):
            _, token = await service.contributors.add_node("gpu-1")
            async with trio.open_nursery() as nursery:
                remote = RemoteAgent(url, token, process_agent_maker(agent_dir))
                agent = await nursery.start(remote.run)
                await wait_connected(service, "gpu-1")
                fence = await _launched(service, agent)
                endpoint = service.contributors.endpoint("gpu-1")
                endpoint.idle_timeout = 0.5
                await endpoint.open(fence, "bulk", "GET", "/stream", {}, b"")
                with trio.fail_after(5):
                    await eventually(
                        lambda: not endpoint.open_streams and (not remote.relay.open_streams),
                        None,
                        every=0.05,
                    )
                with pytest.raises(FiccError) as gone:
                    await endpoint.read(fence, "bulk")
                assert gone.value.code == "unknown_stream"
                with trio.fail_after(5):
                    while (await _stats(endpoint, fence))["streams_open"]:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
