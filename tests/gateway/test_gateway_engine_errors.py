"""An engine's own error answer reaches the client as an OpenAI error object with a string
code, inside the one envelope: llama.cpp's, vLLM's and Ollama's shapes, and bodies that
are not JSON at all."""

from __future__ import annotations

import json

import openai
import pytest
import trio

from ficc_core.gateway.engine_errors import MAX_ERROR_BYTES, engine_error

from ..support.gateway_support import ALIAS, chat, gateway_env

#: A vLLM 0.x answer to a prompt longer than --max-model-len, as recorded.
VLLM_CONTEXT = (
    '{"object":"error","message":"This model\'s maximum context length is 2048 tokens. '
    "However, you requested 2100 tokens (2000 in the messages, 100 in the completion). "
    'Please reduce the length of the messages or completion.","type":"BadRequestError",'
    '"param":null,"code":400}'
)
#: llama.cpp's (b5000 and later) answer to the same.
LLAMA_CONTEXT = (
    '{"error":{"code":400,"message":"the request exceeds the available context size, try '
    'increasing it","type":"exceed_context_size_error","n_prompt_tokens":1400,"n_ctx":512}}'
)


def _envelope(status: int, body: bytes | None) -> dict:
    error = engine_error(status, None if body is None else [body])
    assert error is not None
    return {"status": error.status, **error.envelope()["error"]}


def test_vllm_llama_cpp_and_ollama_errors_get_string_codes():
    assert _envelope(400, VLLM_CONTEXT.encode()) == {
        "status": 400,
        "code": "context_length_exceeded",
        "message": json.loads(VLLM_CONTEXT)["message"],
        "type": "invalid_request_error",
        "param": None,
        "details": {"engine_status": 400, "engine_code": 400, "engine_type": "BadRequestError"},
    }
    llama = _envelope(400, LLAMA_CONTEXT.encode())
    assert llama["code"] == "context_length_exceeded"
    assert llama["details"] == {
        "engine_status": 400,
        "engine_code": 400,
        "engine_type": "exceed_context_size_error",
        "prompt_tokens": 1400,
        "context_length": 512,
    }
    # Something else from llama.cpp: the generic string code, the engine's facts beside it.
    other = _envelope(500, b'{"error":{"code":500,"message":"boom","type":"server_error"}}')
    assert (other["status"], other["code"], other["type"]) == (500, "engine_error", "server_error")
    assert other["details"]["engine_code"] == 500
    # Ollama: its OpenAI layer already has a string code; its native layer a bare string.
    ollama = _envelope(
        404,
        b'{"error":{"message":"model \\"x\\" not found","type":"api_error",'
        b'"param":null,"code":"model_not_found"}}',
    )
    assert (ollama["code"], ollama["message"]) == ("model_not_found", 'model "x" not found')
    native = _envelope(400, b'{"error":"invalid options"}')
    assert (native["code"], native["message"]) == ("engine_error", "invalid options")
    # A vLLM release that nests the error.
    nested = _envelope(400, b'{"error":{"message":"bad","type":"BadRequestError","code":400}}')
    assert (nested["code"], nested["details"]["engine_type"]) == ("engine_error", "BadRequestError")
    assert engine_error(200, [b"{}"]) is None


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>502 Bad Gateway</body></html>",
        b"\xff\xfe not utf-8 \x00",
        b"",
        b"[1, 2, 3]",
        b'{"error": {"message": 42, "code": {"nested": true}, "param": 7}}',
        b'{"error": ' + b'"x' * MAX_ERROR_BYTES + b'"}',
        None,
    ],
)
def test_a_body_that_is_not_an_error_object_never_crashes_and_keeps_a_bounded_message(body):
    error = engine_error(502, None if body is None else [body])
    assert error is not None
    envelope = error.envelope()["error"]
    assert envelope["code"] == "engine_error"
    assert isinstance(envelope["message"], str) and 0 < len(envelope["message"]) <= 2000
    assert envelope["details"]["engine_status"] == 502
    json.dumps(envelope)


@pytest.mark.deadline(70)
async def test_an_engine_error_reaches_the_openai_client_with_a_string_code(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")
            await env.steer(fence, status=400, body=VLLM_CONTEXT)
            async with env.http(token) as http:
                for stream in (False, True):
                    response = await http.post(
                        "/api/v1/inference/svc/v1/chat/completions", json=chat(stream)
                    )
                    assert response.status_code == 400
                    error = response.json()["error"]
                    assert error["code"] == "context_length_exceeded", error
                    assert error["details"]["engine_code"] == 400
            client = openai.OpenAI(base_url=env.base_url("svc"), api_key=token, max_retries=0)

            def ask() -> None:
                client.chat.completions.create(
                    model=ALIAS, messages=[{"role": "user", "content": "hi"}]
                )

            with pytest.raises(openai.BadRequestError) as caught:
                await trio.to_thread.run_sync(ask)
            assert caught.value.code == "context_length_exceeded"
            assert caught.value.type == "invalid_request_error"
            assert "maximum context length is 2048" in caught.value.message
