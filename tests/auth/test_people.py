"""People over the real app and store: signup, pending accounts, approval, personal keys,
personal_disabled, the reserved personal project, and hostile input to each."""

from __future__ import annotations

import json
import re

import pytest

from ficc_core.api.app import create_app
from ficc_core.auth.records import PERSONAL_PROJECT, UserStatus
from ficc_core.base.errors import Conflict, NotFound
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.inference import repository as inference_repository
from ficc_core.inference.records import Desired, ServiceRecord, ServiceState

from ..conftest import bearer, issue_token

PASSWORD = "correct horse battery"


async def _error(response, status: int, code: str) -> dict:
    body = await response.get_json()
    assert response.status_code == status, body
    assert body["error"]["code"] == code, body
    return body["error"]


async def insert_service(service, service_id: str, project_id: str, alias: str) -> None:
    """A stopped inference service's row, as a submit writes it (shares name real rows)."""
    record = ServiceRecord(
        id=service_id,
        project_id=project_id,
        alias=alias,
        model_id="mdl_x",
        spec=f'{{"alias":"{alias}"}}',
        revision=1,
        generation=0,
        desired=Desired.STOPPED,
        state=ServiceState.STOPPED,
        reason=None,
        plan_digest="sha256:" + "2" * 64,
        created_at=1.0,
        updated_at=1.0,
    )
    await service.store.write(lambda tx: inference_repository.insert_service(tx, record))


def _config(tmp_path, **overrides):
    return load_config(overrides={"data_dir": str(tmp_path / "data"), **overrides}, environ={})


async def _login(client, username: str, password: str = PASSWORD, project: str | None = None):
    body = {"username": username, "password": password}
    if project is not None:
        body["project"] = project
    return await client.post("/api/v1/session", json=body)


async def _personal_key(client, username: str, name: str = "mine") -> dict:
    """Log ``username`` in personally and mint a personal key through ``/me/tokens``."""
    login = await _login(client, username)
    assert login.status_code == 201, await login.get_json()
    csrf = (await login.get_json())["csrf_token"]
    minted = await client.post(
        "/api/v1/me/tokens", json={"name": name}, headers={"X-CSRF-Token": csrf}
    )
    assert minted.status_code == 201, await minted.get_json()
    return await minted.get_json()


async def test_signup_is_closed_by_default(client, bootstrap):
    error = await _error(
        await client.post("/api/v1/signup", json={"username": "eve", "password": PASSWORD}),
        404,
        "signup_closed",
    )
    assert "administrator" in error["message"]


async def test_a_pending_account_cannot_log_in_nor_use_its_keys_until_approved(
    client, service, bootstrap
):
    admin = bearer(bootstrap["token"])
    user = await service.auth.create_user("carol", PASSWORD, status=UserStatus.PENDING)
    assert user.status == UserStatus.PENDING
    token = await issue_token(service, scopes={"models:read"}, user_id=user.id)

    # The password is checked first: a wrong one says nothing about the account's state.
    await _error(await _login(client, "carol", "wrong password"), 401, "invalid_login")
    await _error(await _login(client, "carol"), 403, "account_pending")
    await _error(await client.get("/api/v1/models", headers=bearer(token)), 403, "account_pending")
    listed = (await (await client.get("/api/v1/users", headers=admin)).get_json())["users"]
    assert {u["username"]: u["status"] for u in listed} == {"admin": "active", "carol": "pending"}

    approved = await client.post(f"/api/v1/users/{user.id}/approve", headers=admin)
    assert (await approved.get_json())["status"] == "active"
    assert (await client.get("/api/v1/models", headers=bearer(token))).status_code == 200
    personal = await _login(client, "carol")
    assert personal.status_code == 201
    principal = (await personal.get_json())["principal"]
    assert principal["project"]["id"] == PERSONAL_PROJECT
    assert principal["scopes"] == []  # a personal session holds no project's scopes

    await _error(
        await client.post("/api/v1/users/nobody/approve", headers=admin), 404, "user_not_found"
    )


