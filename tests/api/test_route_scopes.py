"""Every registered route refuses the unauthenticated (401) and every missing scope (403)."""

from __future__ import annotations

import re

from ficc_core.api.access import ROUTE_ACCESS, ROUTES
from ficc_core.auth import ALL_SCOPES
from ficc_core.devtools import docs_routes

from ..conftest import bearer, issue_token


def _routes(app):
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<int:[^>]+>", "0", rule.rule)
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"placeholder-\1", path)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            yield rule, method, path


async def _call(client, method, path, headers=None):
    return await client.open(path, method=method, headers=headers or {}, json={})


async def test_every_route_has_an_entry_in_the_table_and_the_table_no_stale_entries(app):
    endpoints = {rule.endpoint for rule in app.url_map.iter_rules()}
    assert endpoints == set(ROUTE_ACCESS)


def _shape(path: str) -> str:
    """A path with its query dropped and every placeholder (``<name>``, ``{name}``) as ``{}``."""
    return re.sub(r"<[^>]+>|\{[^}]+\}", "{}", path.partition("?")[0])


async def test_every_registered_route_is_in_the_documented_table_with_its_method_and_path(app):
    registered = {
        rule.endpoint: (
            {"GET"} if rule.websocket else set(rule.methods) - {"HEAD", "OPTIONS"},
            _shape(rule.rule),
        )
        for rule in app.url_map.iter_rules()
    }
    documented = {name: ({route.method}, _shape(route.path)) for name, route in ROUTES.items()}
    assert registered == documented
    assert any(path.startswith("/api/v1/") for _, path in registered.values())


def test_the_route_table_of_docs_api_md_is_generated_from_the_route_scope_table():
    assert docs_routes.main(["--check"]) == 0, "run: python -m ficc_core.devtools.docs_routes"


def test_the_route_table_renders_each_route_once_on_one_line_in_one_table():
    table = docs_routes.render().splitlines()
    rows = [line for line in table if line.startswith("| `")]
    assert len(rows) == len(ROUTES)
    assert "" not in table[table.index("|---|---|---|") :]
    drain = "| `POST /api/v1/inference/{id}/control/drain` | `inference:manage`, `jobs:cancel` |"
    assert any(row.startswith(drain) for row in rows)


async def test_every_non_public_route_refuses_a_request_without_credential(app, client):
    checked = 0
    for rule, method, path in _routes(app):
        access = ROUTE_ACCESS[rule.endpoint]
        response = await _call(client, method, path)
        if access.node or access.ticket:
            # Only a node credential (a ticket) opens it: without one, the handler answers 401.
            assert response.status_code == 401, (method, path)
        elif access.public:
            assert response.status_code not in (401, 403), (method, path)
        else:
            assert response.status_code == 401, (method, path)
            assert (await response.get_json())["error"]["code"] == "unauthenticated"
            checked += 1
    assert checked >= 9


async def test_every_route_refuses_a_credential_lacking_any_one_required_scope(
    app, client, service, bootstrap
):
    tokens = {
        scope: await issue_token(service, scopes=set(ALL_SCOPES) - {scope}, name=f"no-{scope}")
        for scope in ALL_SCOPES
    }
    checked = 0
    for rule, method, path in _routes(app):
        for scope in sorted(ROUTE_ACCESS[rule.endpoint].scopes):
            response = await _call(client, method, path, bearer(tokens[scope]))
            assert response.status_code == 403, (method, path, scope)
            error = (await response.get_json())["error"]
            assert error["code"] == "missing_scope"
            assert error["details"]["missing"] == [scope]
            checked += 1
    assert checked >= 9


async def test_a_ticket_route_refuses_a_bearer_credential_without_a_ticket(
    app, client, service, bootstrap
):
    token = await issue_token(service, scopes=set(ALL_SCOPES), name="everything")
    checked = 0
    for rule, method, path in _routes(app):
        if not ROUTE_ACCESS[rule.endpoint].ticket:
            continue
        response = await _call(client, method, path, bearer(token))
        assert response.status_code == 401, (method, path)
        error = (await response.get_json())["error"]
        assert error["code"] == "ticket_invalid"
        assert error["details"]["reason"] == "missing"
        checked += 1
    assert checked >= 1


async def test_a_credential_holding_the_scopes_gets_past_authorisation(
    app, client, service, bootstrap
):
    admin = next(user for user in await service.auth.list_users() if user.username == "admin")
    for rule, method, path in _routes(app):
        access = ROUTE_ACCESS[rule.endpoint]
        if access.public:
            continue  # node routes too: a project credential never opens them
        # A person's credential: the /me routes are a person's (docs/people.md).
        token = await issue_token(
            service, scopes=access.scopes or {"models:read"}, user_id=admin.id
        )
        response = await _call(client, method, path, bearer(token))
        assert response.status_code not in (401, 403), (method, path)
