"""The gateway's bounds on each wait for an engine (``timeout_*``), with stand-ins that stall.

The trio clock is a :class:`trio.testing.MockClock` that jumps ahead once the
process has been idle for a tenth of a real second: a stalled engine (which
never answers) times out at once in real time, while a healthy one answers
long before any bound in virtual time.
"""

from __future__ import annotations

import json

import attrs
import pytest
import trio

from ficc_core.gateway.relay import Timeouts

from ..support.gateway_support import chat, gateway_env, sse_events

PATH = "/api/v1/inference/svc/v1/chat/completions"
STALL = 3600  # real seconds: the stand-in never answers within a test


def _bounded(env, **seconds: float) -> None:
    env.gateway.relay.timeouts = attrs.evolve(Timeouts(), **seconds)


def _timeouts(env, bound: str) -> float:
    text = env.service.metrics.render()[0].decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ficc_gateway_timeouts_total{") and f'bound="{bound}"' in line
    )


@pytest.mark.deadline(130)
async def test_a_stream_whose_head_stalls_is_tried_elsewhere_then_504s_naming_the_bound(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=2) as env:
            first, second = await env.launch(), await env.launch()
            env.publish("svc", [first, second])
            _bounded(env, response_header=5.0)
            _, token = await env.token("svc")
            await env.steer(first, head_delay=STALL)
            await env.steer(second, head_delay=STALL)
            async with env.http(token, timeout=300) as http:
                response = await http.post(PATH, json=chat(True))
            assert response.status_code == 504, response.text
            error = response.json()["error"]
            assert error["code"] == "engine_timeout"
            assert error["details"] == {
                "bound": "timeout_response_header",
                "seconds": 5.0,
                "replicas_tried": 2,
            }
            assert "send its response head within 5 s" in error["message"]
            # Both replicas were tried: the stall was the engine's, so another may answer.
            assert [await env.chats_seen(first), await env.chats_seen(second)] == [1, 1]
            assert _timeouts(env, "timeout_response_header") == 2
            # With one healthy replica every stream is served, whichever is tried first.
            await env.steer(second)
            async with env.http(token, timeout=300) as http:
                for _ in range(4):
                    response = await http.post(PATH, json=chat(True, deltas=2))
                    assert response.status_code == 200, response.text
                    assert sse_events(response.content)[-1] == "[DONE]"


@pytest.mark.deadline(130)
async def test_a_non_streaming_answer_is_bounded_by_generation_not_by_the_head_bound(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=1) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")
            # The engine takes about two real seconds: the virtual clock passes the
            # 0.5 s head bound many times over, which does not apply to a JSON answer.
            _bounded(env, response_header=0.5)
            await env.steer(fence, head_delay=2)
            async with env.http(token, timeout=300) as http:
                response = await http.post(PATH, json=chat())
                assert response.status_code == 200, response.text
                assert response.json()["object"] == "chat.completion"
                # The same wait on a stream is cut by the head bound.
                response = await http.post(PATH, json=chat(True))
                assert response.status_code == 504, response.text
                assert response.json()["error"]["details"]["bound"] == "timeout_response_header"
                # A JSON answer that never comes is cut by the generation bound.
                _bounded(env, response_header=0.5, generation=30.0)
                await env.steer(fence, head_delay=STALL)
                response = await http.post(PATH, json=chat())
            assert response.status_code == 504, response.text
            error = response.json()["error"]
            assert error["code"] == "engine_timeout"
            assert error["details"]["bound"] == "timeout_generation"
            assert error["details"]["seconds"] == 30.0


@pytest.mark.deadline(130)
async def test_a_stream_stalled_before_its_first_chunk_is_retried_and_one_stalled_after_ends(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=2) as env:
            first, second = await env.launch(), await env.launch()
            env.publish("svc", [first, second])
            _bounded(env, first_token=5.0, idle=10.0)
            _, token = await env.token("svc")
            for fence in (first, second):
                await env.steer(fence, first_delay=STALL)
            async with env.http(token, timeout=300) as http:
                response = await http.post(PATH, json=chat(True))
                # Nothing reached the client: both replicas were tried, the answer is 504.
                assert response.status_code == 504, response.text
                details = response.json()["error"]["details"]
                assert details == {
                    "bound": "timeout_first_token",
                    "seconds": 5.0,
                    "replicas_tried": 2,
                }
                # A stream that stalls after its first chunk ends with an error event;
                # nothing is replayed on the other replica.
                for fence in (first, second):
                    await env.steer(fence)
                seen = await env.chats_seen(first) + await env.chats_seen(second)
                response = await http.post(PATH, json=chat(True, deltas=3, interval=STALL))
            assert response.status_code == 200
            events = sse_events(response.content)
            assert events[0]["choices"][0]["delta"]["content"] == "w0 "
            error = events[-1]["error"]
            assert error["code"] == "engine_timeout", events
            assert error["details"] == {"bound": "timeout_idle", "seconds": 10.0}
            assert await env.chats_seen(first) + await env.chats_seen(second) == seen + 1
            assert _timeouts(env, "timeout_idle") == 1


class _StalledOpens:
    """A node registry whose endpoint actions never accept an open (a stuck node link)."""

    def __init__(self, registry) -> None:
        self.registry = registry

    def endpoint(self, node_id: str):
        real = self.registry.endpoint(node_id)

        class Stalled:
            async def open(self, *args, **kwargs):
                await trio.sleep_forever()

            def __getattr__(self, name):
                return getattr(real, name)

        return Stalled()


@pytest.mark.deadline(130)
async def test_an_open_that_never_completes_is_bounded_by_dial(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=1) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _bounded(env, dial=3.0)
            env.gateway.relay.contributors = _StalledOpens(env.gateway.relay.contributors)
            _, token = await env.token("svc")
            async with env.http(token, timeout=300) as http:
                response = await http.post(PATH, json=chat())
            assert response.status_code == 504, response.text
            error = response.json()["error"]
            assert (error["code"], error["details"]["bound"]) == ("engine_timeout", "timeout_dial")
            assert await env.chats_seen(fence) == 0


@pytest.mark.deadline(130)
async def test_timeout_total_bounds_a_request_below_the_service_deadline(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=1) as env:
            fence = await env.launch()
            env.publish("svc", [fence], request_deadline=60.0)
            env.gateway.total_timeout = 8.0
            _, token = await env.token("svc")
            await env.steer(fence, head_delay=STALL)
            async with env.http(token, timeout=300) as http:
                response = await http.post(PATH, json=chat())
                assert response.status_code == 504, response.text
                error = response.json()["error"]
                assert error["code"] == "deadline_exceeded"
                assert error["details"] == {"bound": "timeout_total", "timeout_total": 8.0}
                # The service's own deadline wins when it is the smaller.
                env.publish("svc", [fence], request_deadline=4.0)
                response = await http.post(PATH, json=chat())
            error = response.json()["error"]
            assert error["details"] == {"bound": "request_deadline", "request_deadline": 4.0}
            assert json.loads(json.dumps(error))["message"].startswith(
                "the request ran past the service's deadline of 4 s"
            )
