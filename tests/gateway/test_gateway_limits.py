"""Context and output refusal: a request that certainly cannot fit is refused before a
replica is taken, counted by cheap bounds first and by the engine's tokenizer only in
between; with real llama.cpp (SmolLM2), the engine never sees a refused prompt."""

from __future__ import annotations

import json
import timeit

import attrs
import pytest
import trio

from ficc_core.base.errors import InvalidRequest
from ficc_core.base.strictjson import dumps
from ficc_core.controller.metrics import Metrics
from ficc_core.gateway.checks import RequestChecks
from ficc_core.gateway.errors import ContextLengthExceeded, MaxOutputExceeded
from ficc_core.gateway.limits import MAX_TOKEN_BYTES, TEMPLATE_TOKENS, ContextLimits
from ficc_core.routing.live import LiveService
from ficc_core.testing.executor_kit import exchange

from ..support.gateway_support import ALIAS, gateway_env
from ..support.inference_support import open_inference_controller, ready_service, register_smollm2

CHAT = "/v1/chat/completions"


def _view(context_length: int = 512, max_output: int | None = None) -> LiveService:
    return LiveService(
        id="svc",
        project_id="p",
        alias="smol",
        generation=1,
        admission="serving",
        concurrency=1,
        capabilities=("chat", "streaming", "tokenize.llama_cpp"),
        context_length=context_length,
        max_output=max_output,
    )


def _chat(text: str, **extra) -> dict:
    return {"model": "smol", "messages": [{"role": "user", "content": text}]} | extra


def _admit(view: LiveService, document: dict):
    limits = ContextLimits(None, Metrics(), tokenize_timeout=1.0)  # type: ignore[arg-type]
    return limits.admit(view, CHAT, document, len(dumps(document)))


def test_the_byte_bounds_settle_short_and_huge_prompts_without_the_engine():
    view = _view(4096)
    # Fits even counting a token per byte and a whole template: nothing more to do.
    assert _admit(view, _chat("hello " * 100, max_tokens=64)) is None
    # At least one token per 256 bytes: 2 MB cannot fit 4096 tokens, whatever the vocabulary.
    text = "x" * (MAX_TOKEN_BYTES * 4096)
    with pytest.raises(ContextLengthExceeded) as refused:
        _admit(view, _chat(text))
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "messages")
    assert error.details == {
        "prompt_tokens": 4096,
        "completion_tokens": 1,
        "context_length": 4096,
        "counted": "bytes_lower_bound",
    }
    envelope = error.envelope()["error"]
    assert (envelope["type"], envelope["param"]) == ("invalid_request_error", "messages")
    # No bound named: the message does not say the client asked for one token.
    assert "leaving no room for a completion" in error.message, error.message
    with pytest.raises(ContextLengthExceeded) as asked:
        _admit(view, _chat(text, max_tokens=8))
    assert "the completion asks for 8" in asked.value.message
    assert asked.value.details["completion_tokens"] == 8
    # In between the bounds: the engine's tokenizer decides.
    pending = _admit(view, _chat("word " * 1000, max_tokens=100))
    assert pending is not None and pending.completion == 100
    # The completion asked for counts against the context too.
    assert _admit(view, _chat("hi", max_tokens=4096 - TEMPLATE_TOKENS)) is not None
    # A service with no known context (0) or an image part: nothing is refused here.
    assert _admit(_view(0), _chat("x" * 10**6)) is None
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 9000}}
    assert _admit(view, {"messages": [{"role": "user", "content": [image]}]}) is None


def test_asking_more_than_max_output_is_refused_naming_the_parameter():
    view = _view(2048, max_output=256)
    assert _admit(view, _chat("hi", max_tokens=256)) is None
    for name in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(MaxOutputExceeded) as refused:
            _admit(view, _chat("hi", **{name: 257}))
        error = refused.value
        assert (error.status, error.code, error.param) == (400, "max_output_exceeded", name)
        assert error.details == {"requested": 257, "max_output": 256}


def _prepare(view: LiveService, document: dict, path: str = CHAT):
    checks = RequestChecks(None, None, max_body_bytes=1 << 20)  # type: ignore[arg-type]
    limits = ContextLimits(None, Metrics(), tokenize_timeout=1.0)  # type: ignore[arg-type]
    return checks.prepare(view, path, dumps(document), limits=limits)


