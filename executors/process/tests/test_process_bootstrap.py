"""Bootstrap requests: sent by the executor after readiness, before the attempt is ready."""

from __future__ import annotations

import hashlib

import attrs
import trio

from ficc_core import BootstrapRequest, EndpointContract, JobInput
from ficc_core.testing import executor_kit as kit
from ficc_core.testing.standin_engine import BLOBS, ROUTES


def _bootstrapped_job(tmp_path, *, upload_digest: str | None = None, port: int | None = None):
    weights = b"GGUF" + bytes(range(256)) * 1000
    model = tmp_path / "model.gguf"
    model.write_bytes(weights)
    digest = hashlib.sha256(weights).hexdigest()
    blob = BLOBS + (upload_digest or digest)
    base = kit.standin_job(port=port, inputs=(JobInput(id="model", path=str(model)),))
    paths = (*ROUTES, blob)
    endpoint = EndpointContract.unix(paths) if port is None else EndpointContract.tcp(port, paths)
    job = attrs.evolve(
        base,
        endpoint=endpoint,
        bootstrap=(
            BootstrapRequest(path=blob, input_id="model", expect=(201,)),
            BootstrapRequest(path="/setup", body={"model": "m", "files": {"m.gguf": digest}}),
        ),
    )
    return job, digest, len(weights)


async def test_bootstrap_uploads_the_input_and_sends_the_requests_in_order(provider, tmp_path):
    job, digest, size = _bootstrapped_job(tmp_path)
    with trio.fail_after(30):
        async with kit.launched(provider, job) as fence:
            status, received = await kit.request_json(provider, fence, "GET", "/received")
    assert status == 200
    assert received == [
        {"path": BLOBS + digest, "length": size, "sha256": digest},
        {"path": "/setup", "body": {"model": "m", "files": {"m.gguf": digest}}},
    ]


async def test_bootstrap_works_over_tcp_in_the_attempts_network_namespace(provider, tmp_path):
    job, digest, _ = _bootstrapped_job(tmp_path, port=8080)
    with trio.fail_after(30):
        async with kit.launched(provider, job) as fence:
            _, received = await kit.request_json(provider, fence, "GET", "/received")
    assert [item["path"] for item in received] == [BLOBS + digest, "/setup"]


async def test_a_refused_bootstrap_request_fails_the_attempt_and_names_it(provider, tmp_path):
    job, _, _ = _bootstrapped_job(tmp_path, upload_digest="0" * 64)
    with trio.fail_after(30):
        fence = kit.new_fence()
        await provider.launch(job, fence)
        status = await provider.wait_ready(fence)
        assert status.state == "failed"
        assert status.reason == "bootstrap_failed"
        assert f"bootstrap request 1 (POST {BLOBS}{'0' * 64}) answered 400" in status.message
        assert "digest mismatch" in status.message
        ended = await provider.wait_ended(fence)
    assert ended.state == "failed" and ended.reason == "bootstrap_failed"


async def test_an_engine_without_bootstrap_is_ready_as_before(provider):
    with trio.fail_after(30):
        async with kit.launched(provider, kit.standin_job()) as fence:
            _, received = await kit.request_json(provider, fence, "GET", "/received")
    assert received == []
