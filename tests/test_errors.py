"""Every refusal is the one JSON error envelope with a 4xx code; never a 500 or a trace."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import bearer


def assert_envelope(body: dict, status: int) -> dict:
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    assert 400 <= status < 500
    return error


async def test_unknown_route_is_404_envelope(client):
    response = await client.get("/api/v1/no-such-thing")
    assert response.status_code == 404
    assert assert_envelope(await response.get_json(), 404)["code"] == "not_found"


async def test_wrong_method_is_405_envelope_with_allow(client):
    response = await client.delete("/api/v1/health")
    assert response.status_code == 405
    assert "GET" in response.headers["Allow"]
    assert assert_envelope(await response.get_json(), 405)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("raw", "code", "path"),
    [
        (b"{not json", "invalid_json", None),
        (b"", "invalid_json", None),
        (b"\xff\xfe", "invalid_json", None),
        (b"[1, 2]", "invalid_request", "$"),
        (b'{"name": 5, "scopes": ["models:read"]}', "invalid_request", "$.name"),
        (b'{"name": "a", "scopes": "models:read"}', "invalid_request", "$.scopes"),
        (b'{"name": "a", "scopes": ["models:read"], "colour": 1}', "invalid_request", "$.colour"),
        (b'{"scopes": ["models:read"]}', "invalid_request", "$.name"),
        (
            b'{"name": "a", "scopes": ["models:read"], "lifetime": true}',
            "invalid_request",
            "$.lifetime",
        ),
        (
            b'{"name": "a", "scopes": ["models:read"], "lifetime": -1}',
            "invalid_request",
            "$.lifetime",
        ),
        (b'{"name": "a", "scopes": ["no:such"]}', "invalid_request", "$.scopes"),
        (b'{"name": "bad name!", "scopes": ["models:read"]}', "invalid_request", "$.name"),
    ],
)
async def test_bad_bodies_are_400_envelopes_naming_the_field(client, bootstrap, raw, code, path):
    response = await client.post(
        "/api/v1/tokens",
        data=raw,
        headers={**bearer(bootstrap["token"]), "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    error = assert_envelope(await response.get_json(), 400)
    assert error["code"] == code
    if path is not None:
        assert path in [e["path"] for e in error["details"]["errors"]]


async def test_oversized_body_is_413_envelope(client, bootstrap, service):
    limit = service.config.max_body_bytes
    raw = json.dumps({"name": "big", "scopes": ["models:read"], "pad": "x" * limit}).encode()
    response = await client.post(
        "/api/v1/tokens",
        data=raw,
        headers={**bearer(bootstrap["token"]), "Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert assert_envelope(await response.get_json(), 413)["code"] == "payload_too_large"


async def test_non_json_content_type_is_415_envelope(client, bootstrap):
    response = await client.post(
        "/api/v1/tokens",
        data=b"name=a",
        headers={**bearer(bootstrap["token"]), "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 415
    assert assert_envelope(await response.get_json(), 415)["code"] == "unsupported_media_type"


async def test_an_unexpected_exception_becomes_a_500_envelope_without_a_trace(app, client):
    @app.get("/boom", endpoint="health_boom")
    async def boom():
        raise ZeroDivisionError("secret internals")

    from ficc_core.api.access import PUBLIC, ROUTE_ACCESS

    ROUTE_ACCESS["health_boom"] = PUBLIC
    try:
        response = await client.get("/boom")
    finally:
        del ROUTE_ACCESS["health_boom"]
    assert response.status_code == 500
    body = await response.get_json()
    assert body["error"]["code"] == "internal_error"
    assert "secret internals" not in json.dumps(body)
    assert body["error"]["details"]["reference"]


# -- property: arbitrary bodies on every route that takes one --------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = ["name", "scopes", "lifetime", "username", "password", "admin", "projects", "project"]
_objects = st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=8), _json_values, max_size=6)
_bodies = (
    _objects.map(lambda d: json.dumps(d).encode())
    | _json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
)
_ROUTES = [
    ("POST", "/api/v1/tokens"),
    ("POST", "/api/v1/projects"),
    ("POST", "/api/v1/users"),
    ("PUT", "/api/v1/users/nobody/projects/default"),
    ("POST", "/api/v1/session"),
]


@settings(max_examples=300, deadline=None)
@given(route=st.sampled_from(_ROUTES), raw=_bodies)
def test_arbitrary_bodies_never_cause_a_server_error(live_server, route, raw):
    method, path = route
    response = httpx.request(
        method,
        live_server.url + path,
        content=raw,
        headers={**bearer(live_server.bootstrap["token"]), "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code < 500, (route, raw)
    if response.status_code >= 400:
        assert_envelope(response.json(), response.status_code)
