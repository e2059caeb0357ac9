"""`ficc serve` as a real process: embedded defaults, bootstrap, HTTP, graceful shutdown."""

from __future__ import annotations

import json
import re
import signal
import stat

import httpx
import pytest
import trio

from .serve_support import FICC, ServeProcess, first_run_secrets


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
        # The secrets are in a file only this user reads, never in the captured output.
        secrets_file = tmp_path / "data" / "first-run-secrets"
        assert f"secrets file: {secrets_file}" in output, output
        assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
        written = first_run_secrets(secrets_file)
        token, password = written["admin token"], written["admin password"]
        assert token.startswith("ficc_") and len(password) >= 8
        assert token not in output and password not in output
        assert "admin token" not in output and "admin password" not in output
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


async def test_first_run_secrets_stdout_prints_them_in_the_banner_instead(tmp_path):
    server = ServeProcess(tmp_path / "data", "--first-run-secrets", "stdout")
    try:
        url = await server.wait_ready()
        token = await server.admin_token()
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            whoami = await http.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert whoami.status_code == 200
        assert re.search(r"admin password:\s+\S+", "".join(server.lines))
        assert not (tmp_path / "data" / "first-run-secrets").exists()
    finally:
        server.proc.terminate()
        server.kill()


async def test_graceful_shutdown_lets_an_in_flight_request_finish(tmp_path):
    server = ServeProcess(tmp_path / "data", "--shutdown-grace", "10")
    try:
        url = await server.wait_ready()
        host, port = url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps(
            {"username": "admin", "password": "not-the-password", "project": "default"}
        ).encode()
        with trio.fail_after(30):
            sock = await trio.open_tcp_stream(host, int(port))
            async with sock:
                # "Expect: 100-continue": the server's interim 100 says the request has
                # reached the app, so SIGTERM lands while it is in flight (no guessed sleep).
                await sock.send_all(
                    b"POST /api/v1/session HTTP/1.1\r\nHost: ficc\r\n"
                    b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                )
                received = b""
                while b"\r\n\r\n" not in received:
                    chunk = await sock.receive_some()
                    assert chunk, "the server closed the connection before its 100"
                    received += chunk
                assert received.startswith(b"HTTP/1.1 100")
                server.proc.send_signal(signal.SIGTERM)
                await sock.send_all(body)
                answer = received.partition(b"\r\n\r\n")[2]
                while b"\r\n\r\n" not in answer:
                    chunk = await sock.receive_some()
                    assert chunk, "the server closed the connection before answering"
                    answer += chunk
        assert answer.startswith(b"HTTP/1.1 401"), answer
        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(server.proc.wait) == 0
    finally:
        server.kill()


@pytest.mark.parametrize("path", ["/api/v1/health", "/v1/models"])
async def test_sigterm_closes_an_idle_keep_alive_connection_at_once(tmp_path, path):
    """A client's kept-alive connection, idle after its request, does not hold the exit
    for the grace: a Quart route's, and the invoke routes' (plain ASGI, /v1/models).

    Both apps wait for the client's disconnect while they send: the one their own last
    send caused cancelled that send before hypercorn marked the connection idle again.
    """
    server = ServeProcess(tmp_path / "data", "--shutdown-grace", "60")
    try:
        url = await server.wait_ready()
        token = await server.admin_token()
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=30) as http:
            answer = await http.get(path)
            assert answer.status_code == 200, answer.text
            # The client keeps its connection open, idle, while the server shuts down.
            server.proc.send_signal(signal.SIGTERM)
            with trio.fail_after(20):  # a hang guard: without the fix it took the 60 s grace
                code = await trio.to_thread.run_sync(server.proc.wait, abandon_on_cancel=True)
        assert code == 0
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