async def test_signup_makes_pending_accounts_refuses_bad_input_and_is_throttled(tmp_path):
    async with open_service(_config(tmp_path, signup_open=True, login_max_failures=3)) as service:
        client = create_app(service).test_client()
        made = await client.post("/api/v1/signup", json={"username": "dave", "password": PASSWORD})
        assert made.status_code == 201
        view = await made.get_json()
        assert (view["username"], view["status"], view["admin"]) == ("dave", "pending", False)
        assert view["projects"] == []

        for body in (
            {"username": "bad name!", "password": PASSWORD},
            {"username": "x" * 65, "password": PASSWORD},
            {"username": "erin", "password": "short"},
            {"username": "erin", "password": PASSWORD, "admin": True},
            {"username": "erin"},
        ):
            await _error(await client.post("/api/v1/signup", json=body), 400, "invalid_request")
        assert [u.username for u in await service.auth.list_users()] == ["dave"]

        taken = {"username": "dave", "password": PASSWORD}
        await _error(await client.post("/api/v1/signup", json=taken), 409, "user_exists")
        await _error(await client.post("/api/v1/signup", json=taken), 409, "user_exists")
        # Every signup counts, made or refused: the third for one name from one address
        # was the last (login_max_failures = 3); the next waits, costing no argon2 work.
        throttled = await client.post("/api/v1/signup", json=taken)
        error = await _error(throttled, 429, "signup_throttled")
        assert int(throttled.headers["Retry-After"]) >= 1
        assert error["details"]["limit"] == "user_address"


async def test_personal_keys_are_a_persons_own_invoke_only_and_outside_every_project(
    client, service, bootstrap
):
    admin = bearer(bootstrap["token"])
    await service.auth.create_user("frank", PASSWORD)
    await service.auth.create_user("grace", PASSWORD)
    issued = await _personal_key(client, "frank")
    credential, key = issued["credential"], issued["token"]
    assert credential["project_id"] == PERSONAL_PROJECT
    assert credential["scopes"] == ["inference:invoke"]
    whoami = await (await client.get("/api/v1/whoami", headers=bearer(key))).get_json()
    assert (whoami["personal"], whoami["user"]["username"]) == (True, "frank")

    # It reaches no management route, and mints nothing, not even another personal key.
    for method, path in (
        ("GET", "/api/v1/inference"),
        ("GET", "/api/v1/models"),
        ("GET", "/api/v1/tokens"),
        ("POST", "/api/v1/tokens"),
        ("GET", "/api/v1/projects"),
        ("GET", "/api/v1/contributors"),
    ):
        response = await client.open(path, method=method, headers=bearer(key), json={})
        await _error(response, 403, "missing_scope")
    minting = await client.post("/api/v1/me/tokens", json={"name": "more"}, headers=bearer(key))
    await _error(minting, 403, "personal_key_refused")
    await _error(
        await client.get("/api/v1/me/tokens", headers=bearer(key)), 403, "personal_key_refused"
    )

    # Another person sees and revokes only their own; a credential of no person has none.
    grace = (await _personal_key(client, "grace", "hers"))["credential"]
    frank_token = await issue_token(service, scopes={"models:read"}, user_id=credential["user_id"])
    listed = await (await client.get("/api/v1/me/tokens", headers=bearer(frank_token))).get_json()
    assert [t["id"] for t in listed["tokens"]] == [credential["id"]]
    await _error(
        await client.delete(f"/api/v1/me/tokens/{grace['id']}", headers=bearer(frank_token)),
        404,
        "credential_not_found",
    )
    nobody = await issue_token(service, scopes={"models:read"})
    await _error(await client.get("/api/v1/me/tokens", headers=bearer(nobody)), 403, "no_person")

    # A project token manager never sees a personal key; an administrator revokes it.
    tokens = await (await client.get("/api/v1/tokens", headers=admin)).get_json()
    assert credential["id"] not in {t["id"] for t in tokens["tokens"]}
    revoked = await client.delete(
        f"/api/v1/me/tokens/{credential['id']}", headers=bearer(frank_token)
    )
    assert (await revoked.get_json())["revoked_at"] is not None
    await _error(await client.get("/api/v1/whoami", headers=bearer(key)), 401, "credential_revoked")


