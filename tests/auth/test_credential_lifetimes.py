"""Credential lifetimes and reach, against a served controller (hypercorn on loopback).

A minted credential never outlives its issuer nor ``token_max_lifetime`` (it is
capped, and says so); revoking an issuer revokes what it minted; project token
managers neither see nor revoke the installation's credentials.
"""

from __future__ import annotations

import itertools

import httpx
import pytest
import trio

from ficc_core.store.migrations import MIGRATIONS, statements

from ..support.inference_support import llama_spec, open_inference_controller, register_smollm2

DAY = 86400.0


@pytest.fixture
async def controller(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(
            tmp_path, embedded=False, token_max_lifetime="30d"
        ) as controller:
            yield controller


_NAMES = itertools.count(1)


async def _mint(controller, token: str | None = None, **body) -> dict:
    """A credential named ``minted-N`` (names are unique among live ones) unless named."""
    body = {"name": f"minted-{next(_NAMES)}", "scopes": ["models:read", "tokens:manage"], **body}
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


async def _session(controller, http: httpx.AsyncClient, scopes: list[str]) -> dict[str, str]:
    """A browser session of a new member ``bea`` holding ``scopes``; its CSRF header."""
    await controller.ok(
        "POST",
        "/api/v1/users",
        status=201,
        json={"username": "bea", "password": "bea-password-1", "projects": {"default": scopes}},
    )
    login = await http.post(
        "/api/v1/session",
        json={"username": "bea", "password": "bea-password-1", "project": "default"},
    )
    assert login.status_code == 201, login.text
    return {"X-CSRF-Token": login.json()["csrf_token"]}


async def test_a_lasting_key_made_in_a_session_outlives_its_logout_up_to_the_max_lifetime(
    controller,
):
    async with httpx.AsyncClient(base_url=controller.url, timeout=30) as browser:
        csrf = await _session(controller, browser, ["models:read", "tokens:manage"])
        made = await browser.post(
            "/api/v1/tokens",
            headers=csrf,
            json={"name": "app", "scopes": ["models:read"], "lifetime": 20 * DAY, "lasting": True},
        )
        assert made.status_code == 201, made.text
        lasting = made.json()
        # Its own lifetime, not the session's 12 hours; made by nothing that ends.
        credential = lasting["credential"]
        assert credential["expires_at"] - credential["created_at"] == pytest.approx(20 * DAY)
        assert "capped" not in credential and credential["issuer_id"] is None
        assert credential["user_id"] is not None  # still the person's
        # Beyond token_max_lifetime (30 days here) it is capped, and says so.
        longer = await browser.post(
            "/api/v1/tokens",
            headers=csrf,
            json={
                "name": "long",
                "scopes": ["models:read"],
                "lifetime": 365 * DAY,
                "lasting": True,
            },
        )
        assert longer.json()["credential"]["capped"] == {
            "requested": 365 * DAY,
            "granted": pytest.approx(30 * DAY),
            "by": "token_max_lifetime",
        }
        bound = await browser.post(
            "/api/v1/tokens", headers=csrf, json={"name": "bound", "scopes": ["models:read"]}
        )
        assert bound.json()["credential"]["capped"]["by"] == "issuer_expiry"
        assert (await browser.delete("/api/v1/session", headers=csrf)).status_code == 200
    # Logging out revoked the session's own key, not the lasting ones.
    assert (await _whoami(controller, lasting["token"])).status_code == 200
    assert (await _whoami(controller, longer.json()["token"])).status_code == 200
    gone = await _whoami(controller, bound.json()["token"])
    assert gone.json()["error"]["code"] == "credential_revoked"
    # Only a person makes a lasting key: a credential of no person is refused.
    refused = await controller.call(
        "POST",
        "/api/v1/tokens",
        json={"name": "nope", "scopes": ["models:read"], "lasting": True},
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "lasting_needs_session"


async def test_names_are_unique_among_live_credentials_and_name_them_wherever_an_id_does(
    controller,
):
    first = (await _mint(controller, name="batch-job"))["credential"]
    taken = await controller.call(
        "POST", "/api/v1/tokens", json={"name": "batch-job", "scopes": ["models:read"]}
    )
    assert taken.status_code == 409, taken.text
    error = taken.json()["error"]
    assert error["code"] == "credential_name_taken"
    assert error["details"] == {"name": "batch-job", "id": first["id"]}
    assert "choose another name" in error["message"]

    # The name reaches every route that takes a credential's ID.
    assert (await controller.ok("GET", "/api/v1/tokens/batch-job"))["id"] == first["id"]
    limits = await controller.ok("PUT", "/api/v1/tokens/batch-job/limits", json={"rpm": 7})
    assert (limits["id"], limits["limits"]["rpm"]) == (first["id"], 7)
    assert (await controller.ok("GET", "/api/v1/tokens/batch-job/limits"))["id"] == first["id"]
    revoked = await controller.ok("DELETE", "/api/v1/tokens/batch-job")
    assert revoked["id"] == first["id"] and revoked["revoked_at"] is not None

    # A revoked credential frees its name; the name then names the live one.
    second = (await _mint(controller, name="batch-job"))["credential"]
    assert (await controller.ok("GET", "/api/v1/tokens/batch-job"))["id"] == second["id"]
    missing = await controller.call("GET", "/api/v1/tokens/no-such-key")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "credential_not_found"

    # A name is the project's: another project may use it.
    await controller.ok("POST", "/api/v1/projects", status=201, json={"name": "other"})
    await controller.service.auth.create_credential(
        "other", name="batch-job", scopes=frozenset({"models:read"})
    )
    # A project's token manager cannot name the installation's (admin) credentials.
    manager = (await _mint(controller, scopes=["tokens:manage", "models:read"]))["token"]
    hidden = await controller.call("GET", "/api/v1/tokens/bootstrap", token=manager)
    assert hidden.status_code == 404, hidden.text


async def test_each_person_names_their_own_personal_keys(controller):
    tokens = {}
    for person in ("ann", "ben"):
        await controller.ok(
            "POST",
            "/api/v1/users",
            status=201,
            json={"username": person, "password": f"{person}-password-1"},
        )
        user = await controller.service.auth.people.get_user(person)
        _, tokens[person] = await controller.service.auth.create_credential(
            "default", name=f"{person}-own", scopes=frozenset({"tokens:manage"}), user_id=user.id
        )
        made = await controller.call(
            "POST", "/api/v1/me/tokens", token=tokens[person], json={"name": "laptop"}
        )
        assert made.status_code == 201, made.text  # each person has their own "laptop"
    again = await controller.call(
        "POST", "/api/v1/me/tokens", token=tokens["ann"], json={"name": "laptop"}
    )
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "credential_name_taken"
    revoked = await controller.ok("DELETE", "/api/v1/me/tokens/laptop", token=tokens["ann"])
    assert revoked["name"] == "laptop" and revoked["revoked_at"] is not None
    bens = (await controller.ok("GET", "/api/v1/me/tokens", token=tokens["ben"]))["tokens"]
    assert [t["revoked_at"] for t in bens] == [None]


@pytest.mark.slow
@pytest.mark.deadline(190)
async def test_a_service_key_is_revoked_by_its_name_and_default_names_never_clash(tmp_path):
    from ..cli.test_cli_inference import Cli

    with trio.fail_after(180):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            spec = await llama_spec(controller, model_id, alias="smol")
            service_id = (await controller.ok("POST", "/api/v1/inference", status=201, json=spec))[
                "id"
            ]
            run = Cli(controller.url, controller.token)
            issued = await run.json("token", "smol", "--lifetime", "1d", "--name", "app")
            token = issued["token"]
            again = await run("token", "smol", "--lifetime", "1d", "--name", "app")
            assert again.exit_code == 1 and "[credential_name_taken]" in again.stderr
            # Unnamed, each takes the first free default: invoke-smol, invoke-smol-2.
            defaults = [
                (await run.json("token", "smol", "--lifetime", "1h"))["credential"]["name"]
                for _ in range(2)
            ]
            assert defaults == ["invoke-smol", "invoke-smol-2"]
            # A key of the project not bound to this service is not one of its keys.
            path = f"/api/v1/inference/{service_id}/tokens/batch"
            await _mint(controller, name="batch")
            assert (await controller.call("DELETE", path)).status_code == 404

            revoked = await run.ok("token", "smol", "--revoke", "app")
            assert f"revoked {issued['credential']['id']} (app)" in revoked.stdout
            response = await _whoami(controller, token)
            assert response.json()["error"]["code"] == "credential_revoked"


async def test_upgrading_renames_the_later_live_credentials_that_shared_a_name(store_backend):
    """The names migration, on each backend: of the unrevoked credentials sharing a name
    in a project (a person's own, in the personal project), the oldest keeps it."""
    [version] = [
        number
        for number in range(1, len(MIGRATIONS) + 1)
        if any("credentials_name" in s for s in statements(number, "sqlite"))
    ]
    backend = store_backend.backend  # type: ignore[attr-defined]
    [rename] = [s for s in statements(version, backend) if s.lstrip().startswith("UPDATE")]
    rows = [  # id, project, user, name, created_at, revoked_at
        ("aaaaaaaa00000001", "p", None, "k", 1.0, None),
        ("bbbbbbbb00000002", "p", None, "k", 2.0, None),
        ("cccccccc00000003", "p", None, "k", 3.0, 9.0),
        ("dddddddd00000004", "p", None, "solo", 1.0, None),
        ("eeeeeeee00000005", "q", None, "k", 5.0, None),
        ("ffffffff00000006", "~personal", "u1", "laptop", 1.0, None),
        ("1111111100000007", "~personal", "u2", "laptop", 2.0, None),
        ("2222222200000008", "~personal", "u1", "laptop", 3.0, None),
    ]

    def write(tx):
        for project in ("p", "q", "~personal"):
            tx.execute(
                "INSERT INTO projects (id, name, created_at) VALUES (?, ?, 0)", (project, project)
            )
        for user in ("u1", "u2"):
            tx.execute(
                "INSERT INTO users (id, username, password_hash, created_at) VALUES (?, ?, 'x', 0)",
                (user, user),
            )
        for id_, project, user, name, created_at, revoked_at in rows:
            tx.execute(
                "INSERT INTO credentials (id, secret_hash, project_id, user_id, name, scopes,"
                " created_at, revoked_at) VALUES (?, 'h', ?, ?, ?, '[]', ?, ?)",
                (id_, project, user, name, created_at, revoked_at),
            )
        tx.execute(rename)

    await store_backend.write(write)
    names = await store_backend.read(
        lambda tx: {r["id"]: r["name"] for r in tx.fetch_all("SELECT id, name FROM credentials")}
    )
    assert names == {
        "aaaaaaaa00000001": "k",
        "bbbbbbbb00000002": "k-bbbbbbbb",
        "cccccccc00000003": "k",  # revoked: kept as it was
        "dddddddd00000004": "solo",
        "eeeeeeee00000005": "k",  # another project's
        "ffffffff00000006": "laptop",
        "1111111100000007": "laptop",  # another person's
        "2222222200000008": "laptop-22222222",
    }
