"""The scraper against real engines: llama.cpp's /metrics read through the endpoint action.

A real controller (reconciler, embedded agent, hypercorn) runs SmolLM2 under the
``ficc-llama-server`` runtime; the gateway's background scraper reads the replica's
``/metrics`` as the routing does. The stand-in engine of the gateway tests admits no
``/metrics`` (like Ollama): its replicas are routed by the gateway's in-flight count.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from ficc_core.gateway.scrape import EngineLoad, parse_load
from ficc_core.testing.executor_kit import exchange

from ..support.gateway_support import chat, gateway_env
from ..support.inference_support import open_inference_controller, ready_service, register_smollm2
from ..support.waiting import eventually

LONG = {"role": "user", "content": "Write a very long story about a lighthouse keeper."}


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_the_scraper_reads_a_real_llama_cpp_engines_load_through_the_endpoint(tmp_path):
    with trio.fail_after(240):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(controller, model_id, concurrency=2)
            [replica] = controller.service.live.get(service_id).replicas
            # The parser against the real runtime's text.
            endpoint = controller.service.contributors.endpoint(replica.node_id)
            status, _, chunks = await exchange(endpoint, replica.fence, "GET", "/metrics")
            assert status == 200
            assert parse_load(b"".join(chunks).decode()) == EngineLoad(running=0, waiting=0)
            # The gateway's own scraper reads it in the background.
            scraper = controller.service.gateway.router.scraper
            assert scraper is not None
            await eventually(lambda: replica.key in scraper.replicas, 10)
            known = scraper.replicas[replica.key]
            await eventually(lambda: known.load is not None, 10)
            assert not known.unscraped
            # A streamed answer in flight shows as one running request at the next read.
            async with (
                httpx.AsyncClient(base_url=controller.url, timeout=60) as http,
                http.stream(
                    "POST",
                    f"/api/v1/inference/{service_id}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {token}"},
                    json={"messages": [LONG], "stream": True, "max_tokens": 400},
                ) as response,
            ):
                assert response.status_code == 200
                await eventually(lambda: known.load.running == 1, 20)
                assert known.local_at == 1  # the gateway's own count at that read
                metrics = controller.service.metrics.registry
                labels = {"service": service_id, "replica": replica.key}
                running = "ficc_gateway_engine_running_requests"
                assert metrics.get_sample_value(running, labels) == 1
            await eventually(lambda: known.load.running == 0, 20)


@pytest.mark.deadline(70)
async def test_an_engine_that_admits_no_metrics_is_routed_by_in_flight_alone(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            first, second = await env.launch(), await env.launch()
            view = env.publish("svc", [first, second])
            scraper = env.gateway.router.scraper
            assert scraper is not None
            keys = [replica.key for replica in view.replicas]
            await eventually(
                lambda: all(k in scraper.replicas and scraper.replicas[k].unscraped for k in keys),
                10,
            )
            _, token = await env.token("svc")
            async with env.http(token) as http:
                for _ in range(4):
                    answer = await http.post(
                        "/api/v1/inference/svc/v1/chat/completions", json=chat()
                    )
                    assert answer.status_code == 200, answer.text
            failures = "ficc_gateway_engine_scrape_failures_total"
            registry = env.service.metrics.registry
            for key in keys:
                assert (
                    registry.get_sample_value(failures, {"service": "svc", "replica": key}) is None
                )
