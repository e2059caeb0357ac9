"""Breakers and retries: a failing replica leaves the pool for a cooldown; a request tries
at most ``retries`` more replicas, only while nothing has reached the client.

Real stand-in engines through the embedded agent, steered to fail (``/steer``); the
trio clock jumps ahead when the process is idle, so a cooldown passes in a
fraction of a real second (the tests sleep on that mock clock, never in real time).
"""

from __future__ import annotations

import pytest
import trio

from ficc_core.controller.metrics import Metrics
from ficc_core.gateway.breakers import CLOSED, HALF_OPEN, OPEN, Breakers
from ficc_core.routing.live import LiveReplica, LiveService, LiveTable
from ficc_core.testing.executor_kit import new_fence

from ..support.gateway_support import chat, gateway_env

PATH = "/api/v1/inference/svc/v1/chat/completions"
UNAVAILABLE = '{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'


def _metric(env, name: str, replica: str) -> float | None:
    for line in env.service.metrics.render()[0].decode().splitlines():
        if line.startswith(name + "{") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_breaker_counts_opens_half_opens_for_one_probe_and_never_excludes_all(
    autojump_clock,
):
    replicas = tuple(LiveReplica(index=i, node_id="n", fence=new_fence()) for i in range(3))
    a, b, c = (r.key for r in replicas)
    view = LiveService(
        id="svc",
        project_id="p",
        alias="m",
        generation=1,
        admission="serving",
        concurrency=1,
        replicas=replicas,
    )
    live = LiveTable()
    live.publish(view)
    breakers = Breakers(live, Metrics(), threshold=2, cooldown=10.0)
    assert breakers.excluded(view, set()) == set()
    breakers.failed("svc", a)
    assert (breakers.state(a), breakers.excluded(view, set())) == (CLOSED, set())
    breakers.succeeded(a)  # an answer in between: the count starts again
    breakers.failed("svc", a)
    assert breakers.state(a) == CLOSED
    breakers.failed("svc", a)
    assert breakers.state(a) == OPEN
    assert breakers.excluded(view, {b}) == {a, b}
    await trio.sleep(10)
    assert breakers.state(a) == HALF_OPEN and breakers.excluded(view, set()) == set()
    breakers.attempt(a)  # one probe under way: nobody else is given the replica
    assert breakers.excluded(view, set()) == {a}
    breakers.abandoned(a)  # the probe was cancelled: no verdict, the next may try
    assert breakers.excluded(view, set()) == set()
    breakers.attempt(a)
    breakers.failed("svc", a)  # the probe failed: open for another cooldown
    assert breakers.state(a) == OPEN
    # b opens later than a; with c tried, every candidate is open: a (sooner) stays.
    await trio.sleep(1)
    for _ in range(2):
        breakers.failed("svc", b)
    assert breakers.excluded(view, {c}) == {b, c}
    # Off: nothing is ever counted.
    off = Breakers(live, Metrics(), threshold=0, cooldown=10.0)
    for _ in range(5):
        off.failed("svc", a)
    assert off.state(a) == CLOSED and off.excluded(view, set()) == set()


@pytest.mark.deadline(130)
async def test_consecutive_failures_open_a_breaker_that_half_opens_after_its_cooldown(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=2) as env:
            bad, good = await env.launch(), await env.launch()
            env.publish("svc", [bad, good])
            breakers = env.gateway.breakers
            breakers.threshold, breakers.cooldown = 2, 5.0
            _, token = await env.token("svc")
            await env.steer(bad, status=503, body=UNAVAILABLE)
            async with env.http(token, timeout=300) as http:
                # Every request is served (the failing replica's ones move to the good one)
                # until the bad one failed twice in a row: its breaker opens.
                while breakers.state(bad.attempt_id) != OPEN:
                    response = await http.post(PATH, json=chat())
                    assert response.status_code == 200, response.text
                assert await env.chats_seen(bad) == 2
                assert _metric(env, "ficc_gateway_breaker_state", bad.attempt_id) == OPEN
                assert _metric(env, "ficc_gateway_breaker_opens_total", bad.attempt_id) == 1
                # Open: no request goes there, however many come.
                for _ in range(8):
                    response = await http.post(PATH, json=chat())
                    assert response.status_code == 200, response.text
                assert await env.chats_seen(bad) == 2
                # After the cooldown one request may try it; it fails again: open again.
                await trio.sleep(6)  # on the mock clock: the cooldown passes
                assert breakers.state(bad.attempt_id) == HALF_OPEN
                assert _metric(env, "ficc_gateway_breaker_state", bad.attempt_id) == HALF_OPEN
                while await env.chats_seen(bad) == 2:
                    response = await http.post(PATH, json=chat())
                    assert response.status_code == 200, response.text
                assert await env.chats_seen(bad) == 3
                assert breakers.state(bad.attempt_id) == OPEN
                assert _metric(env, "ficc_gateway_breaker_opens_total", bad.attempt_id) == 2
                # Recovered: the next probe succeeds and the breaker closes.
                await env.steer(bad)
                await trio.sleep(6)  # on the mock clock: the cooldown passes
                while breakers.state(bad.attempt_id) != CLOSED:
                    response = await http.post(PATH, json=chat())
                    assert response.status_code == 200, response.text
                assert _metric(env, "ficc_gateway_breaker_state", bad.attempt_id) == CLOSED
                # A client's 4xx is an answer, not a failure: it never opens a breaker.
                breakers.threshold = 1
                await env.steer(bad, status=400, body='{"error": {"message": "bad"}}')
                await env.steer(good, status=400, body='{"error": {"message": "bad"}}')
                for _ in range(4):
                    response = await http.post(PATH, json=chat())
                    assert response.status_code == 400, response.text
                assert breakers.state(bad.attempt_id) == breakers.state(good.attempt_id) == CLOSED


