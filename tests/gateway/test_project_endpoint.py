"""The project endpoint through its HTTP routes: one base URL, the service named by `model`.

A real controller, embedded agent and stand-in engine processes behind hypercorn (as
tests/gateway/test_gateway.py); service views are published by hand, so each routing case
(a stopped service, one without replicas, a saturated one, a replica whose node is
gone) is exact.
"""

from __future__ import annotations

import json

import openai
import pytest
import trio

from ficc_core.routing.live import LiveReplica

from ..support.gateway_support import chat, gateway_env, sse_events
from ..support.waiting import eventually


def _client(env, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url(), api_key=token, max_retries=0, timeout=30)


async def _in_thread(function, *args, **kwargs):
    return await trio.to_thread.run_sync(lambda: function(*args, **kwargs))


def _publish_two(env, fence, **alpha):
    """Services svc-a (alpha, also `a-name`) and svc-b (beta) on one stand-in engine."""
    env.publish(
        "svc-a",
        [fence],
        alias="alpha",
        names=("a-name", "smollm2"),
        description="the fast one",
        context_length=512,
        max_output=64,
        capabilities=("chat", "streaming", "tools"),
        **alpha,
    )
    env.publish("svc-b", [fence], alias="beta", context_length=256)


@pytest.mark.deadline(70)
async def test_one_base_url_lists_and_reaches_each_service_by_its_model_names(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            _publish_two(env, fence)
            env.publish("svc-x", [fence], alias="elsewhere", project_id="another-project")
            _, token = await env.token()
            client = _client(env, token)

            models = (await _in_thread(client.models.list)).data
            assert [m.id for m in models] == ["alpha", "beta"]  # not another project's
            alpha = models[0].model_dump()
            assert alpha["owned_by"] == "default"  # the project's name
            assert alpha["description"] == "the fast one"
            assert (alpha["context_length"], alpha["max_output"]) == (512, 64)
            assert alpha["aliases"] == ["a-name", "smollm2"]
            assert alpha["capabilities"] == {
                "chat": True,
                "embeddings": False,
                "tools": True,
                "vision": False,
                "completions": False,
            }
            assert models[1].model_dump()["context_length"] == 256

            for model, served in (("alpha", "alpha"), ("a-name", "alpha"), ("beta", "beta")):
                raw = await _in_thread(
                    client.chat.completions.with_raw_response.create,
                    model=model,
                    messages=[{"role": "user", "content": "three words here"}],
                    extra_body={"standin_deltas": 3},
                )
                assert raw.headers["x-ficc-service"] == served
                answer = raw.parse()
                assert answer.choices[0].message.content == "w0 w1 w2"
                assert answer.model == served  # the engine was sent the alias
            assert [r.service_id for r in list(env.gateway.usage)[-3:]] == [
                "svc-a",
                "svc-a",
                "svc-b",
            ]

            def stream() -> str:
                text = ""
                for chunk in client.chat.completions.create(
                    model="beta",
                    stream=True,
                    messages=[{"role": "user", "content": "two words"}],
                    extra_body={"standin_deltas": 4},
                ):
                    if chunk.choices:
                        text += chunk.choices[0].delta.content or ""
                return text

            assert (await _in_thread(stream)).split() == ["w0", "w1", "w2", "w3"]
            # Usage was asked for on the client's behalf, and is accounted to beta.
            assert env.gateway.usage[-1].service_id == "svc-b"
            assert env.gateway.usage[-1].completion_tokens == 4

            # The per-service route is unchanged, and its /v1/models has the same entry.
            async with env.http(token) as http:
                listed = (await http.get("/api/v1/inference/svc-a/v1/models")).json()
                assert listed["data"] == (await http.get("/v1/models")).json()["data"][:1]
                response = await http.post(
                    "/api/v1/inference/svc-a/v1/chat/completions", json=chat(model="a-name")
                )
                assert response.status_code == 404  # the service's route takes its alias
                assert response.json()["error"]["code"] == "model_not_found"
                assert "x-ficc-service" not in response.headers


@pytest.mark.deadline(70)
async def test_the_openai_client_retrieves_each_listed_model_on_both_base_urls(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            _publish_two(env, fence)
            env.publish("svc-x", [fence], alias="elsewhere", project_id="another-project")
            env.publish("svc-s", [], alias="sleeping", admission="stopped")
            _, token = await env.token()
            client = _client(env, token)

            listed = {m.id: m.model_dump() for m in (await _in_thread(client.models.list)).data}
            # The project endpoint: the entry /v1/models lists, field for field; a name
            # the service also answers to retrieves the same entry (its id is the alias).
            for model, served in (("alpha", "alpha"), ("beta", "beta"), ("a-name", "alpha")):
                retrieved = await _in_thread(client.models.retrieve, model)
                assert retrieved.model_dump() == listed[served]
            # The service's own base URL: its entry, by its alias.
            own = _client(env, token).with_options(base_url=env.base_url("svc-a"))
            retrieved = await _in_thread(own.models.retrieve, "alpha")
            assert retrieved.model_dump() == listed["alpha"]
            assert retrieved.model_dump()["max_output"] == 64

            # Not a model this credential can see: 404 model_not_found, OpenAI's shape.
            for this, model in (
                (client, "nope"),
                (client, "elsewhere"),  # another project's
                (client, "sleeping"),  # stopped: not listed
                (own, "beta"),  # the service's route takes its alias
                (own, "a-name"),
            ):
                try:
                    await _in_thread(this.models.retrieve, model)
                except openai.NotFoundError as exc:
                    assert exc.status_code == 404
                    assert exc.body["code"] == "model_not_found", model
                    assert f"`{model}`" in exc.body["message"]
                else:
                    raise AssertionError(f"{model} was retrieved")
            async with env.http(token) as http:
                # A name holding `/` is one model's name, not another route.
                response = await http.get("/v1/models/org/alpha")
                assert response.status_code == 404
                assert response.json()["error"]["details"]["model"] == "org/alpha"
                response = await http.get("/api/v1/inference/svc-b/v1/models/beta")
                assert response.json()["id"] == "beta"
                assert (await http.post("/v1/models/alpha")).status_code == 405
            # The refusals are recorded under the route, not the name a client sent.
            assert env.gateway.usage[-1].path == "/v1/models/{model}"

            _, reader = await env.token(scopes={"inference:read"}, name="reader")
            async with env.http(reader) as http:
                response = await http.get("/v1/models/alpha")
                assert response.status_code == 403
                assert response.json()["error"]["code"] == "missing_scope"


@pytest.mark.deadline(70)
async def test_unknown_or_missing_model_and_other_projects_are_refused_in_the_envelope(
    tmp_path,
):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            _publish_two(env, fence)
            env.publish("svc-x", [fence], alias="elsewhere", project_id="another-project")
            _, token = await env.token()
            async with env.http(token) as http:
                response = await http.post("/v1/chat/completions", json=chat(model="nope"))
                assert response.status_code == 404
                error = response.json()["error"]
                assert error["code"] == "model_not_found"
                assert error["details"] == {
                    "model": "nope",
                    "available": ["a-name", "alpha", "beta", "smollm2"],
                }
                response = await http.post("/v1/chat/completions", json=chat(model="elsewhere"))
                assert response.json()["error"]["code"] == "model_not_found"
                # A name longer than any is repeated only in part, on either endpoint.
                long_name = "m" * 20_000
                for path in ("/v1/chat/completions", "/api/v1/inference/svc-a/v1/chat/completions"):
                    response = await http.post(path, json=chat(model=long_name))
                    assert response.status_code == 404 and len(response.content) < 2048, path
                    error = response.json()["error"]
                    assert error["code"] == "model_not_found"
                    assert error["details"]["model"] == "m" * 125 + "..."
                    assert f"`{'m' * 125}...`" in error["message"]
                response = await http.get("/api/v1/inference/svc-a/v1/models/" + "m" * 4000)
                assert response.json()["error"]["details"]["model"] == "m" * 125 + "..."

                body = chat()
                del body["model"]
                response = await http.post("/v1/chat/completions", json=body)
                assert response.status_code == 400
                error = response.json()["error"]
                assert error["code"] == "invalid_request"
                assert error["details"]["errors"][0]["path"] == "$.model"
                response = await http.post("/v1/chat/completions", json=chat(model=7))
                assert response.status_code == 400
                response = await http.post("/v1/chat/completions", content=b"{")
                assert response.json()["error"]["code"] == "invalid_json"
                # The body's checks are the service route's.
                response = await http.post(
                    "/v1/chat/completions", json={"model": "alpha", "messages": "hi"}
                )
                assert response.json()["error"]["details"]["errors"][0]["path"] == "$.messages"
                response = await http.post("/v1/embeddings", json={"model": "alpha", "input": "hi"})
                assert response.status_code == 404
                assert response.json()["error"]["code"] == "capability_not_served"
                # Another method is Quart's 405.
                assert (await http.get("/v1/chat/completions")).status_code == 405

            _, chat_only = await env.token(scopes={"inference:read"}, name="reader")
            async with env.http(chat_only) as http:
                response = await http.get("/v1/models")
                assert response.status_code == 403
                assert response.json()["error"]["code"] == "missing_scope"


@pytest.mark.deadline(70)
async def test_no_messages_or_an_unknown_role_is_refused_before_the_engine_on_both_endpoints(
    tmp_path,
):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            _publish_two(env, fence)
            _, token = await env.token()
            cases = (
                ([], "$.messages"),
                (["hi"], "$.messages[0]"),
                ([{"role": "narrator", "content": "hi"}], "$.messages[0].role"),
                ([{"content": "hi"}], "$.messages[0].role"),
            )
            async with env.http(token) as http:
                for url in ("/api/v1/inference/svc-a/v1/chat/completions", "/v1/chat/completions"):
                    for messages, path in cases:
                        body = {"model": "alpha", "messages": messages}
                        response = await http.post(url, json=body)
                        assert response.status_code == 400, (url, messages)
                        error = response.json()["error"]
                        assert error["code"] == "invalid_request"
                        assert error["details"]["errors"][0]["path"] == path
                        assert "x-ficc-service" not in response.headers
            client = _client(env, token)
            try:
                await _in_thread(
                    client.chat.completions.create,
                    model="alpha",
                    messages=[
                        {"role": "user", "content": "hi"},
                        {"role": "ipython", "content": "1"},
                    ],
                )
            except openai.BadRequestError as exc:
                assert exc.body["details"]["errors"][0]["path"] == "$.messages[1].role"
            else:
                raise AssertionError("an unknown role was served")
            # None of them reached an engine.
            assert await env.chats_seen(fence) == 0
            served = await _in_thread(
                client.chat.completions.create,
                model="alpha",
                messages=[
                    {"role": "developer", "content": "be brief"},
                    {"role": "user", "content": "two words"},
                ],
                extra_body={"standin_deltas": 2},
            )
            assert served.choices[0].message.content == "w0 w1"


@pytest.mark.deadline(70)
async def test_a_model_that_is_not_a_string_is_the_same_400_on_both_endpoints(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            _publish_two(env, fence)
            _, token = await env.token()
            async with env.http(token) as http:
                for model, shown in ((7, "7"), (["alpha"], "an array"), ({}, "an object"),
                                     (True, "a boolean")):  # fmt: skip
                    answers = []
                    for url in (
                        "/api/v1/inference/svc-a/v1/chat/completions",
                        "/v1/chat/completions",
                    ):
                        response = await http.post(url, json=chat(model=model))
                        error = response.json()["error"]
                        answers.append((response.status_code, error["code"], error["message"]))
                        assert error["details"]["errors"][0]["path"] == "$.model"
                    assert answers[0] == answers[1], answers
                    assert answers[0][:2] == (400, "invalid_request")
                    assert answers[0][2].endswith(f"not {shown}")
                # null is no model: the service's route serves its alias, the project
                # endpoint asks for one.
                response = await http.post(
                    "/api/v1/inference/svc-a/v1/chat/completions", json=chat(model=None)
                )
                assert response.status_code == 200
                response = await http.post("/v1/chat/completions", json=chat(model=None))
                assert response.status_code == 400
                assert response.json()["error"]["details"]["errors"][0]["path"] == "$.model"


@pytest.mark.deadline(70)
async def test_a_service_bound_credential_reaches_its_service_alone_and_no_fallback(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            _publish_two(env, fence, fallbacks=("beta",))
            _, token = await env.token("svc-a")
            async with env.http(token) as http:
                listed = (await http.get("/v1/models")).json()["data"]
                assert [m["id"] for m in listed] == ["alpha"]
                response = await http.post("/v1/chat/completions", json=chat(model="a-name"))
                assert response.status_code == 200
                assert response.headers["x-ficc-service"] == "alpha"
                response = await http.post("/v1/chat/completions", json=chat(model="beta"))
                assert response.status_code == 404
                assert response.json()["error"]["details"]["available"] == [
                    "a-name",
                    "alpha",
                    "smollm2",
                ]
                # Its service stopped: the fallback is another service, out of its reach.
                env.publish("svc-a", [], alias="alpha", admission="stopped", fallbacks=("beta",))
                assert (await http.get("/v1/models")).json()["data"] == []
                response = await http.post("/v1/chat/completions", json=chat(model="alpha"))
                assert response.status_code == 503
                error = response.json()["error"]
                assert error["code"] == "service_stopped"
                assert "attempts" not in error["details"]


@pytest.mark.deadline(70)
async def test_names_shared_by_services_prefer_a_ready_one_then_alias_order(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc-a", [], alias="alpha", names=("shared",))
            env.publish("svc-b", [fence], alias="beta", names=("shared",))
            env.publish("svc-c", [fence], alias="gamma", names=("shared", "beta"))
            _, token = await env.token()
            async with env.http(token) as http:
                response = await http.post("/v1/chat/completions", json=chat(model="shared"))
                assert response.headers["x-ficc-service"] == "beta"  # alpha has no replica
                # A service's own alias wins over another's extra name.
                response = await http.post("/v1/chat/completions", json=chat(model="beta"))
                assert response.headers["x-ficc-service"] == "beta"
                env.publish("svc-a", [fence], alias="alpha", names=("shared",))
                response = await http.post("/v1/chat/completions", json=chat(model="shared"))
                assert response.headers["x-ficc-service"] == "alpha"


@pytest.mark.deadline(70)
async def test_fallbacks_serve_a_stopped_draining_or_replica_less_service_in_order(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc-b", [fence], alias="beta")
            env.publish("svc-c", [fence], alias="gamma")
            _, token = await env.token()
            metrics = env.service.metrics
            async with env.http(token) as http:
                for admission, replicas in (
                    ("stopped", []),
                    ("draining", [fence]),
                    ("serving", []),
                ):
                    env.publish(
                        "svc-a",
                        replicas,
                        alias="alpha",
                        admission=admission,
                        fallbacks=("missing", "beta", "gamma"),
                    )
                    before = len(env.gateway.usage)
                    response = await http.post(
                        "/v1/chat/completions", json=chat(model="alpha", deltas=2)
                    )
                    assert response.status_code == 200, (admission, response.text)
                    assert response.headers["x-ficc-service"] == "beta"
                    assert response.json()["model"] == "beta"
                    # alpha's refusal is a record of its own (no replica), beta's answer one.
                    *refused, record = list(env.gateway.usage)[before:]
                    assert (record.service_id, record.outcome) == ("svc-b", "ok")
                    assert all(r.service_id == "svc-a" and not r.replica for r in refused)
                fallbacks = metrics.gateway_fallbacks.labels("svc-a", "svc-b")._value.get()
                assert fallbacks == 3
                listed = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
                assert listed == ["alpha", "beta", "gamma"]

                # beta stopped too: gamma, the next in order, serves a stream.
                env.publish("svc-b", [], alias="beta", admission="stopped")
                response = await http.post(
                    "/v1/chat/completions", json=chat(stream=True, model="alpha", deltas=2)
                )
                assert response.headers["x-ficc-service"] == "gamma"
                events = sse_events(response.content)
                assert events[-1] == "[DONE]"
                # Usage the client did not ask for is accounted, not relayed.
                assert all("usage" not in e for e in events[:-1])
                assert env.gateway.usage[-1].completion_tokens == 2

                # Every one refused: the first's refusal, naming each attempt.
                env.publish("svc-c", [], alias="gamma", admission="draining")
                response = await http.post("/v1/chat/completions", json=chat(model="alpha"))
                assert response.status_code == 503
                assert response.headers["retry-after"] == "1"
                error = response.json()["error"]
                assert error["code"] == "no_ready_replica"
                assert [(a["service"], a["code"]) for a in error["details"]["attempts"]] == [
                    ("alpha", "no_ready_replica"),
                    ("beta", "service_stopped"),
                    ("gamma", "service_draining"),
                ]
                assert error["details"]["service"] == "svc-a"
                # A fallback's own fallbacks are not followed.
                env.publish("svc-b", [], alias="beta", admission="stopped", fallbacks=("delta",))
                env.publish("svc-d", [fence], alias="delta")
                env.publish("svc-a", [], alias="alpha", fallbacks=("beta",))
                response = await http.post("/v1/chat/completions", json=chat(model="alpha"))
                assert response.status_code == 503
                assert len(response.json()["error"]["details"]["attempts"]) == 2


@pytest.mark.deadline(70)
async def test_fallbacks_serve_when_saturated_or_the_engine_fails_before_its_head(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path, queue_factor=0) as env:
            fence = await env.launch()
            env.publish("svc-b", [fence], alias="beta")
            # A replica on a node that is not connected: every open fails before a head.
            gone = LiveReplica(index=0, node_id="gone", fence=fence)
            env.publish("svc-a", [gone], alias="alpha", fallbacks=("beta",))
            _, token = await env.token()
            async with env.http(token) as http:
                response = await http.post("/v1/chat/completions", json=chat(model="alpha"))
                assert response.status_code == 200
                assert response.headers["x-ficc-service"] == "beta"

                # One slot, held by a slow stream, and no queue: alpha is saturated.
                env.publish("svc-a", [fence], alias="alpha", concurrency=1, fallbacks=("beta",))
                async with (
                    trio.open_nursery() as nursery,
                    http.stream(
                        "POST",
                        "/v1/chat/completions",
                        json=chat(stream=True, model="alpha", deltas=50, interval=0.05),
                    ) as slow,
                ):
                    assert slow.headers["x-ficc-service"] == "alpha"
                    await eventually(lambda: env.gateway.load(fence.attempt_id) == 1)
                    response = await http.post("/v1/chat/completions", json=chat(model="alpha"))
                    assert response.headers["x-ficc-service"] == "beta"
                    nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_completions_need_the_capability_and_a_prompt_on_both_endpoints(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc-a", [fence], alias="alpha")
            env.publish(
                "svc-b", [fence], alias="beta", capabilities=("chat", "streaming", "completions")
            )
            _, token = await env.token()
            async with env.http(token) as http:
                for url, model in (
                    ("/api/v1/inference/svc-a/v1/completions", "alpha"),
                    ("/v1/completions", "alpha"),
                ):
                    response = await http.post(url, json={"model": model, "prompt": "Once"})
                    assert response.status_code == 404
                    error = response.json()["error"]
                    assert error["code"] == "capability_not_served"
                    assert "does not serve completions" in error["message"]
                for url in ("/api/v1/inference/svc-b/v1/completions", "/v1/completions"):
                    for prompt in (None, 7, {"text": "x"}):
                        body = {"model": "beta", **({} if prompt is None else {"prompt": prompt})}
                        response = await http.post(url, json=body)
                        assert response.status_code == 400
                        error = response.json()["error"]
                        assert error["details"]["errors"][0]["path"] == "$.prompt"


def test_a_streamed_completion_asks_the_engine_for_usage_as_a_streamed_chat_does():
    from ficc_core.gateway.checks import RequestChecks
    from ficc_core.routing.live import LiveService

    view = LiveService(
        id="svc",
        project_id="p",
        alias="beta",
        generation=1,
        admission="serving",
        concurrency=1,
        capabilities=("chat", "streaming", "completions"),
    )
    checks = RequestChecks(None, None, max_body_bytes=1 << 20)  # type: ignore[arg-type]
    payload, streaming, *_ = checks.prepare(
        view, "/v1/completions", b'{"prompt": ["a"], "stream": true}'
    )
    assert streaming
    assert json.loads(payload) == {
        "prompt": ["a"],
        "stream": True,
        "model": "beta",
        "stream_options": {"include_usage": True},
    }
    plain = b'{"model": "beta", "prompt": "a"}'
    assert checks.prepare(view, "/v1/completions", plain)[:2] == (plain, False)


def test_a_body_is_parsed_once_and_each_fallback_prepares_it_for_its_own_alias():
    from ficc_core.gateway.checks import RequestChecks
    from ficc_core.routing.live import LiveService

    def view(alias: str) -> LiveService:
        return LiveService(
            id=f"svc-{alias}",
            project_id="p",
            alias=alias,
            generation=1,
            admission="serving",
            concurrency=1,
        )

    checks = RequestChecks(None, None, max_body_bytes=1 << 20)  # type: ignore[arg-type]
    raw = b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}'
    parsed = checks.parse(raw)
    decoded = []
    checks.document = decoded.append  # type: ignore[method-assign]  # a second parse fails
    # The service the name reaches gets the client's bytes as they are.
    first = checks.prepare(view("alpha"), "/v1/chat/completions", parsed.for_model("alpha"))
    assert first.payload is raw
    # A fallback gets the same document under its own alias, nothing parsed again, and
    # the document the candidates share is left as the client sent it.
    fallback = checks.prepare(view("beta"), "/v1/chat/completions", parsed.for_model("beta"))
    assert json.loads(fallback.payload) == {**json.loads(raw), "model": "beta"}
    assert parsed.document["model"] == "alpha" and not decoded