async def test_a_personal_key_lives_no_longer_than_token_max_lifetime(tmp_path):
    config = _config(tmp_path, token_max_lifetime="1h")
    async with open_service(config) as service:
        await service.auth.bootstrap()
        client = create_app(service).test_client()
        await service.auth.create_user("heidi", PASSWORD)
        person = await issue_token(
            service,
            scopes={"models:read"},
            user_id=(await service.auth.people.get_user("heidi")).id,
        )
        minted = await client.post(
            "/api/v1/me/tokens", json={"name": "long", "lifetime": 86400}, headers=bearer(person)
        )
        credential = (await minted.get_json())["credential"]
        # Capped at token_max_lifetime, or (a moment sooner) at its issuer's expiry.
        assert credential["capped"]["by"] in ("token_max_lifetime", "issuer_expiry")
        assert credential["expires_at"] - credential["created_at"] == pytest.approx(3600, abs=1)
        await _error(
            await client.post(
                "/api/v1/me/tokens", json={"name": "bad", "lifetime": -1}, headers=bearer(person)
            ),
            400,
            "invalid_request",
        )


async def test_personal_disabled_refuses_making_personal_keys_and_using_existing_ones(tmp_path):
    async with open_service(_config(tmp_path)) as service:
        await service.auth.bootstrap()
        client = create_app(service).test_client()
        await service.auth.create_user("ivan", PASSWORD)
        key = (await _personal_key(client, "ivan"))["token"]
        assert (await client.get("/api/v1/whoami", headers=bearer(key))).status_code == 200

    async with open_service(_config(tmp_path, personal_disabled=True)) as service:
        client = create_app(service).test_client()
        await _error(
            await client.get("/api/v1/whoami", headers=bearer(key)), 403, "personal_disabled"
        )
        await _error(await _login(client, "ivan"), 403, "personal_disabled")
        user = await service.auth.people.get_user("ivan")
        person = await issue_token(service, scopes={"models:read"}, user_id=user.id)
        minting = await client.post("/api/v1/me/tokens", json={"name": "x"}, headers=bearer(person))
        await _error(minting, 403, "personal_disabled")


async def test_the_personal_project_cannot_be_named_created_listed_or_logged_in_to(
    client, service, bootstrap
):
    admin = bearer(bootstrap["token"])
    await service.auth.create_user("judy", PASSWORD)
    await _personal_key(client, "judy")  # the reserved project's row now exists
    with pytest.raises(Conflict):
        await service.auth.create_project(PERSONAL_PROJECT)
    with pytest.raises(NotFound):
        await service.auth.create_credential(PERSONAL_PROJECT, name="x", scopes={"models:read"})
    with pytest.raises(NotFound):
        await service.auth.get_project(PERSONAL_PROJECT)
    listed = await (await client.get("/api/v1/projects", headers=admin)).get_json()
    assert [p["name"] for p in listed["projects"]] == ["default"]
    await _error(
        await _login(client, "admin", bootstrap["password"], PERSONAL_PROJECT),
        404,
        "project_not_found",
    )
    user = await service.auth.people.get_user("judy")
    membership = await client.put(
        f"/api/v1/users/{user.id}/projects/{PERSONAL_PROJECT}",
        json={"scopes": ["models:manage"]},
        headers=admin,
    )
    await _error(membership, 404, "project_not_found")


async def test_an_administrators_password_reset_ends_the_users_sessions(client, service, bootstrap):
    admin = bearer(bootstrap["token"])
    user = await service.auth.create_user("ken", PASSWORD, projects={"default": {"models:read"}})
    assert (await _login(client, "ken", project="default")).status_code == 201
    assert (await client.get("/api/v1/models")).status_code == 200  # by the session cookie

    await _error(
        await client.put(
            f"/api/v1/users/{user.id}/password", json={"password": "short"}, headers=admin
        ),
        400,
        "invalid_request",
    )
    reset = await client.put(
        f"/api/v1/users/{user.id}/password", json={"password": "a new long one"}, headers=admin
    )
    assert (await reset.get_json())["sessions_ended"] == 1
    await _error(await client.get("/api/v1/models"), 401, "invalid_session")
    await _error(await _login(client, "ken", project="default"), 401, "invalid_login")
    assert (await _login(client, "ken", "a new long one", "default")).status_code == 201


