"""Every refusal is the one JSON error envelope with a 4xx code; never a 500 or a trace.

The property at the end sends hostile requests to a real server (hypercorn on
loopback): arbitrary and near-valid bodies on every route that reads one, with
lone surrogate escapes, ``NaN``, ``Infinity``, ``1e999``, ``2**63`` and 400-digit
integers anywhere, and hostile values for every query parameter. It runs
``FICC_PROPERTY_EXAMPLES`` examples (300 by default: marked slow, it runs in CI's
``make test``, not in ``make test-fast``); the full count is::

    FICC_PROPERTY_EXAMPLES=10000 .venv/bin/python -m pytest -q -p no:cacheprovider \
        tests/api/test_errors.py -k never_cause
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ficc_core.config import load_config
from ficc_core.routing.live import LiveService

from ..conftest import LiveServer, bearer


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


# -- property: hostile requests on every route that reads a body or a query -----------------

EXAMPLES = int(os.environ.get("FICC_PROPERTY_EXAMPLES", "300"))
SERVICE = "svc_property"
ALIAS = "prop"


class Raw(str):
    """JSON text written as is (``1e999``, ``-Infinity``): Python cannot hold it as a value."""


_hostile_numbers = st.sampled_from(
    [
        Raw("NaN"),
        Raw("Infinity"),
        Raw("-Infinity"),
        Raw("1e999"),
        Raw("-1e999"),
        2**63,
        -(2**63) - 1,
        2**64,
        2**53 + 1,
        int("9" * 400),
        -int("9" * 400),
        Raw("1" + "0" * 5000),
    ]
)
_hostile_strings = st.sampled_from(["\ud800", "\udfff", "a\udc00b", "\ud83d", "\ude00x"]) | st.text(
    alphabet=st.characters(exclude_categories=()), max_size=12
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | _hostile_numbers
    | _hostile_strings
    | st.text(max_size=20)
)
_FIELDS = [
    # bodies of the management routes
    "name", "scopes", "lifetime", "username", "password", "admin", "projects", "project",
    "format", "files", "path", "size", "sha256", "url", "licence", "source", "metadata",
    "offset", "data", "repository", "revision", "filename", "spec", "acknowledge_unknown",
    # the specification
    "alias", "model_id", "engine", "runtime", "image_executable", "context", "concurrency",
    "placements", "gpu_layers", "tensor_split", "parallelism", "request_deadline", "node_id",
    "limits", "cpus", "memory_bytes", "gpus", "index", "pids", "open_files",
    # the specification's routing fields
    "description", "aliases", "fallbacks", "context_length", "max_output", "capabilities",
    "tools", "vision",
    # chat, embeddings and completions
    "model", "messages", "role", "content", "stream", "stream_options", "include_usage", "input",
    "prompt", "max_tokens",
]  # fmt: skip
_json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(_FIELDS) | _hostile_strings, children, max_size=4)
    ),
    max_leaves=12,
)


def encode(value: Any) -> str:
    """JSON text of ``value`` as a hostile client writes it (lone surrogates as escapes)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{encode(str(k))}:{encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(encode(item) for item in value) + "]"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if abs(value) < 10**4000 else "1" + "0" * 4300
    return json.dumps(value)  # ensure_ascii: "\ud800" is written as the escape


SHA = "a" * 64
RUNTIME = {
    "executor_provider": "process",
    "package_digest": "sha256:" + SHA,
    "image_digest": "sha256:" + SHA,
    "isolation": "process",
}
SPEC = {
    "alias": ALIAS,
    "model_id": "mdl_missing",
    "engine": "llama_cpp",
    "runtime": RUNTIME,
    "image_executable": "/opt/llama/llama-server",
    "context": 4096,
    "concurrency": 4,
    "placements": [
        {
            "node_id": "n1",
            "limits": {
                "cpus": 2,
                "memory_bytes": 1024,
                "gpus": [{"index": 0, "memory_bytes": 1024}],
                "pids": 64,
                "open_files": 64,
            },
        }
    ],
    "gpu_layers": 10,
    "tensor_split": [1, 1],
    "parallelism": 1,
    "request_deadline": 30,
    "description": "a service to break",
    "aliases": ["other-name"],
    "fallbacks": ["a-fallback"],
    "context_length": 2048,
    "max_output": 512,
    "capabilities": {"tools": True, "vision": False},
}
MANIFEST = {
    "name": "m",
    "format": "gguf",
    "files": [{"path": "m.gguf", "size": 1, "sha256": SHA, "url": "https://example.org/m"}],
    "licence": "mit",
    "source": {"repository": "org/repo", "revision": "main"},
}
CHAT = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "stream": False}
COMPLETION = {"model": ALIAS, "prompt": "Once", "max_tokens": 4, "stream": True}
#: Every route that reads a JSON body, with a valid body to mutate.
BODY_ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/api/v1/session", {"username": "admin", "password": "x", "project": "default"}),
    ("POST", "/api/v1/tokens", {"name": "t", "scopes": ["models:read"], "lifetime": 60}),
    ("POST", "/api/v1/tokens", {"name": "t", "scopes": ["models:read"], "band": "batch"}),
    ("POST", "/api/v1/projects", {"name": "p"}),
    ("PUT", "/api/v1/projects/default/band", {"band": "batch"}),
    ("POST", "/api/v1/users", {"username": "u", "password": "p", "projects": {"default": []}}),
    ("PUT", "/api/v1/users/nobody/projects/default", {"scopes": ["models:read"]}),
    ("POST", "/api/v1/models", MANIFEST),
    ("POST", "/api/v1/models/mdl_missing/files/0", {"offset": 0, "data": "eA=="}),
    ("POST", "/api/v1/models/hub-preview", {"repository": "org/repo", "revision": "main"}),
    ("POST", "/api/v1/inference/preview", SPEC),
    ("POST", "/api/v1/inference", SPEC),
    ("PUT", f"/api/v1/inference/{SERVICE}", {"revision": 1, "spec": SPEC}),
    *(
        ("POST", f"/api/v1/inference/{SERVICE}/control/{action}", {"revision": 1})
        for action in ("start", "drain", "stop", "remove")
    ),
    ("POST", f"/api/v1/inference/{SERVICE}/tokens", {"lifetime": 60, "name": "i"}),
    ("POST", f"/api/v1/inference/{SERVICE}/tokens", {"lifetime": 60, "band": "batch"}),
    ("POST", f"/api/v1/inference/{SERVICE}/v1/chat/completions", CHAT),
    ("POST", f"/api/v1/inference/{SERVICE}/v1/embeddings", {"model": ALIAS, "input": "hi"}),
    ("POST", f"/api/v1/inference/{SERVICE}/v1/completions", COMPLETION),
    # the project endpoint: `model` names the service
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/embeddings", {"model": ALIAS, "input": "hi"}),
    ("POST", "/v1/completions", COMPLETION),
    # the operations on running services (docs/operations.md)
    ("POST", f"/api/v1/inference/{SERVICE}/restart", {"revision": 1}),
    ("POST", f"/api/v1/inference/{SERVICE}/replicas/0/restart", {"revision": 1}),
    (
        "POST",
        f"/api/v1/inference/{SERVICE}/replicas/0/move",
        {"target_node_id": "local", "target_gpu_index": 0, "start_after_move": True, "revision": 1},
    ),
    (
        "POST",
        "/api/v1/inference/bulk-move",
        {
            "replicas": [{"service_id": SERVICE, "replica": 0}],
            "target_node_id": "local",
            "target_gpu_index": 0,
            "start_after_move": False,
        },
    ),
    ("POST", f"/api/v1/inference/{SERVICE}/rollout", {"revision": 1, "spec": SPEC}),
    ("POST", f"/api/v1/inference/{SERVICE}/rollout/preview", {"spec": SPEC}),
]
#: Every query parameter a route reads.
QUERY_ROUTES = [
    ("GET", f"/api/v1/inference/{SERVICE}/usage", "since"),
    ("GET", "/api/v1/usage", "since"),
    ("GET", "/api/v1/usage", "until"),
    ("GET", "/api/v1/usage", "period"),
    ("GET", "/api/v1/usage", "group_by"),
    ("GET", "/api/v1/usage", "person"),
    ("POST", "/api/v1/models/mdl_missing/files/0/bytes", "offset"),
    ("DELETE", "/api/v1/models/mdl_missing", "evict"),
    ("GET", f"/api/v1/inference/{SERVICE}/events", "after"),
    ("GET", f"/api/v1/inference/{SERVICE}/events", "limit"),
    ("GET", f"/api/v1/inference/{SERVICE}/replicas/0/logs", "tail"),
    ("GET", f"/api/v1/inference/{SERVICE}/replicas/0/logs/stream", "tail"),
    ("GET", f"/api/v1/inference/{SERVICE}/replicas/0/logs/stream", "ticket"),
]
_QUERY_VALUES = [
    *("nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1", "0x10", "1_000", "", " 1", "1.5"),
    *("9" * 400, str(2**63), str(2**53), "%ED%A0%80", "%FF", "%00", "true", "0" * 30),
]
_hostile_query = st.sampled_from(_QUERY_VALUES) | st.text(
    alphabet=st.characters(exclude_categories=()), max_size=12
).map(lambda text: quote(text.encode("utf-8", "surrogatepass"), safe=""))


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _replaced(document: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


@st.composite
def _near_valid(draw: Any) -> tuple[str, str, str]:
    method, path, body = draw(st.sampled_from(BODY_ROUTES))
    where = draw(st.sampled_from(list(_paths(body))[1:]))
    return method, path, encode(_replaced(body, where, draw(_json_values)))


@st.composite
def _arbitrary(draw: Any) -> tuple[str, str, str | bytes]:
    method, path, _ = draw(st.sampled_from(BODY_ROUTES))
    raw = draw(st.one_of(_json_values.map(encode), st.binary(max_size=64)))
    return method, path, raw


@st.composite
def _query(draw: Any) -> tuple[str, str, bytes]:
    method, path, name = draw(st.sampled_from(QUERY_ROUTES))
    value = draw(_hostile_query)
    return method, f"{path}?{name}={value}", b"x"


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory) -> Iterator[LiveServer]:
    """A real server whose hub is a loopback address (refused: no request leaves the host),
    with one serving inference service that has no replica (a valid chat gets 503)."""
    config = load_config(
        overrides={
            "data_dir": str(tmp_path_factory.mktemp("hostile")),
            "port": 0,
            "hub_url": "https://127.0.0.1:9",
        },
        environ={},
    )
    with LiveServer(config) as server:
        view = LiveService(
            id=SERVICE,
            project_id=_default_project(server),
            alias=ALIAS,
            generation=1,
            admission="serving",
            concurrency=1,
            capabilities=("chat", "streaming", "embeddings", "completions"),
        )
        server.call(server.service.live.publish, view)
        yield server


