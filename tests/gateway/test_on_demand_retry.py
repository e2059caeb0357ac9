"""An on-demand request that timed out is served when it comes back after its
``Retry-After``: the replica its wait woke stays up for it (a real controller, an
embedded agent and llama.cpp with SmolLM2), and preview warns when ``idle_timeout``
is shorter than that retry window."""

from __future__ import annotations

import pytest
import trio

from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _activations(controller, service_id: str, outcome: str) -> float:
    text = controller.service.metrics.render()[0].decode()
    for line in text.splitlines():
        if (
            line.startswith("ficc_activations_total{")
            and f'service="{service_id}"' in line
            and f'outcome="{outcome}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.slow
@pytest.mark.deadline(100)
async def test_a_request_that_timed_out_is_served_when_it_retries_after_retry_after(tmp_path):
    with trio.fail_after(90):
        # A 1 s idle timeout (the setting: the spec names none) and no cooldown: without
        # the retry window the woken replica would stop long before the retry comes.
        async with open_inference_controller(
            tmp_path,
            activation_wait=0.05,
            activation_retry=3,
            idle_timeout=1,
            scale_cooldown=0,
        ) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, memory_bytes=512 << 20)
            spec["scaling"] = {"min": 0}

            # Preview warns: idle_timeout 1 s is shorter than Retry-After 3 s + 10 s.
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=spec)
            [warning] = [
                w for w in preview["warnings"] if w["code"] == "idle_timeout_below_retry_window"
            ]
            assert warning["details"] == {
                "idle_timeout": 1,
                "retry_window": 13,
                "path": "$.scaling.idle_timeout",
            }, warning
            assert "Retry-After 3 s" in warning["message"], warning
            longer = {**spec, "scaling": {"min": 0, "idle_timeout": 600}}
            preview = await controller.ok("POST", "/api/v1/inference/preview", json=longer)
            assert all(
                w["code"] != "idle_timeout_below_retry_window" for w in preview.get("warnings", [])
            ), preview

            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "idle")
            issued = await controller.ok(
                "POST",
                f"/api/v1/inference/{service_id}/tokens",
                status=201,
                json={"lifetime": 600},
            )
            route = f"/api/v1/inference/{service_id}/v1/chat/completions"

            refused = await controller.call("POST", route, issued["token"], json=CHAT)
            refused_at = trio.current_time()
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "activation_timeout"
            retry_after = int(refused.headers["Retry-After"])
            assert retry_after == 3
            assert _activations(controller, service_id, "started") == 1

            # The woken replica loads; the client does what it was told and comes back after
            # Retry-After, and not before the replica served nothing for well over its 1 s
            # idle timeout (the autoscaler looks twice a second).
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            ready_at = trio.current_time()
            await trio.sleep_until(max(refused_at + retry_after + 0.5, ready_at + 2.5))
            served = await controller.call("POST", route, issued["token"], json=CHAT)
            assert served.status_code == 200, served.text
            assert served.json()["choices"][0]["message"]["role"] == "assistant"
            # One load served both: the retry did not wake the service a second time.
            assert _activations(controller, service_id, "started") == 1
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["state"] == "ready", view

            # A rollout's preview warns as the service's does.
            preview = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/rollout/preview", json={"spec": spec}
            )
            codes = [w["code"] for w in preview.get("warnings", [])]
            assert "idle_timeout_below_retry_window" in codes, preview
