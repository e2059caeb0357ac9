"""The inference gateway through its HTTP routes: real controller, agent, engines, hypercorn.

Every engine is a real stand-in engine process launched by the embedded agent's
process provider; every request goes through hypercorn, the invoke routes, the
gateway and the agent's endpoint action. Service views are published by hand.
"""

from __future__ import annotations

import logging
import random
from functools import partial

import openai
import pytest
import trio

from ficc_core.base.errors import FiccError
from ficc_core.gateway import Gateway
from ficc_core.routing.live import LiveReplica, LiveService
from ficc_core.testing.executor_kit import new_fence

from ..support.gateway_support import ALIAS, chat, gateway_env, routing_request
from ..support.waiting import eventually


def _client(env, service_id: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=env.base_url(service_id), api_key=token, max_retries=0, timeout=30
    )


async def _in_thread(function, *args, **kwargs):
    return await trio.to_thread.run_sync(lambda: function(*args, **kwargs))


@pytest.mark.deadline(70)
async def test_openai_client_lists_models_and_chats_json_and_streamed(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            credential_id, token = await env.token("svc")
            client = _client(env, "svc", token)

            models = await _in_thread(client.models.list)
            assert [model.id for model in models.data] == [ALIAS]

            answer = await _in_thread(
                client.chat.completions.create,
                model=ALIAS,
                messages=[{"role": "user", "content": "three words here"}],
                extra_body={"standin_deltas": 5},
            )
            assert answer.choices[0].message.content == "w0 w1 w2 w3 w4"
            assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (3, 5)

            def stream() -> tuple[str, list]:
                chunks = list(
                    client.chat.completions.create(
                        messages=[{"role": "user", "content": "two words"}],
                        model=ALIAS,
                        stream=True,
                        extra_body={"standin_deltas": 6},
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                return text, [c.usage for c in chunks if c.usage]

            text, usages = await _in_thread(stream)
            assert text == "w0 w1 w2 w3 w4 w5 "
            # The gateway asked the engine for usage though the client did not: it is
            # accounted (below) but not relayed, as OpenAI sends it only when asked.
            assert usages == []
            seen = (await env.engine_stats(fence))["last_chat_request"]
            assert seen["model"] == ALIAS
            assert seen["stream_options"] == {"include_usage": True}

            def asked(include: bool) -> list:
                chunks = list(
                    client.chat.completions.create(
                        messages=[{"role": "user", "content": "w"}],
                        model=ALIAS,
                        stream=True,
                        stream_options={"include_usage": include},
                        extra_body={"standin_deltas": 3},
                    )
                )
                assert all(c.choices for c in chunks if not c.usage)
                return [
                    (c.usage.prompt_tokens, c.usage.completion_tokens) for c in chunks if c.usage
                ]

            assert await _in_thread(partial(asked, True)) == [(1, 3)]
            assert await _in_thread(partial(asked, False)) == []

            # A request without a model is served with the alias.
            async with env.http(token) as http:
                body = chat(deltas=2)
                del body["model"]
                response = await http.post("/api/v1/inference/svc/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == ALIAS
            # A whole JSON answer goes out as one body with its length, not chunked.
            assert response.headers["content-length"] == str(len(response.content))
            assert "transfer-encoding" not in response.headers

            usage = [u for u in env.gateway.usage if u.path == "/v1/chat/completions"]
            assert [(u.prompt_tokens, u.completion_tokens) for u in usage] == [
                (3, 5),
                (2, 6),
                (1, 3),
                (1, 3),
                (4, 2),
            ]
            assert {u.credential_id for u in usage} == {credential_id}
            assert all(u.outcome == "ok" and u.ttfb is not None for u in usage)
            metrics = env.service.metrics.render()[0].decode()
            tokens = (
                f'ficc_gateway_tokens_total{{kind="completion",replica="{fence.attempt_id}",'
                'service="svc"} 19.0'
            )
            assert tokens in metrics
            assert "ficc_gateway_time_to_first_byte_seconds_bucket" in metrics


@pytest.mark.deadline(70)
async def test_embeddings_are_refused_without_the_capability_and_served_with_it(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("chat-only", [fence])
            env.publish("embedder", [fence], capabilities=("embeddings",))
            _, token = await env.token()
            refused = _client(env, "chat-only", token)
            with pytest.raises(openai.NotFoundError) as caught:
                await _in_thread(refused.embeddings.create, model=ALIAS, input="a red apple")
            assert caught.value.status_code == 404
            assert "does not serve embeddings" in caught.value.message
            assert caught.value.body["code"] == "capability_not_served"

            served = _client(env, "embedder", token)
            answer = await _in_thread(
                served.embeddings.create, model=ALIAS, input=["a red apple", "a green pear"]
            )
            assert [len(item.embedding) for item in answer.data] == [8, 8]
            assert answer.data[0].embedding != answer.data[1].embedding
            assert answer.usage.prompt_tokens == 6


@pytest.mark.deadline(70)
async def test_refusals_use_the_error_envelope(tmp_path, caplog):
    with trio.fail_after(60):
        async with gateway_env(tmp_path, max_attempts=2) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            env.publish("other", [fence])
            env.publish("elsewhere", [fence], project_id="another-project")
            env.publish("draining", [fence], admission="draining")
            env.publish("stopped", [fence], admission="stopped")
            _, token = await env.token()
            _, bound = await env.token("other")
            _, reader = await env.token(scopes={"inference:read"})
            chat_path = "/api/v1/inference/{}/v1/chat/completions"

            async def post(service_id, body, *, with_token=token, **kwargs):
                async with env.http(with_token) as http:
                    response = await http.post(chat_path.format(service_id), **kwargs, json=body)
                return response, response.json()["error"]

            response, error = await post("svc", chat(model="gpt-4"))
            assert (response.status_code, error["code"]) == (404, "model_not_found")
            assert "`gpt-4`" in error["message"] and ALIAS in error["message"]
            response, error = await post("svc", {"model": ALIAS})
            assert (response.status_code, error["code"]) == (400, "invalid_request")
            assert "messages" in error["message"]
            response, error = await post("svc", chat(stream="yes"))
            assert (response.status_code, error["code"]) == (400, "invalid_request")
            response, error = await post("svc", ["not", "an", "object"])
            assert (response.status_code, error["code"]) == (400, "invalid_request")
            async with env.http(token) as http:
                response = await http.post(chat_path.format("svc"), content=b"{nonsense")
                assert response.status_code == 400
                assert response.json()["error"]["code"] == "invalid_json"
                big = b'{"messages": [], "pad": "' + b"x" * (1 << 20) + b'"}'
                response = await http.post(chat_path.format("svc"), content=big)
                assert response.status_code == 413
                assert response.json()["error"]["code"] == "payload_too_large"
            response, error = await post("nowhere", chat())
            assert (response.status_code, error["code"]) == (404, "service_not_found")
            response, error = await post("elsewhere", chat())
            assert (response.status_code, error["code"]) == (404, "service_not_found")
            response, error = await post("svc", chat(), with_token=bound)
            assert (response.status_code, error["code"]) == (403, "credential_not_for_service")
            response, error = await post("svc", chat(), with_token=reader)
            assert (response.status_code, error["code"]) == (403, "missing_scope")
            response, error = await post("draining", chat())
            assert (response.status_code, error["code"]) == (503, "service_draining")
            assert response.headers["Retry-After"] == "1"
            caplog.set_level(logging.INFO, logger="ficc.api")
            response, error = await post("stopped", chat())
            assert (response.status_code, error["code"]) == (503, "service_stopped")
            # A service's state is no error of the controller's: logged at INFO.
            said = [r for r in caplog.records if "service_stopped" in r.getMessage()]
            assert said and all(r.levelno == logging.INFO for r in said)
            # The bound token works for its own service.
            async with env.http(bound) as http:
                response = await http.post(chat_path.format("other"), json=chat())
            assert response.status_code == 200, response.text
            # The OpenAI client reads the envelope's message.
            client = _client(env, "svc", token)
            with pytest.raises(openai.NotFoundError) as caught:
                await _in_thread(
                    client.chat.completions.create,
                    model="gpt-4",
                    messages=[{"role": "user", "content": "hi"}],
                )
            assert "does not exist" in caught.value.message
            assert caught.value.body["code"] == "model_not_found"
            metrics = env.service.metrics.render()[0].decode()
            assert (
                'ficc_gateway_errors_total{code="model_not_found",replica="",service="svc"}'
                in metrics
            )


@pytest.mark.deadline(70)
async def test_a_request_whose_replica_fails_before_answering_moves_to_another(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            good = await env.launch()
            dead = await env.launch()
            await env.kill_engine(dead)
            replicas = [
                # A node that is not connected: node_unavailable at once.
                LiveReplica(index=0, node_id="ghost", fence=new_fence()),
                # An attempt the agent does not run: unknown_attempt at open.
                env.replica(new_fence(), 1),
                # An engine that died (its attempt is still listed as ready).
                env.replica(dead, 2),
                env.replica(good, 3),
            ]
            env.publish("svc", replicas)
            _, token = await env.token("svc")
            env.gateway.max_attempts = 4
            async with env.http(token) as http:
                for _ in range(8):
                    response = await http.post(
                        "/api/v1/inference/svc/v1/chat/completions", json=chat(deltas=2)
                    )
                    assert response.status_code == 200, response.text
            assert {u.replica for u in env.gateway.usage} == {good.attempt_id}
            metrics = env.service.metrics.render()[0].decode()
            retried = [
                line
                for line in metrics.splitlines()
                if line.startswith("ficc_gateway_retries_total")
            ]
            assert sum(float(line.rsplit(" ", 1)[1]) for line in retried) >= 3, retried
            # With the only replica dead: a 503 in the envelope, never a hang.
            env.publish("dead", [dead])
            async with env.http(token) as http:
                _, any_token = await env.token()
            async with env.http(any_token) as http:
                response = await http.post(
                    "/api/v1/inference/dead/v1/chat/completions", json=chat()
                )
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "no_ready_replica"
            assert response.headers["Retry-After"] == "1"


@pytest.mark.deadline(70)
async def test_requests_spread_over_replicas_and_avoid_one_at_its_cap(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            first, second = await env.launch(), await env.launch()
            env.publish("svc", [first, second], concurrency=3)
            _, token = await env.token("svc")
            async with env.http(token) as http:
                for _ in range(20):
                    response = await http.post(
                        "/api/v1/inference/svc/v1/chat/completions", json=chat(deltas=1)
                    )
                    assert response.status_code == 200
            used = [u.replica for u in env.gateway.usage]
            assert used.count(first.attempt_id) >= 3 and used.count(second.attempt_id) >= 3

            # Hold slow streams open: least in-flight puts two on each replica.
            async with env.http(token) as http, trio.open_nursery() as nursery:
                release = trio.Event()

                async def hold(task_status=trio.TASK_STATUS_IGNORED):
                    async with http.stream(
                        "POST",
                        "/api/v1/inference/svc/v1/chat/completions",
                        json=chat(True, deltas=400, interval=0.01),
                    ) as response:
                        assert response.status_code == 200
                        task_status.started()
                        await release.wait()

                for _ in range(4):
                    await nursery.start(hold)
                loads = (env.gateway.load(first.attempt_id), env.gateway.load(second.attempt_id))
                assert loads == (2, 2)
                # Fill the first to its cap by hand: new requests all go to the second.
                env.gateway.admission._load[first.attempt_id] += 1
                for _ in range(5):
                    response = await http.post(
                        "/api/v1/inference/svc/v1/chat/completions", json=chat(deltas=1)
                    )
                    assert response.status_code == 200
                assert {u.replica for u in list(env.gateway.usage)[-5:]} == {second.attempt_id}
                env.gateway.admission._load[first.attempt_id] -= 1
                release.set()
            # The clients went away: the gateway notices and frees the slots.
            await eventually(
                lambda: (
                    env.gateway.load(first.attempt_id) == env.gateway.load(second.attempt_id) == 0
                )
            )


@pytest.mark.deadline(70)
async def test_saturation_answers_429_or_503_with_retry_after(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path, queue_factor=1, max_queue_wait=0.5) as env:
            fence = await env.launch()
            env.publish("svc", [fence], concurrency=1, request_deadline=2.0)
            env.publish("empty", [])
            _, token = await env.token()
            path = "/api/v1/inference/svc/v1/chat/completions"
            first, queued = [], []
            async with env.http(token) as http, trio.open_nursery() as nursery:

                async def post(into, **options):
                    into.append(await http.post(path, json=chat(**options)))

                # One in flight (3 s of work, past its 2 s deadline), one queued: the
                # queue (1 x capacity) is full.
                nursery.start_soon(partial(post, first, deltas=30, interval=0.1))
                await eventually(lambda: env.gateway.load(fence.attempt_id) == 1)
                nursery.start_soon(post, queued)
                await eventually(lambda: env.gateway.queued("svc") == 1)
                response = await http.post(path, json=chat())
                assert response.status_code == 429
                assert response.json()["error"]["code"] == "service_saturated"
                assert response.headers["Retry-After"] == "1"
            # The queued one waited longer than the queue allows: 503.
            assert queued[0].status_code == 503, queued[0].text
            assert queued[0].json()["error"]["code"] == "no_ready_replica"
            assert queued[0].headers["Retry-After"] == "1"
            # The first ran past the request deadline before its answer: 504 envelope.
            assert first[0].status_code == 504, first[0].text
            assert first[0].json()["error"]["code"] == "deadline_exceeded"
            async with env.http(token) as http:
                response = await http.post(
                    "/api/v1/inference/empty/v1/chat/completions", json=chat()
                )
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "no_ready_replica"
            assert response.headers["Retry-After"] == "1"
            # The engine request cut at the deadline was cancelled, not left running.
            await eventually(lambda: env.gateway.load(fence.attempt_id) == 0)


@pytest.mark.deadline(70)
async def test_a_queued_request_waits_for_a_slot_then_is_served(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence], concurrency=1)
            _, token = await env.token()
            path = "/api/v1/inference/svc/v1/chat/completions"
            results = []
            async with env.http(token) as http, trio.open_nursery() as nursery:

                async def one():
                    response = await http.post(path, json=chat(deltas=5, interval=0.02))
                    results.append(response.status_code)

                # One in flight and four queued (4 x capacity): all are served in turn.
                for _ in range(5):
                    nursery.start_soon(one)
            assert results == [200] * 5
            waits = sorted(u.queue_wait for u in env.gateway.usage)
            assert waits[-1] > 0.2  # the last one waited for four before it
            assert env.gateway.queued("svc") == 0 and env.gateway.load(fence.attempt_id) == 0


@pytest.mark.deadline(70)
async def test_the_internal_seam_relays_and_cancels_without_http(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")
            actor = await env.service.auth.authenticate_bearer(token)
            # The contract names the seam service.inference.gateway: the one gateway.
            gateway = env.service.inference.gateway
            assert gateway is env.service.gateway
            status, chunks = await gateway.invoke(
                "svc", "/v1/chat/completions", chat(True, deltas=3), actor
            )
            try:
                body = b"".join([chunk async for chunk in chunks])
            finally:
                await chunks.aclose()
            assert (status, chunks.content_type.split(";")[0]) == (200, "text/event-stream")
            assert b"data: [DONE]" in body
            # Closing early cancels the engine request.
            status, chunks = await gateway.invoke(
                "svc", "/v1/chat/completions", chat(True, deltas=10_000, interval=0.005), actor
            )
            async for _ in chunks:
                break
            await chunks.aclose()
            assert gateway.load(fence.attempt_id) == 0
            # The engine notices at its next write.
            stats = await env.engine_stats(fence)
            for _ in range(100):
                if stats["chat_disconnects"] == 1:
                    break
                await trio.sleep(0.02)
                stats = await env.engine_stats(fence)
            assert stats["chat_disconnects"] == 1
            assert [u.outcome for u in gateway.usage] == ["ok", "cancelled"]
            # A refusal before any response is a FiccError with the envelope's code.
            with pytest.raises(FiccError) as caught:
                await gateway.invoke("svc", "/v1/chat/completions", b"{}", actor)
            assert caught.value.code == "invalid_request"
            with pytest.raises(FiccError) as caught:
                async with gateway.open_response("svc", "/v1/chat/completions", b"{}", actor):
                    raise AssertionError("no response for a refused request")
            assert caught.value.code == "invalid_request"


@pytest.mark.deadline(70)
async def test_leaving_an_open_response_frees_its_slot_and_cancels_the_engine(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")
            actor = await env.service.auth.authenticate_bearer(token)
            gateway = env.service.gateway
            long = chat(True, deltas=10_000, interval=0.005)
            # Read to its end: the response ends by itself.
            async with gateway.open_response(
                "svc", "/v1/chat/completions", chat(True, deltas=3), actor
            ) as response:
                assert response.status == 200 and response.streaming
                body = b"".join([chunk async for chunk in response])
            assert b"data: [DONE]" in body
            # Left before its first chunk was read (nothing else closes it).
            async with gateway.open_response("svc", "/v1/chat/completions", long, actor):
                assert gateway.load(fence.attempt_id) == 1
                assert env.service.live.inflight("svc") == 1
            assert gateway.load(fence.attempt_id) == 0
            assert env.service.live.inflight("svc") == 0
            # Left by an exception in the middle of the stream.
            with pytest.raises(KeyError):
                async with gateway.open_response(
                    "svc", "/v1/chat/completions", long, actor
                ) as response:
                    async for _ in response:
                        raise KeyError("the transport failed")
            assert gateway.load(fence.attempt_id) == 0
            assert env.service.live.inflight("svc") == 0
            assert [u.outcome for u in gateway.usage] == ["ok", "cancelled", "cancelled"]
            stats = await env.engine_stats(fence)
            with trio.fail_after(5):
                while stats["chat_streams_open"]:
                    await trio.sleep(0.02)
                    stats = await env.engine_stats(fence)


class _Fixed(random.Random):
    """A random source that always draws ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


async def test_the_injected_random_source_breaks_ties_between_equally_loaded_replicas(service):
    first, second = new_fence(1), new_fence(1)
    view = LiveService(
        id="svc",
        project_id="p",
        alias=ALIAS,
        generation=1,
        admission="serving",
        concurrency=2,
        replicas=(
            LiveReplica(index=0, node_id="n", fence=first),
            LiveReplica(index=1, node_id="n", fence=second),
        ),
    )
    picks = {}
    for value in (0.0, 0.99):
        gateway = Gateway(
            live=service.live,
            contributors=service.contributors,
            auth=service.auth,
            metrics=service.metrics,
            config=service.config,
            rng=_Fixed(value),
        )
        picks[value] = gateway.admission.pick(view, set(), routing_request(view)).key
    # A draw below 1/ties takes the later replica; above it keeps the earlier one.
    assert picks == {0.0: second.attempt_id, 0.99: first.attempt_id}


@pytest.mark.deadline(70)
async def test_a_browser_session_invokes_like_a_bearer_does(tmp_path):
    # Bearer requests and cookie sessions take the one invoke handler: both answer
    # the same way.
    import httpx

    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")
            password = "a long enough password"
            await env.service.auth.create_user(
                "viewer", password, projects={"default": frozenset({"inference:invoke"})}
            )
            async with (
                httpx.AsyncClient(base_url=env.url, timeout=30) as browser,
                env.http(token) as bearer,
            ):
                login = await browser.post(
                    "/api/v1/session",
                    json={"username": "viewer", "password": password, "project": "default"},
                )
                assert login.status_code == 201, login.text
                csrf = {"X-CSRF-Token": login.json()["csrf_token"]}
                answers = {}
                for name, http, headers in (("cookie", browser, csrf), ("bearer", bearer, {})):
                    response = await http.post(
                        "/api/v1/inference/svc/v1/chat/completions",
                        headers=headers,
                        json=chat(stream=True, deltas=3),
                    )
                    assert response.status_code == 200, (name, response.text)
                    assert response.headers["content-type"].startswith("text/event-stream")
                    assert response.headers["cache-control"] == "no-cache"
                    answers[name] = [
                        line for line in response.text.splitlines() if line.startswith("data:")
                    ]
                    refused = await http.post(
                        "/api/v1/inference/svc/v1/chat/completions",
                        headers=headers,
                        json={"model": ALIAS, "messages": "not a list"},
                    )
                    assert refused.status_code == 400
                    assert refused.json()["error"]["code"] == "invalid_request"
                # The same events either way (ids and timestamps aside).
                assert len(answers["cookie"]) == len(answers["bearer"]) > 3
                # Without the CSRF header the cookie is refused, as on every route.
                response = await browser.post(
                    "/api/v1/inference/svc/v1/chat/completions", json=chat(deltas=1)
                )
                assert response.status_code == 403
                assert response.json()["error"]["code"] == "csrf_failed"
