"""Routes are declared once, in the route table, and registered from it.

A view names its endpoint; its method, path, access and CSRF rule come from
``ficc_core.api.access.ROUTES``. Registering an undeclared route fails, and so does
an application with a route added around the table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from quart_trio import QuartTrio

import ficc_core.api
from ficc_core.api import access, routes_invoke, routes_web
from ficc_core.api.access import ROUTE_ACCESS, ROUTES, SAFE_METHODS, add_route, route
from ficc_core.api.app import create_app

# Quart's own ways to register a view, which would bypass the table.
_AROUND_THE_TABLE = re.compile(
    r"\bapp\.(get|post|put|patch|delete|route|websocket|add_url_rule|add_websocket)\("
)


async def _view() -> str:
    return ""


def test_a_view_cannot_be_registered_for_an_undeclared_route():
    app = QuartTrio("declarations")
    with pytest.raises(LookupError, match=r"'reports_list' is not declared: add it to ROUTES"):
        route(app, "reports_list")
    with pytest.raises(LookupError, match=r"ficc_core/api/access\.py"):
        add_route(app, "reports_list", _view)
    assert not [rule for rule in app.url_map.iter_rules() if rule.endpoint == "reports_list"]


def test_a_declared_route_is_registered_at_its_declared_method_and_path():
    app = QuartTrio("declarations")
    route(app, "models_get")(_view)
    route(app, "contributors_connect")(_view)
    rules = {rule.endpoint: rule for rule in app.url_map.iter_rules()}
    assert rules["models_get"].rule == "/api/v1/models/<model_id>" == ROUTES["models_get"].rule
    assert set(rules["models_get"].methods) - {"HEAD", "OPTIONS"} == {"GET"}
    assert rules["contributors_connect"].websocket


async def test_the_app_refuses_to_start_with_a_route_registered_around_the_table(
    service, monkeypatch
):
    register = routes_web.register

    def register_and_one_more(app, service):
        register(app, service)
        app.add_url_rule("/api/v1/reports", endpoint="reports_list", view_func=_view)

    monkeypatch.setattr(routes_web, "register", register_and_one_more)
    with pytest.raises(
        RuntimeError, match=r"without an entry in the route table: \['reports_list'\]"
    ):
        create_app(service)


def test_no_router_registers_a_view_around_the_table():
    folder = Path(ficc_core.api.__file__).parent
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(folder.glob("routes_*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _AROUND_THE_TABLE.search(line)
    ]
    assert found == [], "register views with access.route / access.add_route"


def test_each_route_declares_its_csrf_rule_and_the_app_enforces_that():
    for name, declared in ROUTES.items():
        assert declared.csrf == (declared.method not in SAFE_METHODS), name
        assert ROUTE_ACCESS[name].csrf == declared.csrf, name
        assert ROUTE_ACCESS[name].scopes == declared.access.scopes, name


def test_the_invoke_routes_served_in_front_of_quart_are_the_tables():
    for method, rule, csrf, endpoint in (
        *routes_invoke.ROUTES.values(),
        *routes_invoke.PROJECT_ROUTES.values(),
        *routes_invoke.MODEL_ROUTES,
    ):
        declared = access.ROUTES[endpoint]
        assert (method, rule, csrf) == (declared.method, declared.rule, declared.csrf)
    with pytest.raises(RuntimeError, match=r"make ROUTES in ficc_core/api/access\.py agree"):
        routes_invoke._served("invoke_models", "POST", "/api/v1/inference/<service_id>/v1/models")