def test_max_output_bounds_a_completion_whose_client_named_no_bound():
    view = _view(2048, max_output=256)
    view = attrs.evolve(view, capabilities=(*view.capabilities, "completions"))
    for path, document in ((CHAT, _chat("hi")), ("/v1/completions", {"prompt": "hi"})):
        payload, _, count, _, completion, _ = _prepare(view, document, path)
        assert json.loads(payload)["max_tokens"] == 256
        assert count is None and completion == 256  # the quota reserves the cap
        # null is no bound either.
        payload, *_ = _prepare(view, {**document, "max_tokens": None}, path)
        assert json.loads(payload)["max_tokens"] == 256
    # The client's own bound is sent as it is, under either name.
    for name in ("max_tokens", "max_completion_tokens"):
        body = dumps(_chat("hi", **{name: 100}))
        checks = RequestChecks(None, None, max_body_bytes=1 << 20)  # type: ignore[arg-type]
        assert checks.prepare(view, CHAT, body)[0] == body
    # No max_output: nothing is added; an embedding gets no bound.
    body = dumps(_chat("hi"))
    checks = RequestChecks(None, None, max_body_bytes=1 << 20)  # type: ignore[arg-type]
    assert checks.prepare(_view(2048), CHAT, body)[0] == body
    embedding = attrs.evolve(view, capabilities=("embeddings",))
    payload, *_ = checks.prepare(embedding, "/v1/embeddings", dumps({"input": "hi"}))
    assert "max_tokens" not in json.loads(payload)


def test_the_cap_is_no_ask_a_long_prompt_still_fits_the_context_with_it():
    # 1,700 bytes of prompt in a 2,048-token context with max_output 512: the cap is
    # sent, but only the client's own ask (none: 1 token) counts against the context.
    view = _view(2048, max_output=512)
    payload, _, count, *_ = _prepare(view, _chat("x" * 1700))
    assert json.loads(payload)["max_tokens"] == 512
    assert count is None


@pytest.mark.parametrize("value", [-1, 0, 1.5, "four", True, [], {}])
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
def test_a_bound_that_is_not_a_positive_integer_is_refused(name, value):
    # llama.cpp reads -1 as no bound at all: it would generate up to its context.
    for view in (_view(2048), _view(2048, max_output=256)):
        with pytest.raises(InvalidRequest) as refused:
            _prepare(view, _chat("hi", **{name: value}))
        error = refused.value
        assert (error.status, error.code) == (400, "invalid_request")
        assert error.details["errors"][0]["path"] == f"$.{name}"
        assert name in error.message
    shown = {-1: "-1", 0: "0", 1.5: "1.5", "four": "a string", True: "a boolean"}
    if not isinstance(value, list | dict):
        assert error.message.endswith(f"not {shown[value]}")


def test_the_common_case_costs_microseconds():
    view, document = _view(4096, max_output=1024), _chat("hello there " * 20, max_tokens=256)
    size = len(dumps(document))
    limits = ContextLimits(None, Metrics(), tokenize_timeout=1.0)  # type: ignore[arg-type]
    seconds = min(timeit.repeat(lambda: limits.admit(view, CHAT, document, size), number=10_000))
    assert seconds / 10_000 < 20e-6, seconds  # measured about 1 µs per request


@pytest.mark.deadline(70)
async def test_the_vllm_tokenizer_dialect_decides_in_between_and_a_silent_one_lets_it_on(
    tmp_path, idle_clock
):
    # The stand-in serves vLLM's /tokenize (a token per word, like its usage counts); the
    # mock clock jumps ahead while the process is idle, so its stall costs no real time.
    with trio.fail_after(60):
        async with gateway_env(tmp_path, clock=idle_clock) as env:
            fence = await env.launch()
            view = env.publish("svc", [fence], capabilities=("chat", "tokenize.vllm"))
            env.service.live.publish(attrs.evolve(view, context_length=300))
            _, token = await env.token("svc")
            path = "/api/v1/inference/svc/v1/chat/completions"
            async with env.http(token, timeout=300) as http:
                response = await http.post(path, json=_chat("word " * 400, model=ALIAS))
                assert response.status_code == 400, response.text
                error = response.json()["error"]
                assert error["details"] == {
                    "prompt_tokens": 400,
                    "completion_tokens": 1,
                    "context_length": 300,
                    "counted": "tokenizer",
                }
                assert await env.chats_seen(fence) == 0
                response = await http.post(path, json=_chat("word " * 100, model=ALIAS))
                assert response.status_code == 200, response.text
                assert await env.chats_seen(fence) == 1
                # A tokenizer that does not answer within tokenize_timeout: the request goes
                # on, and the engine judges it (the stand-in serves it).
                await env.steer(fence, tokenize_delay=3600)
                response = await http.post(path, json=_chat("word " * 400, model=ALIAS))
                assert response.status_code == 200, response.text
                assert await env.chats_seen(fence) == 2
            metrics = env.service.metrics.render()[0].decode()
            for outcome, count in (("counted", 2), ("fallback", 1)):
                line = f'ficc_gateway_tokenize_calls_total{{outcome="{outcome}",service="svc"}}'
                assert f"{line} {count}.0" in metrics