def _default_project(server: LiveServer) -> str:
    whoami = httpx.get(
        server.url + "/api/v1/whoami", headers=bearer(server.bootstrap["token"]), timeout=10
    )
    return whoami.json()["project"]["id"]


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"a response holds {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow  # about 25 s for the 300 cases
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=st.one_of(_near_valid(), _arbitrary(), _query()))
def test_hostile_requests_never_cause_a_server_error_or_a_non_json_constant(
    hostile_server, request
):
    method, path, raw = request
    content_type = "application/octet-stream" if "/bytes?" in path else "application/json"
    response = httpx.request(
        method,
        hostile_server.url + path,
        content=raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw,
        headers={**bearer(hostile_server.bootstrap["token"]), "Content-Type": content_type},
        timeout=10,
    )
    text = response.text
    document = _strict(text) if text and "json" in response.headers["content-type"] else None
    if response.status_code >= 400:
        assert document is not None, (response.status_code, text)
        error = document["error"]
        if response.status_code >= 500:
            # The one 5xx a client can reach: a chat the gateway accepted, with no replica.
            assert error["code"] == "no_ready_replica", (request, text)
            accepted = _strict(raw)
            json.dumps(accepted, ensure_ascii=False).encode("utf-8")  # no lone surrogate
        else:
            assert_envelope(document, response.status_code)
