"""`ficc serve` on PostgreSQL (database_url): it starts, creates the first-run admin in
that database (not an SQLite file), answers health, and a restart does not bootstrap
again."""

from __future__ import annotations

import signal

import httpx
import psycopg
import pytest
import trio

from ..support.serve_support import ServeProcess


@pytest.mark.deadline(40)
async def test_serve_with_database_url_runs_on_postgresql_and_bootstraps_once(tmp_path, pg_url):
    settings = tmp_path / "ficc.toml"
    settings.write_text(f'database_url = "{pg_url}"\nfirst_run_secrets = "stdout"\n')
    data = tmp_path / "data"
    server = ServeProcess(data, config=settings)
    try:
        url = await server.wait_ready()
        token = await server.admin_token()
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.get("/api/v1/health")).json()["status"] == "ok"
            whoami = await http.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
            assert whoami.status_code == 200, whoami.text
        server.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(server.proc.wait) == 0
    finally:
        server.kill()

    with psycopg.connect(pg_url) as conn:
        admins = conn.execute("SELECT username FROM users WHERE is_admin = 1").fetchall()
    assert admins == [("admin",)]
    assert not (data / "ficc.sqlite3").exists()

    again = ServeProcess(data, config=settings)
    try:
        url = await again.wait_ready()
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            whoami = await http.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
            assert whoami.status_code == 200
        again.proc.send_signal(signal.SIGTERM)
        output = again.read_rest()
        assert "admin token" not in output
        assert again.proc.returncode == 0
    finally:
        again.kill()