@pytest.mark.deadline(130)
async def test_when_every_breaker_is_open_the_soonest_to_close_is_still_tried(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=1) as env:
            first, second = await env.launch(), await env.launch()
            env.publish("svc", [first, second])
            breakers = env.gateway.breakers
            breakers.threshold, breakers.cooldown = 1, 10.0
            _, token = await env.token("svc")
            for fence in (first, second):
                await env.steer(fence, status=503, body=UNAVAILABLE)
            async with env.http(token, timeout=300) as http:
                while OPEN not in {breakers.state(f.attempt_id) for f in (first, second)}:
                    await http.post(PATH, json=chat())
                await trio.sleep(1)  # (mock clock) the one that opened first closes first
                while {breakers.state(f.attempt_id) for f in (first, second)} != {OPEN}:
                    await http.post(PATH, json=chat())
                seen = await env.chats_seen(first) + await env.chats_seen(second)
                # Both open: a request is not refused for that; it tries the replica whose
                # cooldown ends soonest and gets the engine's answer.
                response = await http.post(PATH, json=chat())
                assert response.status_code == 503, response.text
                assert response.json()["error"]["message"] == "Loading model"
                assert response.headers["Retry-After"] == "1"
                assert await env.chats_seen(first) + await env.chats_seen(second) == seen + 1


@pytest.mark.deadline(130)
async def test_retries_bound_how_many_more_replicas_a_request_tries(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock) as env:
            assert env.gateway.max_attempts == env.service.config.retries + 1 == 3
            fences = [await env.launch() for _ in range(4)]
            env.publish("svc", fences)
            env.gateway.breakers.threshold = 0  # breakers off: count the tries alone
            _, token = await env.token("svc")
            for fence in fences:
                await env.steer(fence, status=503, body=UNAVAILABLE)
            async with env.http(token, timeout=300) as http:
                response = await http.post(PATH, json=chat())
                # Three tried (one, then two more); the last one's 503 is the answer.
                assert response.status_code == 503
                assert sum([await env.chats_seen(f) for f in fences]) == 3
                env.gateway.max_attempts = 1
                response = await http.post(PATH, json=chat())
                assert sum([await env.chats_seen(f) for f in fences]) == 4


@pytest.mark.deadline(130)
async def test_breakers_of_replicas_that_left_are_forgotten(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with gateway_env(tmp_path, clock=idle_clock, max_attempts=2) as env:
            good = await env.launch()
            ghosts = [LiveReplica(index=1, node_id="ghost", fence=new_fence()) for _ in range(3)]
            breakers = env.gateway.breakers
            breakers.threshold = 1
            _, token = await env.token("svc")
            async with env.http(token, timeout=300) as http:
                for ghost in ghosts:
                    # A replica on a node that is not connected fails at once.
                    env.publish("svc", [env.replica(good), ghost])
                    while breakers.state(ghost.key) != OPEN:
                        response = await http.post(PATH, json=chat())
                        assert response.status_code == 200, response.text
            # Each ghost left the view when the next was published: one record remains.
            assert set(breakers._breakers) == {ghosts[-1].key}
            assert _metric(env, "ficc_gateway_breaker_state", ghosts[0].key) is None
