"""The gateway end to end through the reconciler: real llama.cpp engines and SmolLM2.

Services are created and started over the management API, the reconciler
launches the engines through the embedded agent and publishes them; clients use
the official openai client with a service-bound token.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest
import trio
from openai import APIError, OpenAI

from ficc_core.testing.executor_kit import exchange
from ficc_core.testing.models import with_mean_pooling

from ..support.inference_support import (
    engine_pid,
    open_inference_controller,
    ready_service,
    register_gguf,
    register_smollm2,
)
from ..support.models_support import smollm2_path

LONG = {"role": "user", "content": "Write a very long story about a lighthouse keeper."}


def _client(controller, service_id: str, token: str) -> OpenAI:
    return OpenAI(
        base_url=f"{controller.url}/api/v1/inference/{service_id}/v1",
        api_key=token,
        max_retries=0,
        timeout=60,
    )


async def _processing(controller, service_id: str) -> list[int]:
    """llama.cpp's ``requests_processing`` of each ready replica, read through the executor."""
    found = []
    for replica in controller.service.live.get(service_id).replicas:
        endpoint = controller.service.contributors.endpoint(replica.node_id)
        status, _, chunks = await exchange(endpoint, replica.fence, "GET", "/metrics")
        assert status == 200
        for line in b"".join(chunks).decode().splitlines():
            if line.startswith("llamacpp:requests_processing "):
                found.append(int(float(line.split()[1])))
    return found