async def test_shares_refuse_unknown_users_by_name_and_another_projects_service(
    client, service, bootstrap
):
    admin = bearer(bootstrap["token"])
    other = await service.auth.create_project("other")
    await insert_service(service, "svc-mine", (await service.auth.get_project("default")).id, "a")
    await insert_service(service, "svc-theirs", other.id, "b")
    await service.auth.create_user("leo", PASSWORD)

    unknown = await client.put(
        "/api/v1/inference/svc-mine/shares", json={"users": ["leo", "mallory"]}, headers=admin
    )
    error = await _error(unknown, 400, "unknown_user")
    assert error["details"]["unknown"] == ["mallory"]
    assert "mallory" in error["message"]
    shown = await (await client.get("/api/v1/inference/svc-mine/shares", headers=admin)).get_json()
    assert shown == {"service_id": "svc-mine", "users": [], "everyone": False}  # nothing written

    for method in ("GET", "PUT"):
        response = await client.open(
            "/api/v1/inference/svc-theirs/shares", method=method, json={"users": []}, headers=admin
        )
        await _error(response, 404, "service_not_found")
    for body in ({"users": "leo"}, {"users": [""]}, {"users": ["x"] * 1001}, {"everyone": "yes"}):
        response = await client.put("/api/v1/inference/svc-mine/shares", json=body, headers=admin)
        await _error(response, 400, "invalid_request")

    shared = await client.put(
        "/api/v1/inference/svc-mine/shares",
        json={"users": ["leo"], "everyone": True},
        headers=admin,
    )
    view = await shared.get_json()
    assert [u["username"] for u in view["users"]] == ["leo"]
    assert view["everyone"] is True


def test_the_users_commands_list_approve_and_reset_with_a_prompt_and_refuse_clearly(tmp_path):
    from click.testing import CliRunner

    from ficc_core.cli.main import cli

    from ..support.serve_support import make_data_dir

    make_data_dir(tmp_path / "data")

    def run(*args: str, input: str | None = None):
        return CliRunner().invoke(
            cli, ["--data-dir", str(tmp_path / "data"), *args], input=input, env={}
        )

    made = run("admin", "create-user", "quinn", "--password-stdin", input=f"{PASSWORD}\n")
    assert made.exit_code == 0, made.output
    listed = run("admin", "users", "list")
    assert re.search(r"quinn\s+active", listed.output), listed.output

    # Interactive: asked twice, without echo; a mismatch is asked again.
    reset = run(
        "admin", "users", "reset-password", "quinn", "--json",
        input="first password\nother password\nnew password 1\nnew password 1\n",
    )  # fmt: skip
    assert reset.exit_code == 0, reset.output
    assert "new password 1" not in reset.output
    assert json.loads(reset.output[reset.output.index("{") :])["sessions_ended"] == 0

    short = run("admin", "users", "reset-password", "quinn", "--password-stdin", input="short\n")
    assert short.exit_code != 0 and "at least 8 characters" in short.output
    unknown = run("admin", "users", "approve", "nobody")
    assert unknown.exit_code != 0 and "no user 'nobody'" in unknown.output


async def test_a_personal_key_reaches_no_route_beyond_invoking(app, client, service, bootstrap):
    from ficc_core.api.access import ROUTE_ACCESS

    await service.auth.create_user("rita", PASSWORD)
    key = bearer((await _personal_key(client, "rita"))["token"])
    checked = 0
    for rule in app.url_map.iter_rules():
        access = ROUTE_ACCESS[rule.endpoint]
        if access.public or rule.websocket or not access.scopes - {"inference:invoke"}:
            continue
        path = re.sub(r"<int:[^>]+>", "0", rule.rule)
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"placeholder-\1", path)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            response = await client.open(path, method=method, headers=key, json={})
            await _error(response, 403, "missing_scope")
            checked += 1
    assert checked >= 40
    # What it does reach finds nothing of any project: no service is shared with rita.
    listed = await client.get("/v1/models", headers=key)
    assert (await listed.get_json())["data"] == []
    missing = await client.post(
        "/api/v1/inference/placeholder/v1/chat/completions", headers=key, json={"messages": []}
    )
    await _error(missing, 404, "service_not_found")
