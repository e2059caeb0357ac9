"""Hostile input against a real server: lone surrogates, non-finite numbers, huge integers.

Each case is one a client sent to a running ``ficc serve`` and got a 500, an empty
404 or a non-JSON constant back (issue 14, items 1 to 3). Every one is now a 4xx
in the one envelope, naming the field where there is one, and no response holds
``NaN`` or ``Infinity``. ``test_errors.py`` runs the same cases as a property over
every body route and query parameter.
"""

from __future__ import annotations

import json
import typing

import attrs
import httpx
import pytest
import trio

from ficc_core.api.app import error_response_bytes
from ficc_core.base.errors import InvalidRequest
from ficc_core.devtools import docs_ranges
from ficc_core.schema._convert import RANGE

from ..conftest import bearer
from ..inference.test_inference_api import GIB, _gpu_node, _placement, _spec, _tiny_model
from ..support.gateway_support import ALIAS, gateway_env
from ..support.inference_support import open_inference_controller

SHA = "a" * 64


def strict(text: str) -> object:
    """Parse ``text`` as a strict parser (a browser's ``JSON.parse``) does."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in a response: {text[:200]}")

    document = json.loads(text, parse_constant=refuse)
    json.dumps(document, ensure_ascii=False).encode("utf-8")  # no lone surrogate
    return document


def refusal(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    error = strict(response.text)["error"]
    assert set(error) == {"code", "message", "details"} and error["message"]
    return error


def paths(error: dict) -> list[str]:
    return [e["path"] for e in error["details"].get("errors", [])]


def _send(live_server, method: str, path: str, raw: str, *, anonymous: bool = False):
    headers = {"Content-Type": "application/json"}
    if not anonymous:
        headers.update(bearer(live_server.bootstrap["token"]))
    return httpx.request(
        method, live_server.url + path, content=raw.encode(), headers=headers, timeout=10
    )


_MODEL = {
    "name": "m",
    "format": "gguf",
    "files": [{"path": "m.gguf", "size": 1, "sha256": SHA}],
}

# -- item 1: lone surrogate escapes ---------------------------------------------------------

# Each JSON text holds the escape \ud800 (or \udfff) in one string; \\u below is a
# JSON escape, never a Python one, so the bytes sent are exactly what curl sends.
_SURROGATE_BODIES = [
    ("POST", "/api/v1/session", r'{"username":"\ud800","password":"x","project":"default"}'),
    ("POST", "/api/v1/session", r'{"username":"admin","password":"\udfff","project":"default"}'),
    ("POST", "/api/v1/tokens", r'{"name":"\ud800","scopes":["models:read"]}'),
    ("POST", "/api/v1/tokens", r'{"name":"t","scopes":["\ud800"]}'),
    ("POST", "/api/v1/tokens", r'{"name":"t","scopes":["models:read"],"band":"\ud800"}'),
    ("POST", "/api/v1/projects", r'{"name":"p\ud800"}'),
    ("PUT", "/api/v1/projects/default/band", r'{"band":"\ud800"}'),
    ("POST", "/api/v1/users", r'{"username":"u","password":"\ud800"}'),
    ("POST", "/api/v1/users", r'{"username":"u","password":"p","projects":{"\ud800":[]}}'),
    ("PUT", "/api/v1/users/nobody/projects/default", r'{"scopes":["\ud800"]}'),
    ("POST", "/api/v1/models", json.dumps({**_MODEL, "name": "SURROGATE"})),
    ("POST", "/api/v1/models", json.dumps({**_MODEL, "licence": "SURROGATE"})),
    (
        "POST",
        "/api/v1/models",
        json.dumps({**_MODEL, "files": [{**_MODEL["files"][0], "path": "SURROGATE"}]}),
    ),
    (
        "POST",
        "/api/v1/models",
        json.dumps({**_MODEL, "files": [{**_MODEL["files"][0], "url": "https://h/SURROGATE"}]}),
    ),
    ("POST", "/api/v1/models/hub-preview", r'{"repository":"\ud800"}'),
    ("POST", "/api/v1/inference/preview", r'{"alias":"\ud800"}'),
    ("POST", "/api/v1/inference", r'{"model_id":"\ud800"}'),
]


@pytest.mark.parametrize(("method", "path", "raw"), _SURROGATE_BODIES)
def test_a_lone_surrogate_in_any_string_is_a_400_naming_where_it_is(live_server, method, path, raw):
    raw = raw.replace("SURROGATE", "\\ud800")
    error = refusal(_send(live_server, method, path, raw, anonymous=path == "/api/v1/session"))
    assert error["code"] == "invalid_json"
    assert "surrogate" in error["message"]
    assert paths(error)[0].startswith("$.")


def test_a_valid_surrogate_pair_is_text_and_reaches_validation(live_server):
    # "\ud83d\ude00" is one character (an emoji), as Python's json.dumps writes it.
    response = _send(
        live_server, "POST", "/api/v1/tokens", r'{"name":"t","scopes":["\ud83d\ude00"]}'
    )
    error = refusal(response)
    assert error["code"] == "invalid_request" and paths(error) == ["$.scopes"]


def test_an_error_envelope_renders_whatever_its_message_and_details_hold():
    error = InvalidRequest("bad \ud800 name", details={"value": "\udfff", "ratio": float("nan")})
    document = strict(error_response_bytes(error).decode("utf-8"))
    assert document["error"]["message"] == "bad \ufffd name"
    assert document["error"]["details"] == {"value": "\ufffd", "ratio": None}


@pytest.mark.deadline(70)
async def test_a_surrogate_in_a_chat_body_is_a_400_on_both_invoke_paths(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            env.publish("svc", [await env.launch()])
            _, token = await env.token("svc")
            url = "/api/v1/inference/svc/v1/chat/completions"
            content = r'{"model":"%s","messages":[{"role":"user","content":"hi \ud800"}]}'
            model = r'{"model":"\ud800","messages":[{"role":"user","content":"hi"}]}'
            emoji = '{"model":"%s","messages":[{"role":"user","content":"\\ud83d\\ude00"}]}'
            async with env.http(token) as http:
                # The service's route and the project endpoint's.
                for route in (url, "/v1/chat/completions"):
                    for raw in (content % ALIAS, model):
                        response = await http.post(route, content=raw.encode())
                        error = refusal(response)
                        assert error["code"] == "invalid_json"
                        assert "surrogate" in error["message"]
                    answer = await http.post(route, content=(emoji % ALIAS).encode())
                    assert answer.status_code == 200, answer.text
            # The same through the Quart route (a session cookie, not a bearer token).
            async with httpx.AsyncClient(base_url=env.url, timeout=30) as http:
                await env.service.auth.create_user(
                    "caller", "a-password-1", projects={"default": frozenset({"inference:invoke"})}
                )
                login = await http.post(
                    "/api/v1/session",
                    json={"username": "caller", "password": "a-password-1", "project": "default"},
                )
                assert login.status_code == 201, login.text
                csrf = {"X-CSRF-Token": login.json()["csrf_token"]}
                for raw in (content % ALIAS, model):
                    response = await http.post(url, content=raw.encode(), headers=csrf)
                    assert refusal(response)["code"] == "invalid_json"


# -- item 2: non-finite numbers -----------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["Infinity", "-Infinity", "NaN", "1e999", "-1e999"])
def test_a_non_finite_lifetime_is_refused_and_no_listing_holds_infinity(live_server, lifetime):
    raw = '{"name":"forever","scopes":["models:read"],"lifetime":' + lifetime + "}"
    error = refusal(_send(live_server, "POST", "/api/v1/tokens", raw))
    assert error["code"] == "invalid_json"
    assert "JSON number" in error["message"]
    listing = httpx.get(
        live_server.url + "/api/v1/tokens", headers=bearer(live_server.bootstrap["token"])
    )
    assert listing.status_code == 200
    assert "forever" not in [t["name"] for t in strict(listing.text)["tokens"]]


def test_a_lifetime_of_400_digits_is_a_400_not_an_overflow(live_server):
    raw = '{"name":"forever","scopes":["models:read"],"lifetime":%s}' % ("9" * 400)
    error = refusal(_send(live_server, "POST", "/api/v1/tokens", raw))
    assert "$.lifetime" in paths(error)


async def test_a_response_that_would_hold_nan_is_refused_not_written(app, client):
    from quart import jsonify

    from ficc_core.api.access import PUBLIC, ROUTE_ACCESS

    @app.get("/nan", endpoint="health_nan")
    async def nan():
        return jsonify({"value": float("nan")})

    ROUTE_ACCESS["health_nan"] = PUBLIC
    try:
        response = await client.get("/nan")
    finally:
        del ROUTE_ACCESS["health_nan"]
    text = (await response.get_data()).decode()
    assert response.status_code == 500
    assert strict(text)["error"]["code"] == "internal_error"


# -- items 2 and 3 on an inference service ---------------------------------------------------


@pytest.fixture
async def controller(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path, embedded=False) as controller:
            yield controller


async def test_usage_since_nan_or_infinity_is_400_and_usage_is_strict_json(controller):
    await _gpu_node(controller, "gpu-1")
    model_id = await _tiny_model(controller)
    created = await controller.ok(
        "POST", "/api/v1/inference", status=201, json=_spec(model_id, _placement("gpu-1"))
    )
    usage = f"/api/v1/inference/{created['id']}/usage"
    for since in ("nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1", "soon", "9" * 400):
        error = refusal(await controller.call("GET", usage, params={"since": since}))
        assert paths(error) == ["since"], since
    answer = await controller.call("GET", usage, params={"since": "0"})
    assert answer.status_code == 200
    assert strict(answer.text)["since"] == 0.0

    tokens = f"/api/v1/inference/{created['id']}/tokens"
    for lifetime in ("1e999", "Infinity", "NaN"):
        response = await controller.call(
            "POST",
            tokens,
            content=b'{"lifetime":' + lifetime.encode() + b"}",
            headers={"Content-Type": "application/json"},
        )
        assert refusal(response)["code"] == "invalid_json"
    listed = await controller.call("GET", tokens)
    assert strict(listed.text)["tokens"] == []


async def test_huge_integers_are_400s_naming_the_field(controller):
    await _gpu_node(controller, "gpu-1")
    huge = int("9" * 400)
    for size in (2**63, 2**53, huge):
        manifest = {**_MODEL, "files": [{**_MODEL["files"][0], "size": size}]}
        response = await controller.call("POST", "/api/v1/models", json=manifest)
        assert "$.files[0].size" in paths(refusal(response)), size

    model_id = await _tiny_model(controller)
    spec = _spec(model_id, _placement("gpu-1", gpus=[(0, GIB)]))
    changes = {
        "$.placements[0].limits.memory_bytes": lambda s, v: s["placements"][0]["limits"].update(
            memory_bytes=v
        ),
        "$.placements[0].limits.gpus[0].memory_bytes": lambda s, v: s["placements"][0]["limits"][
            "gpus"
        ][0].update(memory_bytes=v),
        "$.placements[0].limits.cpus": lambda s, v: s["placements"][0]["limits"].update(cpus=v),
        "$.context": lambda s, v: s.update(context=v),
        "$.concurrency": lambda s, v: s.update(concurrency=v),
        "$.gpu_layers": lambda s, v: s.update(gpu_layers=v),
        "$.prompt_cache_bytes": lambda s, v: s.update(prompt_cache_bytes=v),
    }
    for path, change in changes.items():
        for value in (huge, 2**63, 2**53):
            document = json.loads(json.dumps(spec))
            change(document, value)
            for route in ("/api/v1/inference/preview", "/api/v1/inference"):
                response = await controller.call("POST", route, json=document)
                assert path in paths(refusal(response)), (path, value, route)
    # The bounds of context and concurrency are the documented ones.
    for field, maximum in (("context", 2**24), ("concurrency", 4096)):
        response = await controller.call(
            "POST", "/api/v1/inference/preview", json={**spec, field: maximum + 1}
        )
        assert f"$.{field}" in paths(refusal(response))
        response = await controller.call(
            "POST", "/api/v1/inference/preview", json={**spec, field: maximum}
        )
        assert response.status_code == 200, response.text
    assert strict((await controller.call("GET", "/api/v1/inference")).text)["services"] == []

    for offset in ("9" * 400, str(2**63), str(2**53)):
        response = await controller.call(
            "POST",
            f"/api/v1/models/{model_id}/files/0/bytes",
            params={"offset": offset},
            content=b"x",
            headers={"Content-Type": "application/octet-stream"},
        )
        assert paths(refusal(response)) == ["offset"]
    response = await controller.call(
        "POST", f"/api/v1/models/{model_id}/files/0", json={"offset": huge, "data": "eA=="}
    )
    assert "$.offset" in paths(refusal(response))
    for index in ("9" * 400, str(2**63), str(2**53)):
        for suffix, kwargs in (
            ("", {"json": {"offset": 0, "data": "eA=="}}),
            ("/bytes", {"params": {"offset": 0}, "content": b"x"}),
        ):
            headers = {"Content-Type": "application/octet-stream"} if suffix else {}
            response = await controller.call(
                "POST",
                f"/api/v1/models/{model_id}/files/{index}{suffix}",
                headers=headers,
                **kwargs,
            )
            assert 400 <= response.status_code < 500, (index, suffix, response.text)
            strict(response.text)


# -- item 3: every integer field has a documented range -------------------------------------


def _api_and_schema_classes() -> list[type]:
    import ficc_core.schema as schema
    from ficc_core.api import (
        routes_admin,
        routes_inference,
        routes_models,
        routes_operations,
        routes_system,
        routes_tokens,
    )

    modules = [
        schema,
        routes_admin,
        routes_inference,
        routes_models,
        routes_operations,
        routes_system,
        routes_tokens,
    ]
    found = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and attrs.has(value)
    }
    return sorted(found, key=lambda cls: cls.__qualname__)


def test_every_integer_field_declares_its_range_and_the_docs_render_them():
    unranged = []
    for cls in _api_and_schema_classes():
        hints = typing.get_type_hints(cls)
        for field in attrs.fields(cls):
            if hints[field.name] in (int, int | None) and RANGE not in field.metadata:
                unranged.append(f"{cls.__qualname__}.{field.name}")
    assert unranged == [], "declare them with schema._convert.integer()"
    assert docs_ranges.main(["--check"]) == 0, "run: python -m ficc_core.devtools.docs_ranges"


async def test_the_operations_bodies_refuse_out_of_range_and_mistyped_numbers_naming_them(
    controller,
):
    """Move, bulk move, restart and rollout read their bodies before anything else: a
    number out of its range, a boolean for a number, or a list too long is a 400 that
    names the field, for any service (nothing is looked up, nothing is written)."""
    huge = int("9" * 400)
    move = "/api/v1/inference/svc_none/replicas/0/move"
    for value in (huge, 2**63, -1, 1024, True, "0", 1.5):
        body = {"target_node_id": "n", "target_gpu_index": value}
        error = refusal(await controller.call("POST", move, json=body))
        assert "$.target_gpu_index" in paths(error), (value, error)
        if value == 1024:
            continue  # a revision, though not a GPU index
        error = refusal(
            await controller.call("POST", move, json={"target_node_id": "n", "revision": value})
        )
        assert "$.revision" in paths(error), (value, error)
    error = refusal(
        await controller.call("POST", move, json={"target_node_id": "n", "start_after_move": 1})
    )
    assert "$.start_after_move" in paths(error)
    bulk = "/api/v1/inference/bulk-move"
    item = {"service_id": "svc_none", "replica": 0}
    for replicas in ([], [item] * 51):
        error = refusal(
            await controller.call("POST", bulk, json={"replicas": replicas, "target_node_id": "n"})
        )
        assert "$.replicas" in paths(error), (len(replicas), error)
    for value in (huge, -1, 4096, True):
        body = {"replicas": [{**item, "replica": value}], "target_node_id": "n"}
        error = refusal(await controller.call("POST", bulk, json=body))
        assert "$.replicas[0].replica" in paths(error), (value, error)
    for route in ("restart", "replicas/0/restart", "rollout"):
        body = {"revision": huge, "spec": {}}
        response = await controller.call("POST", f"/api/v1/inference/svc_none/{route}", json=body)
        assert "$.revision" in paths(refusal(response)), route
    assert strict((await controller.call("GET", "/api/v1/inference")).text)["services"] == []
