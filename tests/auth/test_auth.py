"""Authentication over the real app and store: credentials, sessions, CSRF, projects."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from functools import partial

import pytest
import trio

from ficc_core.auth import PROJECT_SCOPES, AuthService
from ficc_core.auth.authority import CREDENTIAL_CACHE_SECONDS
from ficc_core.auth.first_run import write_first_run_secrets
from ficc_core.base.errors import Unauthenticated

from ..conftest import bearer, issue_token
from ..support.clock import FakeClock
from ..support.waiting import eventually


async def test_whoami_reports_principal_project_and_scopes(client, service, bootstrap):
    token = await issue_token(service, scopes=["models:read", "inference:read"], name="reader")
    response = await client.get("/api/v1/whoami", headers=bearer(token))
    assert response.status_code == 200
    body = await response.get_json()
    assert body["kind"] == "credential"
    assert body["project"]["name"] == "default"
    assert body["scopes"] == ["inference:read", "models:read"]


async def test_secrets_are_stored_hashed_never_in_clear(service, bootstrap, config):
    token = await issue_token(service, scopes=["models:read"])
    secret = token.split(".", 1)[1]
    conn = sqlite3.connect(config.database_path)
    dump = "\n".join(conn.iterdump())
    conn.close()
    assert secret not in dump
    assert bootstrap["password"] not in dump
    assert "$argon2id$" in dump


async def test_revoked_and_expired_credentials_are_refused(client, service, bootstrap):
    admin = bearer(bootstrap["token"])
    created = await client.post(
        "/api/v1/tokens", headers=admin, json={"name": "short", "scopes": ["models:read"]}
    )
    body = await created.get_json()
    assert (await client.get("/api/v1/whoami", headers=bearer(body["token"]))).status_code == 200
    revoked = await client.delete(f"/api/v1/tokens/{body['credential']['id']}", headers=admin)
    assert (await revoked.get_json())["revoked_at"] is not None
    response = await client.get("/api/v1/whoami", headers=bearer(body["token"]))
    assert response.status_code == 401
    assert (await response.get_json())["error"]["code"] == "credential_revoked"


async def test_an_expired_credential_is_refused_by_the_app(client, service, bootstrap):
    # Minted on a clock 100 s behind to live 50 s: it expired 50 s ago on the app's clock.
    minting = AuthService(service.store, clock=FakeClock(time.time() - 100))
    _, token = await minting.create_credential(
        "default", name="expired", scopes=frozenset({"models:read"}), lifetime=50
    )
    response = await client.get("/api/v1/whoami", headers=bearer(token))
    assert response.status_code == 401
    assert (await response.get_json())["error"]["code"] == "credential_expired"


async def _refused(code: str, check) -> None:
    with pytest.raises(Unauthenticated) as refused:
        await check()
    assert refused.value.code == code


async def test_a_credential_works_until_its_expiry_and_not_at_it(service, bootstrap):
    clock = FakeClock()
    auth = AuthService(service.store, clock=clock)
    credential, token = await auth.create_credential(
        "default", name="short", scopes=frozenset({"models:read"}), lifetime=60
    )
    assert credential.expires_at == clock.now + 60
    principal = await auth.authenticate_bearer(token)
    clock.now += 59.5
    assert auth.still_valid(principal)
    assert (await auth.authenticate_bearer(token)).id == credential.id
    clock.now += 0.5
    # At its expiry: refused from memory (the verification is still cached) ...
    assert not auth.still_valid(principal)
    with pytest.raises(Unauthenticated) as refused:
        auth.check_valid(principal)
    assert refused.value.code == "credential_expired"
    await _refused("credential_expired", lambda: auth.authenticate_bearer(token))
    # ... and from the store once the cache period is over.
    clock.now += CREDENTIAL_CACHE_SECONDS
    await _refused("credential_expired", lambda: auth.authenticate_bearer(token))


async def test_a_session_works_until_its_lifetime_is_over(service, bootstrap):
    clock = FakeClock(time.time())
    auth = AuthService(service.store, clock=clock, session_lifetime=600)
    principal, cookie, _ = await auth.login("admin", bootstrap["password"], "default")
    assert principal.expires_at == clock.now + 600
    clock.now += 599
    assert (await auth.authenticate_session(cookie)).id == principal.id
    clock.now += 1
    assert not auth.still_valid(principal)
    await _refused("session_expired", lambda: auth.authenticate_session(cookie))


async def test_malformed_and_forged_bearer_tokens_are_401(client, bootstrap):
    forged = bootstrap["token"][:-4] + "AAAA"
    for header in ("Bearer nonsense", "Basic abc", "Bearer ", f"Bearer {forged}"):
        response = await client.get("/api/v1/whoami", headers={"Authorization": header})
        assert response.status_code == 401, header
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_a_credential_cannot_grant_scopes_it_does_not_hold(client, service, bootstrap):
    token = await issue_token(service, scopes=["tokens:manage", "models:read"])
    response = await client.post(
        "/api/v1/tokens",
        headers=bearer(token),
        json={"name": "wider", "scopes": ["models:read", "models:manage"]},
    )
    assert response.status_code == 403
    error = (await response.get_json())["error"]
    assert error["code"] == "scope_escalation"
    assert error["details"]["scopes"] == ["models:manage"]


async def test_another_projects_credential_is_not_found(client, service, bootstrap):
    await service.auth.create_project("other")
    theirs, _ = await service.auth.create_credential(
        "other", name="theirs", scopes=frozenset({"models:read"})
    )
    mine = bearer(await issue_token(service, scopes=["tokens:manage"]))
    for method in ("get", "delete"):
        response = await getattr(client, method)(f"/api/v1/tokens/{theirs.id}", headers=mine)
        assert response.status_code == 404
        assert (await response.get_json())["error"]["code"] == "credential_not_found"
    listed = await (await client.get("/api/v1/tokens", headers=mine)).get_json()
    assert theirs.id not in {t["id"] for t in listed["tokens"]}
    assert (await service.auth.get_credential(theirs.project_id, theirs.id)).revoked_at is None


async def _login(client, username, password, project="default"):
    response = await client.post(
        "/api/v1/session", json={"username": username, "password": password, "project": project}
    )
    return response


async def test_login_sets_an_httponly_samesite_cookie_and_returns_a_csrf_token(client, bootstrap):
    response = await _login(client, "admin", bootstrap["password"])
    assert response.status_code == 201
    cookies = response.headers.getlist("Set-Cookie")
    session = next(c for c in cookies if c.startswith("ficc_session="))
    assert "HttpOnly" in session and "SameSite=Strict" in session
    body = await response.get_json()
    assert body["csrf_token"]
    assert body["principal"]["kind"] == "session"
    whoami = await client.get("/api/v1/whoami")
    assert (await whoami.get_json())["kind"] == "session"


async def test_cookie_writes_need_the_csrf_token_bearer_writes_do_not(client, bootstrap):
    csrf = (await (await _login(client, "admin", bootstrap["password"])).get_json())["csrf_token"]
    body = {"name": "from-browser", "scopes": ["models:read"]}
    refused = await client.post("/api/v1/tokens", json=body)
    assert refused.status_code == 403
    assert (await refused.get_json())["error"]["code"] == "csrf_failed"
    wrong = await client.post("/api/v1/tokens", json=body, headers={"X-CSRF-Token": "nope"})
    assert wrong.status_code == 403
    accepted = await client.post("/api/v1/tokens", json=body, headers={"X-CSRF-Token": csrf})
    assert accepted.status_code == 201
    # Reads by cookie need no CSRF token.
    assert (await client.get("/api/v1/tokens")).status_code == 200
    # A Bearer write never needs one, even with a session cookie present.
    bearer_write = await client.post(
        "/api/v1/tokens", json={**body, "name": "b"}, headers=bearer(bootstrap["token"])
    )
    assert bearer_write.status_code == 201


async def test_logout_ends_the_session(client, bootstrap):
    csrf = (await (await _login(client, "admin", bootstrap["password"])).get_json())["csrf_token"]
    assert (await client.delete("/api/v1/session")).status_code == 403  # CSRF applies
    response = await client.delete("/api/v1/session", headers={"X-CSRF-Token": csrf})
    assert (await response.get_json()) == {"logged_out": True}
    assert (await client.get("/api/v1/whoami")).status_code == 401


async def test_wrong_password_unknown_user_and_non_member_are_refused(client, service, bootstrap):
    assert (await _login(client, "admin", "wrong-password")).status_code == 401
    assert (await _login(client, "nobody", "whatever-pass")).status_code == 401
    await service.auth.create_project("other")
    await service.auth.create_user("alice", "alice-password", projects={"other": {"models:read"}})
    response = await _login(client, "alice", "alice-password", project="default")
    assert response.status_code == 403
    assert (await response.get_json())["error"]["code"] == "not_a_member"


async def test_a_session_works_in_the_project_chosen_at_login(client, service, bootstrap):
    await service.auth.create_project("other")
    await service.auth.create_user(
        "alice", "alice-password", projects={"other": {"models:read", "tokens:manage"}}
    )
    body = await (await _login(client, "alice", "alice-password", project="other")).get_json()
    assert body["principal"]["project"]["name"] == "other"
    assert body["principal"]["scopes"] == ["models:read", "tokens:manage"]
    created = await client.post(
        "/api/v1/tokens",
        json={"name": "alices", "scopes": ["models:read"]},
        headers={"X-CSRF-Token": body["csrf_token"]},
    )
    credential = (await created.get_json())["credential"]
    other = await service.auth.get_project("other")
    assert credential["project_id"] == other.id


async def test_admin_routes_manage_projects_users_and_memberships(client, bootstrap):
    admin = bearer(bootstrap["token"])
    project = await client.post("/api/v1/projects", headers=admin, json={"name": "team-a"})
    assert project.status_code == 201
    taken = await client.post("/api/v1/projects", headers=admin, json={"name": "team-a"})
    assert taken.status_code == 409
    assert (await taken.get_json())["error"]["code"] == "project_exists"
    user = await client.post(
        "/api/v1/users",
        headers=admin,
        json={
            "username": "bob",
            "password": "bob-password",
            "projects": {"team-a": ["models:read"]},
        },
    )
    assert user.status_code == 201
    user_id = (await user.get_json())["id"]
    granted = await client.put(
        f"/api/v1/users/{user_id}/projects/team-a",
        headers=admin,
        json={"scopes": list(PROJECT_SCOPES)},
    )
    assert sorted((await granted.get_json())["projects"][0]["scopes"]) == sorted(PROJECT_SCOPES)
    listed = await (await client.get("/api/v1/users", headers=admin)).get_json()
    assert {u["username"] for u in listed["users"]} == {"admin", "bob"}
    assert all("password" not in str(u) for u in listed["users"])


async def test_bootstrap_happens_once(service, bootstrap):
    assert await service.auth.bootstrap() is None


class CountingStore:
    """The real store, counting reads."""

    def __init__(self, store) -> None:
        self.store, self.reads = store, 0

    async def read(self, fn):
        self.reads += 1
        return await self.store.read(fn)

    async def write(self, fn):
        return await self.store.write(fn)


async def test_verified_credentials_are_checked_in_memory_but_never_past_a_revocation(
    client, service, bootstrap
):
    counting = CountingStore(service.store)
    auth = AuthService(counting, clock=FakeClock(time.time()))
    token = await issue_token(service, scopes=PROJECT_SCOPES, name="cached")
    credential_id = token.removeprefix("ficc_").split(".")[0]
    for _ in range(5):
        assert (await auth.authenticate_bearer(token)).id == credential_id
    assert counting.reads == 1, "four of the five checks come from memory"
    # The cache never skips the secret: a forged secret for the same id is refused.
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    await _refused("invalid_credential", lambda: auth.authenticate_bearer(forged))
    response = await client.get("/api/v1/whoami", headers=bearer(forged))
    assert response.status_code == 401
    # A revocation through this controller applies at once.
    assert (await client.get("/api/v1/whoami", headers=bearer(token))).status_code == 200
    await service.auth.revoke_credential(None, credential_id)
    response = await client.get("/api/v1/whoami", headers=bearer(token))
    assert (await response.get_json())["error"]["code"] == "credential_revoked"


async def test_a_revocation_written_elsewhere_applies_once_the_cache_period_is_over(
    service, bootstrap
):
    clock = FakeClock(time.time())
    auth = AuthService(service.store, clock=clock)
    token = await issue_token(service, scopes=PROJECT_SCOPES, name="elsewhere")
    credential_id = token.removeprefix("ficc_").split(".")[0]
    assert (await auth.authenticate_bearer(token)).id == credential_id
    # Another process writes the revocation straight into the database.
    await service.store.write(
        lambda tx: tx.execute(
            "UPDATE credentials SET revoked_at = ? WHERE id = ?", (clock.now, credential_id)
        )
    )
    clock.now += CREDENTIAL_CACHE_SECONDS - 0.1
    assert (await auth.authenticate_bearer(token)).id == credential_id, "served from memory"
    clock.now += 0.1
    await _refused("credential_revoked", lambda: auth.authenticate_bearer(token))
    # A clock set back does not stretch the period: the store is read again.
    clock.now -= 3600
    await _refused("credential_revoked", lambda: auth.authenticate_bearer(token))


async def test_a_revocation_written_by_another_process_reaches_streaming_checks(service, bootstrap):
    # `ficc admin revoke-token` writes the database directly; the controller learns of it
    # within its period, so a response streaming for that credential is cut too.
    clock = FakeClock(time.time())
    auth = AuthService(service.store, clock=clock)
    token = await issue_token(service, scopes=PROJECT_SCOPES, name="streaming")
    principal = await auth.authenticate_bearer(token)
    assert auth.still_valid(principal)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(auth.watch_revocations, 0.01))
            # Revoked after the watcher began looking, on its clock.
            await service.store.write(
                lambda tx: tx.execute(
                    "UPDATE credentials SET revoked_at = ? WHERE id = ?",
                    (clock.now + 1, principal.id),
                )
            )
            await eventually(lambda: not auth.still_valid(principal), None, every=0.01)
            nursery.cancel_scope.cancel()
    with pytest.raises(Unauthenticated) as refused:
        auth.check_valid(principal)
    assert refused.value.code == "credential_revoked"


def test_first_run_secrets_are_never_readable_by_others_even_while_written(tmp_path, monkeypatch):
    # With the most permissive umask, the file still appears whole, already 0600.
    seen = []
    real_replace = os.replace

    def replace(source, target):
        seen.append((stat.S_IMODE(os.stat(source).st_mode), os.path.exists(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    previous = os.umask(0)
    try:
        created = {"project": "default", "username": "admin", "password": "p" * 24}
        path = write_first_run_secrets(tmp_path, {**created, "token": "ficc_x.y"})
    finally:
        os.umask(previous)
    assert seen == [(0o600, False)]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "admin token: ficc_x.y" in path.read_text()
    assert os.listdir(tmp_path) == ["first-run-secrets"]
