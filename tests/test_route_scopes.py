"""Every registered route refuses the unauthenticated (401) and every missing scope (403)."""

from __future__ import annotations

import re

from ficc_core.api.access import ROUTE_ACCESS
from ficc_core.auth import ALL_SCOPES

from .conftest import bearer, issue_token


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


async def test_every_non_public_route_refuses_a_request_without_credential(app, client):
    checked = 0
    for rule, method, path in _routes(app):
        access = ROUTE_ACCESS[rule.endpoint]
        response = await _call(client, method, path)
        if access.node:
            # Only a node credential opens it: without one, the handler answers 401.
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


async def test_a_credential_holding_the_scopes_gets_past_authorisation(
    app, client, service, bootstrap
):
    for rule, method, path in _routes(app):
        access = ROUTE_ACCESS[rule.endpoint]
        if access.public:
            continue  # node routes too: a project credential never opens them
        token = await issue_token(service, scopes=access.scopes or {"models:read"})
        response = await _call(client, method, path, bearer(token))
        assert response.status_code not in (401, 403), (method, path)