async def _engine_prompt_tokens(controller, service_id: str) -> float:
    """llama.cpp's ``prompt_tokens_total``: what its slots have processed."""
    total = 0.0
    for replica in controller.service.live.get(service_id).replicas:
        endpoint = controller.service.contributors.endpoint(replica.node_id)
        status, _, chunks = await exchange(endpoint, replica.fence, "GET", "/metrics")
        assert status == 200
        for line in b"".join(chunks).decode().splitlines():
            if line.startswith("llamacpp:prompt_tokens_total "):
                total += float(line.split()[1])
    return total


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_llama_cpp_an_over_long_prompt_is_refused_before_a_slot_and_a_fitting_one_passes(
    tmp_path,
):
    with trio.fail_after(240):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(
                controller, model_id, context=512, max_output=128
            )
            gateway = controller.service.gateway
            path = f"/api/v1/inference/{service_id}/v1/chat/completions"
            headers = {"Authorization": f"Bearer {token}"}

            async def post(text: str, **extra):
                body = _chat(text, **extra)
                return await controller.http.post(path, json=body, headers=headers)

            response = await post("Hi", max_tokens=4)
            assert response.status_code == 200, response.text
            relayed, seen = len(gateway.usage), await _engine_prompt_tokens(controller, service_id)
            # 3,500 bytes: neither bound settles it; llama.cpp's tokenizer counts 731 tokens.
            response = await post("word " * 700, max_tokens=4)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "context_length_exceeded"
            assert error["details"] == {
                "prompt_tokens": 731,
                "completion_tokens": 4,
                "context_length": 512,
                "counted": "tokenizer",
            }
            # No replica was taken and the engine processed no prompt for it.
            # Its usage record is the refusal's, on no replica.
            (refused,) = list(gateway.usage)[relayed:]
            assert (refused.replica, refused.outcome) == ("", "context_length_exceeded")
            assert await _engine_prompt_tokens(controller, service_id) == seen
            # A prompt over the byte bound that the tokenizer finds short enough is served.
            response = await post("word " * 150, max_tokens=4)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["prompt_tokens"] < 512
            # No bound named: the engine generates at most max_output (unbounded, llama.cpp
            # runs to the end of the context: 2,005 tokens of this story in 2,048).
            response = await post(
                "Write a very long story about a dragon, in many chapters.", temperature=0
            )
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["usage"]["completion_tokens"] == 128
            assert answer["choices"][0]["finish_reason"] == "length"
            # More than max_output: refused at once, naming the parameter.
            response = await post("Hi", max_tokens=129)
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "max_output_exceeded"
            assert response.json()["error"]["param"] == "max_tokens"
            metrics = controller.service.metrics.render()[0].decode()
            assert (
                f'ficc_gateway_tokenize_calls_total{{outcome="counted",service="{service_id}"}} 2.0'
                in metrics
            )
            # With the refusal off, llama.cpp's own error reaches the client in the same
            # OpenAI shape, with a string code and the engine's facts.
            gateway.limits = None
            response = await post("word " * 700, max_tokens=4)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "context_length_exceeded"
            assert error["type"] == "invalid_request_error"
            assert error["details"]["engine_type"] == "exceed_context_size_error"
            assert error["details"]["engine_code"] == 400
            assert error["details"]["prompt_tokens"] == 731
            # A request llama.cpp refuses (a response format it does not know): its 400
            # becomes a string-coded engine_error.
            response = await post("Hi", max_tokens=4, response_format={"type": "bogus"})
            assert response.status_code in (400, 500), response.text
            error = response.json()["error"]
            assert isinstance(error["code"], str) and error["details"]["engine_status"] >= 400
            # Several choices are the gateway's refusal, before any slot.
            response = await post("Hi", max_tokens=4, n=3)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["details"]["errors"][0]["path"] == "$.n"


def test_the_usage_event_nobody_asked_for_is_cut_whole_or_not_at_all():
    from ficc_core.gateway.relay import without_usage

    delta = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    spaced = b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\n'
    done = b"data: [DONE]\n\n"
    assert without_usage(delta) == delta
    assert without_usage(usage) == b""
    assert without_usage(delta + usage + done) == delta + done
    assert without_usage(spaced + done) == done
    # Split across two reads: neither half is cut (never an event in pieces).
    assert without_usage(delta + usage[:30]) == delta + usage[:30]
    assert without_usage(usage[30:] + done) == usage[30:] + done