async def _stream_until_cut(client: OpenAI, started: trio.Event, cut: trio.Event, box: dict):
    """Stream a long answer in a worker thread; record when it ended and how."""

    def run() -> None:
        pieces = 0
        try:
            stream = client.chat.completions.create(
                # Within the 512-token context: a longer ask is refused before a slot.
                model="smol",
                stream=True,
                max_tokens=400,
                messages=[LONG],
            )
            for _chunk in stream:
                pieces += 1
                if pieces == 3:
                    trio.from_thread.run_sync(started.set)
            box["outcome"] = "ended"
        except APIError as exc:
            box["outcome"] = f"error: {exc.message}"
        box["pieces"] = pieces
        box["ended_at"] = trio.from_thread.run_sync(trio.current_time)

    await trio.to_thread.run_sync(run)
    cut.set()


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_openai_client_streams_spreads_and_is_cut_by_revocation_and_stop(tmp_path):
    with trio.fail_after(240):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, credential_id = await ready_service(
                controller, model_id, node_ids=("local", "local"), cpus=0.5, concurrency=2
            )
            client = _client(controller, service_id, token)

            models = await trio.to_thread.run_sync(lambda: client.models.list().data)
            assert [m.id for m in models] == ["smol"]

            def stream_once() -> str:
                text = ""
                for chunk in client.chat.completions.create(
                    model="smol",
                    stream=True,
                    max_tokens=8,
                    messages=[{"role": "user", "content": "Hi"}],
                ):
                    if chunk.choices:
                        text += chunk.choices[0].delta.content or ""
                return text

            assert await trio.to_thread.run_sync(stream_once)
            # Requests spread across both replicas.
            gateway = controller.service.gateway
            before = len(gateway.usage)
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(trio.to_thread.run_sync, stream_once)
            used = {record.replica for record in list(gateway.usage)[before:]}
            assert len(used) == 2
            # Usage is kept per service and credential, off the request path.
            usage = await controller.ok("GET", f"/api/v1/inference/{service_id}/usage")
            assert usage["totals"]["requests"] == 7
            assert usage["totals"]["errors"] == 0
            assert usage["totals"]["prompt_tokens"] > 0
            assert 7 <= usage["totals"]["completion_tokens"] <= 7 * 8
            assert [c["credential_id"] for c in usage["by_credential"]] == [credential_id]
            latest = usage["recent"][0]
            assert latest["outcome"] == "ok" and latest["ttfb"] <= latest["duration"]

            # Revoking the token mid-stream ends it within a second; the engine's slot frees.
            started, cut, box = trio.Event(), trio.Event(), {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stream_until_cut, client, started, cut, box)
                await started.wait()
                revoked_at = trio.current_time()
                await controller.ok(
                    "DELETE", f"/api/v1/inference/{service_id}/tokens/{credential_id}"
                )
                await cut.wait()
            assert box["ended_at"] - revoked_at < 1.0, box
            assert box["outcome"] != "ended" or box["pieces"] < 2000
            with trio.fail_after(2):
                while sum(await _processing(controller, service_id)):  # noqa: ASYNC110
                    await trio.sleep(0.05)

            # Stopping the service mid-stream likewise.
            issued = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 600}
            )
            client = _client(controller, service_id, issued["token"])
            started, cut, box = trio.Event(), trio.Event(), {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stream_until_cut, client, started, cut, box)
                await started.wait()
                stopped_at = trio.current_time()
                assert (await controller.control(service_id, "stop")).status_code == 200
                await cut.wait()
            assert box["ended_at"] - stopped_at < 1.0, box
            await controller.wait_service(service_id, lambda v: v["state"] == "stopped")


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_a_killed_engine_ends_its_stream_with_an_error_and_the_replica_comes_back(tmp_path):
    with trio.fail_after(240):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(controller, model_id)
            client = _client(controller, service_id, token)
            [replica] = controller.service.live.get(service_id).replicas
            agent_dir = Path(controller.service.config.agent_path)
            pid = await trio.to_thread.run_sync(engine_pid, agent_dir, replica.fence.attempt_id)

            started, cut, box = trio.Event(), trio.Event(), {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stream_until_cut, client, started, cut, box)
                await started.wait()
                killed_at = trio.current_time()
                os.kill(pid, signal.SIGKILL)
                await cut.wait()
            assert box["outcome"].startswith("error"), box
            assert box["ended_at"] - killed_at < 5.0
            # The reconciler notices, and a new attempt serves again.
            view = await controller.wait_service(
                service_id,
                lambda v: v["state"] == "ready" and v["replicas"][0]["attempt"] >= 2,
            )
            assert view["replicas"][0]["attempt_id"] != replica.fence.attempt_id
            answer = await trio.to_thread.run_sync(
                lambda: client.chat.completions.create(
                    model="smol", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
                )
            )
            assert answer.choices[0].message.content is not None


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_embeddings_are_served_by_a_service_of_an_embedding_model(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="fe-embed-"))
    path = folder / "SmolLM2-135M-Instruct.mean-pooling.gguf"
    try:
        await trio.to_thread.run_sync(with_mean_pooling, smollm2_path(), path)
        with trio.fail_after(240):
            async with open_inference_controller(tmp_path) as controller:
                model_id = await register_gguf(controller, path, "smollm2-embed")
                service_id, token, _ = await ready_service(controller, model_id)
                client = _client(controller, service_id, token)
                answer = await trio.to_thread.run_sync(
                    lambda: client.embeddings.create(
                        model="smol", input=["a red apple", "a green pear"]
                    )
                )
                vectors = [item.embedding for item in answer.data]
                assert [len(v) for v in vectors] == [576, 576]
                assert vectors[0] != vectors[1]
                # The same service serves no chat: a clear 4xx the client can read.
                with pytest.raises(APIError) as refused:
                    await trio.to_thread.run_sync(
                        lambda: client.chat.completions.create(
                            model="smol", messages=[{"role": "user", "content": "Hi"}]
                        )
                    )
                assert "chat" in refused.value.message
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.deadline(410)
async def test_a_chat_sent_once_drain_or_stop_answered_is_refused_never_served(tmp_path):
    """The gateway acts on a control action's answer, not on the reconciler's next step."""
    with trio.fail_after(400):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(controller, model_id)
            chat_path = f"/api/v1/inference/{service_id}/v1/chat/completions"
            hello = {
                "model": "smol",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "Hi"}],
            }
            assert (
                await controller.call("POST", chat_path, token=token, json=hello)
            ).status_code == 200
            live = controller.service.live
            for iteration in range(20):
                action = "drain" if iteration % 2 == 0 else "stop"
                # A request counted in flight keeps the drain waiting (drain_timeout).
                with live.request(service_id):
                    assert (await controller.control(service_id, action)).status_code == 200
                    response = await controller.call("POST", chat_path, token=token, json=hello)
                expected = "service_draining" if action == "drain" else "service_stopped"
                assert response.status_code == 503, (iteration, response.text)
                assert response.json()["error"]["code"] == expected
                if action == "drain":
                    assert int(response.headers["Retry-After"]) >= 1
                await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
                assert (await controller.control(service_id, "start")).status_code == 200
                await controller.wait_service(
                    service_id,
                    lambda v: (
                        v["state"] == "ready"
                        and bool(controller.service.live.get(service_id).replicas)
                    ),
                )
