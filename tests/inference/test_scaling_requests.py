"""On-demand services driven by client requests, end to end with the real llama.cpp engine:
a request wakes an idle service once, it serves, goes idle again after its idle timeout
(reservations released, re-taken at the next wake), a failed activation answers every
waiter at once, the bound answers 503 with Retry-After, a streaming request gets SSE
keepalive comments while it waits, and a client that leaves does not cancel the wake.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ..support.inference_support import (
    Controller,
    broken_engine,
    open_inference_controller,
    write_agent_settings,
)
from ..support.inference_support import register_smollm2 as register
from .test_scaling_core import create, events, live_until, reserved

pytestmark = pytest.mark.slow

FAST = {"scale_cooldown": "0s", "activation_retry": "30s"}
CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}


async def started(controller: Controller, service_id: str) -> str:
    """Start the on-demand service; once it is idle, return an invoke token for it."""
    assert (await controller.control(service_id, "start")).status_code == 200
    await controller.wait_service(service_id, lambda v: v["state"] == "idle")
    await live_until(controller, service_id, lambda v: v.activation == "idle")
    issued = await controller.ok(
        "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 600}
    )
    return issued["token"]


async def chat(controller: Controller, service_id: str, token: str, **extra: Any) -> httpx.Response:
    return await controller.http.post(
        f"/api/v1/inference/{service_id}/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={**CHAT, **extra},
        timeout=120,
    )


def attempts_of(view: dict[str, Any]) -> list[int]:
    return [r["attempt"] for r in view["replicas"] if r["attempt"] is not None]


@pytest.mark.deadline(160)
async def test_a_request_wakes_an_idle_service_which_goes_idle_again(tmp_path: Path) -> None:
    with trio.fail_after(150):
        # The idle_timeout setting, not the specification's (at least 10 s there).
        async with open_inference_controller(tmp_path, **FAST, idle_timeout="2s") as controller:
            model_id = await register(controller)
            created = await create(controller, model_id, min=0)
            service_id = created["id"]
            token = await started(controller, service_id)
            models = await controller.http.get(
                f"/api/v1/inference/{service_id}/v1/models",
                headers={"Authorization": f"Bearer {token}"},
            )
            assert models.status_code == 200 and models.json()["data"][0]["id"] == "smol"

            answered = await chat(controller, service_id, token)
            assert answered.status_code == 200, answered.text
            assert answered.json()["choices"][0]["message"]["content"] is not None
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["state"] == "ready" and reserved(view) == [0]

            # Nothing for the idle timeout: it stops, holds nothing, and says why.
            idle = await controller.wait_service(
                service_id, lambda v: v["state"] == "idle" and not reserved(v)
            )
            assert idle["scaling"]["active"] == []
            # Its attempt's end says why: the service went idle, nothing superseded it.
            assert [(r["state"], r["reason"]) for r in idle["replicas"]] == [("stopped", "idle")]
            last = (await events(controller, service_id))[-1]
            assert last["reason"] == "idle" and last["details"]["idle_timeout"] == 2
            assert last["details"]["idle_for"] >= 2

            again = await chat(controller, service_id, token)
            assert again.status_code == 200, again.text
            woken = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert reserved(woken) == [0] and attempts_of(woken) == [2]
            reasons = [e["reason"] for e in await events(controller, service_id)]
            assert reasons == ["activation", "idle", "activation"]


@pytest.mark.deadline(190)
async def test_fifty_concurrent_requests_to_an_idle_service_launch_it_once(
    tmp_path: Path,
) -> None:
    with trio.fail_after(180):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register(controller)
            service_id = (await create(controller, model_id, min=0))["id"]
            token = await started(controller, service_id)
            statuses: list[int] = []

            async def one() -> None:
                statuses.append((await chat(controller, service_id, token)).status_code)

            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(one)
            assert statuses == [200] * 50
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert attempts_of(view) == [1]
            assert [e["reason"] for e in await events(controller, service_id)] == ["activation"]


@pytest.mark.deadline(130)
async def test_a_failed_activation_answers_every_waiter_at_once(tmp_path: Path) -> None:
    engine, settings = broken_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), activation_wait="60s", **FAST
        ) as controller:
            model_id = await register(controller)
            service_id = (await create(controller, model_id, engine, min=0))["id"]
            token = await started(controller, service_id)
            answers: list[httpx.Response] = []
            began = trio.current_time()

            async def one() -> None:
                answers.append(await chat(controller, service_id, token))

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(one)
            took = trio.current_time() - began
            assert took < 30  # the reason, not the 60 s bound
            for answer in answers:
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["code"] == "activation_failed"
                assert "failed to load" in answer.json()["error"]["message"]
                assert int(answer.headers["Retry-After"]) >= 1
            view = await controller.wait_service(
                service_id, lambda v: v["state"] == "idle" and not reserved(v)
            )
            assert attempts_of(view) == [1]  # one launch for the five


@pytest.mark.deadline(100)
async def test_the_activation_wait_is_bounded(tmp_path: Path) -> None:
    slow = tmp_path / "slow-llama-server"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")  # never becomes ready
    slow.chmod(0o755)
    settings = write_agent_settings(tmp_path, slow)
    with trio.fail_after(90):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), activation_wait="1500ms", **FAST
        ) as controller:
            model_id = await register(controller)
            service_id = (await create(controller, model_id, slow, min=0))["id"]
            token = await started(controller, service_id)
            began = trio.current_time()
            answer = await chat(controller, service_id, token)
            took = trio.current_time() - began
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "activation_timeout"
            assert int(answer.headers["Retry-After"]) >= 1
            assert 1.4 <= took < 10


@pytest.mark.deadline(130)
async def test_a_streaming_request_gets_keepalives_and_a_leaving_client_cancels_nothing(
    tmp_path: Path,
) -> None:
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, activation_keepalive="100ms", **FAST
        ) as controller:
            model_id = await register(controller)
            service_id = (await create(controller, model_id, min=0))["id"]
            token = await started(controller, service_id)
            url = f"/api/v1/inference/{service_id}/v1/chat/completions"
            headers = {"Authorization": f"Bearer {token}"}
            # A client that leaves at its first keepalive: the activation goes on.
            async with controller.http.stream(
                "POST", url, headers=headers, json={**CHAT, "stream": True}
            ) as leaving:
                assert leaving.status_code == 200
                async for line in leaving.aiter_lines():
                    assert line.startswith(":"), line  # a comment before anything else
                    break
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            # Idle again (stop and start), then a streaming request that stays.
            assert (await controller.control(service_id, "stop")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            assert (await controller.control(service_id, "start")).status_code == 200
            await live_until(controller, service_id, lambda v: v.activation == "idle")
            comments, chunks = 0, []
            async with controller.http.stream(
                "POST", url, headers=headers, json={**CHAT, "stream": True}
            ) as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith(":"):
                        assert not chunks, "a keepalive after the answer began"
                        comments += 1
                    elif line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:]))
            assert comments >= 1 and chunks
            assert chunks[0]["object"] == "chat.completion.chunk"


@pytest.mark.deadline(160)
async def test_an_idle_service_wakes_on_a_request_after_a_controller_restart(
    tmp_path: Path,
) -> None:
    with trio.fail_after(150):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register(controller)
            service_id = (await create(controller, model_id, min=0))["id"]
            token = await started(controller, service_id)
        async with open_inference_controller(tmp_path, **FAST) as controller:
            await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            await live_until(controller, service_id, lambda v: v.activation == "idle")
            answered = await chat(controller, service_id, token)
            assert answered.status_code == 200, answered.text
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["state"] == "ready" and reserved(view) == [0]
