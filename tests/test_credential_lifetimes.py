"""Credential lifetimes and reach, against a served controller (hypercorn on loopback).

A minted credential never outlives its issuer nor ``token_max_lifetime`` (it is
capped, and says so); revoking an issuer revokes what it minted; project token
managers neither see nor revoke the installation's credentials.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from .inference_support import open_inference_controller

DAY = 86400.0


@pytest.fixture
async def controller(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(
            tmp_path, embedded=False, token_max_lifetime="30d"
        ) as controller:
            yield controller


async def _mint(controller, token: str | None = None, **body) -> dict:
    body = {"name": "minted", "scopes": ["models:read", "tokens:manage"], **body}
    return await controller.ok("POST", "/api/v1/tokens", status=201, token=token, json=body)


async def _whoami(controller, token: str) -> httpx.Response:
    return await controller.call("GET", "/api/v1/whoami", token=token)


async def test_a_short_lived_credential_cannot_mint_one_that_outlives_it(controller):
    short = await _mint(controller, lifetime=60)
    expires_at = short["credential"]["expires_at"]
    assert "capped" not in short["credential"]
    for asked in ({}, {"lifetime": 30 * DAY}):
        minted = (await _mint(controller, short["token"], **asked))["credential"]
        assert minted["expires_at"] == expires_at, asked
        assert minted["capped"]["by"] == "issuer_expiry"
        assert minted["capped"]["requested"] == asked.get("lifetime")
        assert 0 < minted["capped"]["granted"] <= 60
        assert minted["issuer_id"] == short["credential"]["id"]
    # A shorter lifetime is granted as asked.
    shorter = (await _mint(controller, short["token"], lifetime=10))["credential"]
    assert "capped" not in shorter
    assert 9 < shorter["expires_at"] - shorter["created_at"] <= 10


async def test_no_credential_outlives_the_token_max_lifetime_setting(controller):
    # The controller's operator credential was made (as the CLI does) with no lifetime.
    tokens = (await controller.ok("GET", "/api/v1/tokens"))["tokens"]
    operator = next(t for t in tokens if t["name"] == "operator")
    assert operator["expires_at"] - operator["created_at"] == pytest.approx(30 * DAY)
    minted = (await _mint(controller, lifetime=365 * DAY))["credential"]
    assert minted["capped"]["requested"] == 365 * DAY
    assert minted["expires_at"] - minted["created_at"] <= 30 * DAY
    # Lifetimes no clock can reach are refused, never stored.
    for lifetime in (b"0", b"-1", b"1e999"):
        response = await controller.call(
            "POST",
            "/api/v1/tokens",
            content=b'{"name": "x", "scopes": ["models:read"], "lifetime": ' + lifetime + b"}",
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 400, (lifetime, response.text)


async def test_revoking_an_issuer_revokes_what_it_minted_transitively(controller):
    parent = await _mint(controller, name="parent")
    child = await _mint(controller, parent["token"], name="child")
    grandchild = await _mint(controller, child["token"], name="grandchild")
    sibling = await _mint(controller, name="sibling")
    for issued in (parent, child, grandchild, sibling):
        assert (await _whoami(controller, issued["token"])).status_code == 200
    revoked = await controller.ok("DELETE", f"/api/v1/tokens/{parent['credential']['id']}")
    assert sorted(revoked["also_revoked"]) == sorted(
        [child["credential"]["id"], grandchild["credential"]["id"]]
    )
    for issued in (parent, child, grandchild):
        response = await _whoami(controller, issued["token"])
        assert response.json()["error"]["code"] == "credential_revoked"
    listed = {t["id"]: t for t in (await controller.ok("GET", "/api/v1/tokens"))["tokens"]}
    assert listed[grandchild["credential"]["id"]]["revoked_at"] is not None
    assert (await _whoami(controller, sibling["token"])).status_code == 200


async def test_a_session_mints_within_its_own_lifetime_and_logout_revokes_what_it_minted(
    controller,
):
    await controller.ok(
        "POST",
        "/api/v1/users",
        status=201,
        json={
            "username": "alice",
            "password": "correct horse",
            "projects": {"default": ["models:read", "tokens:manage"]},
        },
    )
    async with httpx.AsyncClient(base_url=controller.url, timeout=30) as browser:
        login = await browser.post(
            "/api/v1/session",
            json={"username": "alice", "password": "correct horse", "project": "default"},
        )
        assert login.status_code == 201, login.text
        session = login.json()
        csrf = {"X-CSRF-Token": session["csrf_token"]}
        response = await browser.post(
            "/api/v1/tokens", json={"name": "from-browser", "scopes": ["models:read"]}, headers=csrf
        )
        assert response.status_code == 201, response.text
        minted = response.json()
        assert minted["credential"]["expires_at"] == session["principal"]["expires_at"]
        assert minted["credential"]["capped"]["by"] == "issuer_expiry"
        assert (await _whoami(controller, minted["token"])).status_code == 200
        assert (await browser.delete("/api/v1/session", headers=csrf)).status_code == 200
    response = await _whoami(controller, minted["token"])
    assert response.json()["error"]["code"] == "credential_revoked"


async def test_project_token_managers_neither_see_nor_revoke_the_bootstrap_token(controller):
    # The operator holds ``admin``; this manager holds every project scope but not it.
    manager = (await _mint(controller, scopes=["tokens:manage", "models:read"]))["token"]
    everything = (await controller.ok("GET", "/api/v1/tokens"))["tokens"]
    bootstrap = next(t for t in everything if t["name"] == "bootstrap")
    assert "admin" in bootstrap["scopes"]

    seen = (await controller.ok("GET", "/api/v1/tokens", token=manager))["tokens"]
    assert seen and all("admin" not in t["scopes"] for t in seen)
    for method in ("GET", "DELETE"):
        response = await controller.call(method, f"/api/v1/tokens/{bootstrap['id']}", token=manager)
        assert response.status_code == 404, (method, response.text)
        assert response.json()["error"]["code"] == "credential_not_found"
    still = await controller.ok("GET", f"/api/v1/tokens/{bootstrap['id']}")
    assert still["revoked_at"] is None
