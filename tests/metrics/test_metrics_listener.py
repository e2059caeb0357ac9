"""`/metrics` of a real `ficc serve`: on the API by default, on its own listener alone
once `metrics_listen` is set (a scraper reaches it without reaching the API)."""

from __future__ import annotations

import signal

import httpx
import pytest
import trio

from ..support.serve_support import ServeProcess

ROUTE_SAMPLE = 'ficc_http_requests_total{method="GET",route="/api/v1/health",status="200"} 1.0'


async def _stop(server: ServeProcess) -> None:
    server.proc.send_signal(signal.SIGTERM)
    with trio.fail_after(30):
        assert await trio.to_thread.run_sync(server.proc.wait) == 0


@pytest.mark.deadline(60)
async def test_by_default_the_api_listener_serves_metrics_without_a_credential(tmp_path):
    server = ServeProcess(tmp_path / "data", "--no-embedded-agent")
    try:
        url = await server.wait_ready()
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.get("/api/v1/health")).status_code == 200
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200
            assert metrics.headers["Content-Type"].startswith("text/plain")
            assert ROUTE_SAMPLE in metrics.text
        await _stop(server)
        assert "metrics on" not in server.read_rest()
    finally:
        server.kill()


@pytest.mark.deadline(60)
async def test_metrics_listen_moves_metrics_off_the_api_to_a_listener_of_their_own(tmp_path):
    server = ServeProcess(
        tmp_path / "data", "--no-embedded-agent", "--metrics-listen", "127.0.0.1:0"
    )
    try:
        url = await server.wait_ready()
        metrics_url = await server.metrics_url()
        token = await server.admin_token()
        assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics")
        assert metrics_url.rsplit(":", 1)[1] != url.rsplit(":", 1)[1]
        async with httpx.AsyncClient(timeout=10) as http:
            # The API still answers, but no longer serves /metrics to anyone.
            assert (await http.get(f"{url}/api/v1/health")).status_code == 200
            for headers in ({}, {"Authorization": f"Bearer {token}"}):
                gone = await http.get(f"{url}/metrics", headers=headers)
                assert gone.status_code == 404
                assert gone.json()["error"]["code"] == "not_found"

            # The metrics listener serves the same registry, without a credential...
            scraped = await http.get(metrics_url)
            assert scraped.status_code == 200
            assert scraped.headers["Content-Type"].startswith("text/plain")
            assert scraped.headers["Cache-Control"] == "no-store"
            assert ROUTE_SAMPLE in scraped.text
            head = await http.head(metrics_url)
            assert head.status_code == 200 and head.content == b""

            # ...and nothing else: the API's routes are not there, with or without a token.
            base = metrics_url.removesuffix("/metrics")
            for path in ("/api/v1/health", "/api/v1/whoami", "/", "/metrics/"):
                absent = await http.get(base + path, headers={"Authorization": f"Bearer {token}"})
                assert absent.status_code == 404, path
                assert absent.json()["error"]["code"] == "not_found"
            refused = await http.post(metrics_url, content=b"x")
            assert refused.status_code == 405
            assert refused.headers["Allow"] == "GET, HEAD"
            assert refused.json()["error"]["details"] == {"allowed": ["GET", "HEAD"]}
        await _stop(server)
    finally:
        server.kill()