def test_a_request_for_several_answers_is_refused_before_a_slot():
    # Each answer takes an engine slot of its own, while concurrency, bands, max_output
    # and quotas count the request as one (and the engine reports one answer's usage).
    view = attrs.evolve(_view(4096), capabilities=("chat", "streaming", "completions"))
    for n in (2, 0, 1.0, "1", True):
        with pytest.raises(InvalidRequest) as refused:
            _prepare(view, {**_chat("hi"), "n": n})
        assert refused.value.details["errors"][0]["path"] == "$.n", n
    assert _prepare(view, {**_chat("hi"), "n": 1}) is not None
    assert _prepare(view, {**_chat("hi"), "n": None}) is not None
    completions = "/v1/completions"
    for prompt in (["a", "b"], [[1, 2], [3]]):
        with pytest.raises(InvalidRequest) as refused:
            _prepare(view, {"prompt": prompt}, completions)
        assert refused.value.details["errors"][0]["path"] == "$.prompt"
        assert "2 prompts" in refused.value.message
    # One prompt, however it is written: a string, one string in an array, token IDs.
    for prompt in ("a", ["a"], [1, 2, 3], [[1, 2]], ["a", 1]):
        assert _prepare(view, {"prompt": prompt}, completions) is not None


def test_an_image_to_a_service_without_vision_is_refused_before_a_slot():
    # llama.cpp answers such a request 500, which counted against the replica's breaker.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = {"type": "text", "text": "what is it?"}
    body = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [text, image]}]
    }
    with pytest.raises(InvalidRequest) as refused:
        _prepare(_view(4096), body)
    assert refused.value.details["errors"][0]["path"] == "$.messages[1].content[1]"
    assert "vision" in refused.value.message
    seeing = attrs.evolve(_view(4096), capabilities=("chat", "streaming", "vision"))
    assert _prepare(seeing, body) is not None
    # Text parts alone pass.
    assert _prepare(_view(4096), {"messages": [{"role": "user", "content": [text]}]}) is not None


def test_no_messages_a_message_not_an_object_or_a_role_outside_openais_is_refused():
    # llama.cpp and vLLM take any role string and render it with the chat template.
    view = _view(4096)
    for messages, path in (
        ([], "$.messages"),
        (["hi"], "$.messages[0]"),
        ([{"role": "user", "content": "hi"}, None], "$.messages[1]"),
        ([[{"role": "user"}]], "$.messages[0]"),
        ([{"content": "hi"}], "$.messages[0].role"),
        ([{"role": None, "content": "hi"}], "$.messages[0].role"),
        (
            [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}],
            "$.messages[1].role",
        ),
        ([{"role": "", "content": "hi"}], "$.messages[0].role"),
        ([{"role": "User", "content": "hi"}], "$.messages[0].role"),
        ([{"role": ["user"], "content": "hi"}], "$.messages[0].role"),
        ([{"role": 7, "content": "hi"}], "$.messages[0].role"),
    ):
        with pytest.raises(InvalidRequest) as refused:
            _prepare(view, {"model": "smol", "messages": messages})
        error = refused.value
        assert (error.status, error.code) == (400, "invalid_request"), messages
        assert error.details["errors"][0]["path"] == path, messages
    with pytest.raises(InvalidRequest) as refused:
        _prepare(view, _chat("hi") | {"messages": [{"role": "bot", "content": "x"}]})
    assert "`messages[0].role` is 'bot'" in refused.value.message
    assert "developer" in refused.value.message  # the roles it may be
    # Every role OpenAI's API takes passes, as a conversation with tools sends them.
    conversation = [
        {"role": "developer", "content": "be brief"},
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "function", "name": "weather", "content": "sunny"},
    ]
    payload, *_ = _prepare(view, {"model": "smol", "messages": conversation})
    assert json.loads(payload)["messages"] == conversation
    # A content part whose type is no string is the engine's to judge, not a crash here.
    odd = [{"role": "user", "content": [{"type": ["image_url"], "text": "x"}]}]
    assert _prepare(view, {"model": "smol", "messages": odd}) is not None


def test_stream_null_is_not_streamed_and_a_non_boolean_is_refused():
    _, streaming, *_ = _prepare(_view(4096), {**_chat("hi"), "stream": None})
    assert streaming is False
    for value in (0, "true"):
        with pytest.raises(InvalidRequest) as refused:
            _prepare(_view(4096), {**_chat("hi"), "stream": value})
        assert refused.value.details["errors"][0]["path"] == "$.stream"
