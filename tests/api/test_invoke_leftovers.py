"""Request input a client sends that the API took wrongly (issue 45, "left alone in
earlier work"), against a real ``ficc serve`` and, for the invoke routes, the real
llama.cpp engine with SmolLM2:

- a JSON string for a ``list[str]`` field is a 400 naming the field (it became a list
  of its characters), on every body that has one;
- OpenAI's ``developer`` and ``tool`` roles reach the engine and are answered;
- a drained or stopped service is named by what the client sent (the alias or the ID);
- the embeddings refusal names the model in the client's words, not an engine's
  internal capability (``tokenize.llama_cpp``), and says what to do.
"""

from __future__ import annotations

import importlib
import pkgutil
import types
import typing

import attrs
import httpx
import pytest
import trio

import ficc_core.api
import ficc_core.schema
from ficc_core.schema._convert import SchemaError, structure

from ..conftest import bearer
from ..support.inference_support import open_inference_controller, ready_service, register_smollm2

# -- a string for a list ---------------------------------------------------------------------


def _body_classes() -> list[type]:
    """Every attrs class of the API's modules and the schema: what a body structures as."""
    modules = [ficc_core.schema] + [
        importlib.import_module(f"ficc_core.api.{info.name}")
        for info in pkgutil.iter_modules(ficc_core.api.__path__)
    ]
    found = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and attrs.has(value)
    }
    return sorted(found, key=lambda cls: cls.__qualname__)


def _is_array(type_: typing.Any) -> bool:
    optional = isinstance(type_, types.UnionType) or typing.get_origin(type_) is typing.Union
    for candidate in (type_, *(typing.get_args(type_) if optional else ())):  # X, X | None
        origin = typing.get_origin(candidate)
        if origin is list or (origin is tuple and typing.get_args(candidate)[-1:] == (...,)):
            return True
    return False


def test_a_string_for_any_array_field_is_refused_naming_the_field():
    fields = [
        (cls, field.name)
        for cls in _body_classes()
        for field in attrs.fields(cls)
        if _is_array(typing.get_type_hints(cls)[field.name])
    ]
    names = {f"{cls.__qualname__}.{name}" for cls, name in fields}
    assert {"TokenBody.scopes", "MembershipBody.scopes", "SharesBody.users"} <= names
    for cls, name in fields:
        with pytest.raises(SchemaError) as refused:
            structure({name: "models:read"}, cls)
        errors = [e for e in refused.value.details["errors"] if e["path"] == f"$.{name}"]
        assert errors == [{"path": f"$.{name}", "message": "expected array, got string"}], (
            cls.__qualname__,
            name,
        )


def _post(live_server, method: str, path: str, body: dict) -> httpx.Response:
    return httpx.request(
        method,
        live_server.url + path,
        json=body,
        headers=bearer(live_server.bootstrap["token"]),
        timeout=10,
    )


def _refused_at(response: httpx.Response, path: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request", error
    assert error["details"]["errors"] == [
        {"path": path, "message": "expected array, got string"}
    ], error
    assert path in error["message"], error


def test_a_string_for_scopes_or_a_users_projects_is_a_400_naming_it(live_server):
    """Before, ``"models:read"`` became the scopes m, o, d, ... (and a refusal that named
    a scope ``m``) or, where every character is a known scope, a credential."""
    _refused_at(
        _post(live_server, "POST", "/api/v1/tokens", {"name": "t", "scopes": "models:read"}),
        "$.scopes",
    )
    _refused_at(
        _post(
            live_server,
            "POST",
            "/api/v1/users",
            {
                "username": "lena",
                "password": "a long passphrase",
                "projects": {"default": "models:read"},
            },
        ),
        "$.projects['default']",
    )
    user = _post(
        live_server,
        "POST",
        "/api/v1/users",
        {"username": "lena", "password": "a long passphrase", "projects": {}},
    )
    assert user.status_code == 201, user.text
    _refused_at(
        _post(
            live_server,
            "PUT",
            f"/api/v1/users/{user.json()['id']}/projects/default",
            {"scopes": "models:read"},
        ),
        "$.scopes",
    )
    listed = httpx.get(
        live_server.url + "/api/v1/tokens", headers=bearer(live_server.bootstrap["token"])
    ).json()
    assert all(token["name"] != "t" for token in listed["tokens"]), listed


# -- the invoke routes, with the real engine ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_roles_model_types_embeddings_and_a_drained_service_with_the_real_engine(tmp_path):
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(controller, model_id, memory_bytes=512 << 20)
            routes = (f"/api/v1/inference/{service_id}/v1", "/v1")

            # OpenAI's developer and tool roles (a conversation with a tool call) reach
            # llama.cpp and are answered, on both endpoints.
            conversation = [
                {"role": "developer", "content": "Answer in one word."},
                {"role": "user", "content": "What is the weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
            ]
            for base in routes:
                body = {"model": "smol", "messages": conversation, "max_tokens": 4}
                served = await controller.call("POST", f"{base}/chat/completions", token, json=body)
                assert served.status_code == 200, (base, served.text)
                assert served.json()["choices"][0]["message"]["role"] == "assistant"

            # A model that is no string: the same 400 at $.model on both endpoints.
            for base in routes:
                body = {"model": 7, "messages": [{"role": "user", "content": "hi"}]}
                refused = await controller.call(
                    "POST", f"{base}/chat/completions", token, json=body
                )
                assert refused.status_code == 400, (base, refused.text)
                error = refused.json()["error"]
                assert error["code"] == "invalid_request"
                assert error["details"]["errors"][0]["path"] == "$.model"

            # Embeddings from a chat model: named as the client named it, in its words.
            for base in routes:
                body = {"model": "smol", "input": "a red apple"}
                refused = await controller.call("POST", f"{base}/embeddings", token, json=body)
                assert refused.status_code == 404, refused.text
                error = refused.json()["error"]
                assert error["code"] == "capability_not_served"
                assert "model 'smol' does not serve embeddings" in error["message"], error
                assert "tokenize" not in refused.text, error
                assert "GET /v1/models" in error["message"], error  # where to look
                assert error["details"]["needed"] == "embeddings"
                assert "embeddings" not in error["details"]["capabilities"]
                assert "chat" in error["details"]["capabilities"]

            # A drained service is named by what was sent: the alias on the project
            # endpoint, the ID on the service route (both are named).
            assert (await controller.control(service_id, "drain")).status_code == 200
            for base in routes:
                body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
                refused = await controller.call(
                    "POST", f"{base}/chat/completions", token, json=body
                )
                assert refused.status_code == 503, refused.text
                error = refused.json()["error"]
                assert error["code"] in ("service_draining", "service_stopped"), error
                assert f"service 'smol' ({service_id})" in error["message"], error
                assert error["details"] == {"service": service_id, "alias": "smol"}, error
