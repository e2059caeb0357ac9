"""Signup, approval and a password reset through a real `ficc serve` and the real
`ficc admin users` commands run against its data directory."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from ..support.serve_support import ServeProcess

PASSWORD = "correct horse battery"


def _refusal(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


@pytest.mark.deadline(130)
async def test_a_signup_waits_for_the_cli_approval_and_a_cli_reset_ends_its_sessions(tmp_path):
    data_dir = tmp_path / "data"
    config = tmp_path / "ficc.toml"
    config.write_text("signup_open = true\n")
    server = ServeProcess(data_dir, config=config)
    ficc = server.cli()
    try:
        url = await server.wait_ready()
        with trio.fail_after(120):
            async with httpx.AsyncClient(base_url=url, timeout=10) as browser:
                signup = {"username": "alice", "password": PASSWORD}
                made = await browser.post("/api/v1/signup", json=signup)
                assert made.status_code == 201, made.text
                assert made.json()["status"] == "pending"
                _refusal(await browser.post("/api/v1/signup", json=signup), 409, "user_exists")

                # Pending: a wrong password is just wrong; the right one hears it waits.
                _refusal(
                    await browser.post(
                        "/api/v1/session", json={"username": "alice", "password": "not it at all"}
                    ),
                    401,
                    "invalid_login",
                )
                _refusal(await browser.post("/api/v1/session", json=signup), 403, "account_pending")
                listed = json.loads(await ficc("admin", "users", "list", "--json"))
                assert {u["username"]: u["status"] for u in listed}["alice"] == "pending"

                approved = await ficc("admin", "users", "approve", "alice")
                assert "is active" in approved
                assert "alice" in await ficc("admin", "users", "list")
                login = await browser.post("/api/v1/session", json=signup)
                assert login.status_code == 201, login.text
                csrf = {"X-CSRF-Token": login.json()["csrf_token"]}
                minted = await browser.post("/api/v1/me/tokens", json={"name": "cli"}, headers=csrf)
                assert minted.status_code == 201, minted.text
                key = {"Authorization": f"Bearer {minted.json()['token']}"}
                assert (await browser.get("/api/v1/whoami", headers=key)).json()["personal"]

                reset = await ficc(
                    "admin", "users", "reset-password", "alice", "--password-stdin",
                    stdin="a brand new password\n",
                )  # fmt: skip
                assert "1 browser session(s) ended" in reset
                _refusal(await browser.get("/api/v1/me/tokens"), 401, "invalid_session")
                _refusal(await browser.post("/api/v1/session", json=signup), 401, "invalid_login")
                renewed = {"username": "alice", "password": "a brand new password"}
                assert (await browser.post("/api/v1/session", json=renewed)).status_code == 201
                # What the ended session minted is revoked: the server learns it from the
                # store within its cache period (another process wrote it).
                with trio.fail_after(30):
                    while True:
                        if (await browser.get("/api/v1/whoami", headers=key)).status_code != 200:
                            break
                        await trio.sleep(0.2)
                _refusal(
                    await browser.get("/api/v1/whoami", headers=key), 401, "credential_revoked"
                )
    finally:
        server.proc.terminate()
        server.kill()
