"""`ficc serve` as a real process: embedded defaults, bootstrap, HTTP, graceful shutdown."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import stat
import tempfile
from contextlib import closing
from pathlib import Path

import httpx
import pytest
import trio

from ..support.serve_support import FICC, ServeProcess, first_run_secrets, make_data_dir


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.deadline(40)
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


@pytest.mark.deadline(60)
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


@pytest.mark.deadline(70)
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
@pytest.mark.deadline(30)
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


@pytest.mark.deadline(60)
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


async def _refused_serve(data_dir, *args: str, **variables: str) -> tuple[int, str]:
    """Run `ficc serve` expecting it to refuse to start; its exit status and stderr."""
    env = {**os.environ, "FICC_DATA_DIR": str(data_dir), **variables}
    env.pop("FICC_CONFIG", None)
    with trio.fail_after(60):
        result = await trio.run_process(
            [*FICC, "serve", *args], capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    return result.returncode, result.stderr.decode()


def _leader_rows(database) -> list[tuple]:
    with closing(sqlite3.connect(database)) as db:
        return db.execute("SELECT holder, term FROM controller_leader").fetchall()


@pytest.mark.deadline(60)
async def test_a_port_in_use_is_one_line_naming_the_flag_and_the_lease_is_never_taken(tmp_path):
    data = tmp_path / "data"
    await trio.to_thread.run_sync(make_data_dir, data)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = await _refused_serve(data, "--port", str(port))
        assert code == 1
        assert "Traceback" not in err
        [line] = err.splitlines()
        assert f"cannot listen on 127.0.0.1:{port}" in line
        assert "already in use" in line and "--port N (FICC_PORT, setting port" in line
        # It bound (and failed) before it opened the store: no leader lease was taken.
        assert await trio.to_thread.run_sync(_leader_rows, data / "ficc.sqlite3") == []

        code, err = await _refused_serve(data, "--port", str(port), "--debug")
        assert code == 1 and "Traceback" in err and "StartupRefused" in err


@pytest.mark.deadline(60)
async def test_a_data_directory_that_cannot_be_written_is_one_line_naming_the_setting(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    code, err = await _refused_serve(tmp_path / "file" / "data", "--port", "0")
    assert code == 1
    assert "Traceback" not in err
    [line] = err.splitlines()
    assert f"cannot write the data directory {tmp_path / 'file' / 'data'}" in line
    assert "--data-dir (FICC_DATA_DIR, setting data_dir)" in line


@pytest.mark.deadline(60)
async def test_a_runtime_directory_too_long_for_engine_sockets_refuses_to_start(tmp_path):
    too_long = "/tmp/" + "r" * 70
    code, err = await _refused_serve(tmp_path / "data", "--port", "0", FICC_RUNTIME_DIR=too_long)
    assert code == 1
    [line] = err.splitlines()
    assert "107-byte limit" in line and "set runtime_dir (--runtime-dir, FICC_RUNTIME_DIR)" in line


@pytest.mark.deadline(70)
async def test_a_remote_executor_refuses_such_a_runtime_directory_before_it_connects():
    too_long = "/tmp/" + "r" * 70
    with trio.fail_after(60):
        result = await trio.run_process(
            [*FICC, "executor", "--runtime-dir", too_long, "--controller", "http://127.0.0.1:9"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "FICC_NODE_CREDENTIAL": "ficc_node_unused"},
        )
    assert result.returncode == 1
    [line] = result.stderr.decode().splitlines()
    assert "107-byte limit" in line and "(--runtime-dir, FICC_RUNTIME_DIR)" in line


@pytest.mark.deadline(60)
async def test_a_store_that_cannot_be_reached_is_one_line_naming_the_database_url(tmp_path):
    url = "postgresql://ficc@127.0.0.1:9/ficc"  # nothing listens on the discard port
    code, err = await _refused_serve(tmp_path / "data", "--port", "0", "--database-url", url)
    assert code == 1
    assert "Traceback" not in err
    [line] = err.splitlines()
    assert line.startswith("Error: cannot open the store:")
    assert "--database-url (FICC_DATABASE_URL, setting database_url)" in line


def _modes(data_dir) -> dict[str, int]:
    return {
        path.name: stat.S_IMODE(path.stat().st_mode)
        for path in data_dir.iterdir()
        if path.name.startswith("ficc.sqlite3")
    }


@pytest.mark.deadline(60)
async def test_the_database_and_its_wal_files_are_private_to_this_user(tmp_path):
    server = ServeProcess(tmp_path / "data")
    try:
        await server.wait_ready()
        modes = await trio.to_thread.run_sync(_modes, tmp_path / "data")
    finally:
        server.proc.terminate()
        server.kill()
    names = ("ficc.sqlite3", "ficc.sqlite3-wal", "ficc.sqlite3-shm")
    assert modes == dict.fromkeys(names, 0o600)


@pytest.mark.slow
@pytest.mark.deadline(610)
async def test_a_long_home_serves_a_real_llama_cpp_chat(tmp_path, monkeypatch):
    """HOME of 110 characters (LDAP homes, nested CI workspaces), the default data
    directory under it: the engine's socket still fits, so the service starts and chats."""
    from ..support.models_support import smollm2_path

    home = Path(tempfile.mkdtemp(prefix="home-", dir="/tmp"))
    home = home / ("h" * (110 - len(str(home)) - 1))
    assert len(str(home)) == 110
    monkeypatch.setenv("HOME", str(home))
    for variable in [name for name in os.environ if name.startswith(("FICC_", "XDG_DATA"))]:
        monkeypatch.delenv(variable)
    server = ServeProcess(home / ".local" / "share" / "ficc")
    ficc = server.cli()
    try:
        with trio.fail_after(600):
            _, secrets_file = await server.log_in_admin(ficc)
            assert secrets_file.is_relative_to(home)
            await ficc("models", "add", str(smollm2_path()))
            await ficc(
                "inference", "create", "--model", "smollm2", "--engine", "llama_cpp",
                "--replicas", "1", "--yes", "--wait",
            )  # fmt: skip
            service = json.loads(await ficc("inference", "show", "smollm2", "--json"))
            assert [r["state"] for r in service["replicas"]] == ["ready"]
            answer = await ficc(
                "inference", "chat", "smollm2", "--message", "Say hello.", "--max-tokens", "8"
            )
            assert answer.strip()
    finally:
        server.proc.terminate()
        server.kill()
        shutil.rmtree(home.parent, ignore_errors=True)
