"""`ficc serve` as a real process: embedded defaults, bootstrap, HTTP, graceful shutdown."""

from __future__ import annotations

import re
import signal

import httpx
import pytest
import trio

from .serve_support import FICC, ServeProcess


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_serve_starts_with_defaults_bootstraps_once_and_stops_on_signal(tmp_path, signum):
    server = ServeProcess(tmp_path / "data")
    try:
        url = await server.wait_ready()
        assert url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.get("/api/v1/health")).json()["status"] == "ok"
        server.proc.send_signal(signum)
        with trio.fail_after(30):
            code = await trio.to_thread.run_sync(server.proc.wait)
        assert code == 0
        output = server.read_rest()
        match = re.search(r"admin token:\s+(\S+)", output)
        assert match, output
        token = match.group(1)
        assert re.search(r"admin password:\s+\S+", output)
    finally:
        server.kill()

    again = ServeProcess(tmp_path / "data")
    try:
        url = await again.wait_ready()
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            whoami = await http.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
            assert whoami.status_code == 200
            assert whoami.json()["project"]["name"] == "default"
        again.proc.send_signal(signal.SIGTERM)
        output = again.read_rest()
        assert "admin token" not in output
        assert "ficc admin create-token" in output
        assert again.proc.returncode == 0
    finally:
        again.kill()


async def test_graceful_shutdown_lets_an_in_flight_request_finish(tmp_path):
    server = ServeProcess(tmp_path / "data", "--shutdown-grace", "10")
    try:
        url = await server.wait_ready()
        async with httpx.AsyncClient(base_url=url, timeout=20) as http:
            results = []

            async def slow_login() -> None:
                # argon2 verification keeps this request in flight for a moment.
                response = await http.post(
                    "/api/v1/session",
                    json={
                        "username": "admin",
                        "password": "not-the-password",
                        "project": "default",
                    },
                )
                results.append(response.status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow_login)
                await trio.sleep(0.01)
                server.proc.send_signal(signal.SIGTERM)
        assert results == [401]
        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(server.proc.wait) == 0
    finally:
        server.kill()


async def test_serve_refuses_a_bad_configuration_clearly(tmp_path):
    config = tmp_path / "ficc.toml"
    config.write_text("colour = 'blue'\n")
    result = await trio.run_process(
        [*FICC, "--config", str(config), "serve"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode != 0
    assert b"unknown setting(s) colour" in result.stderr
