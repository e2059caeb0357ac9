"""Streams the gateway must end: revoked tokens, stopped services, new generations,
dead engines, deadlines and clients that go away. Never a hang, always promptly."""

from __future__ import annotations

import json
from functools import partial

import attrs
import httpx
import openai
import pytest
import trio

from ..support.gateway_support import ALIAS, chat, gateway_env
from ..support.waiting import eventually

PATH = "/api/v1/inference/svc/v1/chat/completions"


async def _stream_until(env, token, trigger, *, after: int = 3, **options):
    """Stream a long chat; after ``after`` events run ``trigger``; return (events, seconds).

    ``seconds`` is the time from the trigger to the end of the stream.
    """
    events, ended = [], None
    async with env.http(token) as http:
        async with http.stream("POST", PATH, json=chat(True, **options)) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            triggered_at = None
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
                if len(events) == after:
                    triggered_at = trio.current_time()
                    await trigger()
            ended = trio.current_time()
    assert triggered_at is not None, events
    return events, ended - triggered_at


def _last_error(events) -> dict:
    assert events and isinstance(events[-1], dict) and "error" in events[-1], events[-3:]
    return events[-1]["error"]


@pytest.mark.deadline(70)
async def test_revoking_the_token_ends_the_stream_within_a_second(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            credential_id, token = await env.token("svc")

            async def revoke():
                await env.service.auth.revoke_credential(None, credential_id)

            events, seconds = await _stream_until(env, token, revoke, deltas=2000, interval=0.01)
            assert seconds < 1.0, seconds
            assert _last_error(events)["code"] == "credential_revoked"
            assert "[DONE]" not in events
            # The token no longer opens anything.
            async with env.http(token) as http:
                response = await http.post(PATH, json=chat())
            assert response.status_code == 401
            await eventually(lambda: env.gateway.load(fence.attempt_id) == 0)


@pytest.mark.deadline(70)
async def test_a_stalled_stream_still_ends_within_a_second_of_revocation(tmp_path):
    # The engine sends nothing for 30 s between deltas: the read waiting for it re-checks.
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            credential_id, token = await env.token("svc")

            async def revoke():
                await env.service.auth.revoke_credential(None, credential_id)

            events, seconds = await _stream_until(
                env, token, revoke, after=1, deltas=3, interval=30
            )
            assert seconds < 1.0, seconds
            assert _last_error(events)["code"] == "credential_revoked"


@pytest.mark.deadline(70)
async def test_stopping_the_service_or_a_new_generation_ends_the_stream(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            view = env.publish("svc", [fence])
            _, token = await env.token("svc")

            async def stop():
                env.service.live.publish(attrs.evolve(view, admission="stopped"))

            events, seconds = await _stream_until(env, token, stop, deltas=2000, interval=0.01)
            assert seconds < 1.0, seconds
            assert _last_error(events)["code"] == "service_stopped"

            view = env.publish("svc", [fence])

            async def next_generation():
                env.service.live.publish(attrs.evolve(view, generation=2, replicas=()))

            events, seconds = await _stream_until(
                env, token, next_generation, deltas=2000, interval=0.01
            )
            assert seconds < 1.0, seconds
            assert _last_error(events)["code"] == "service_generation_changed"

            # Draining lets the stream in flight finish while new requests are refused.
            view = env.publish("svc", [fence])

            async def drain():
                env.service.live.publish(attrs.evolve(view, admission="draining"))
                async with env.http(token) as http:
                    response = await http.post(PATH, json=chat())
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "service_draining"
                assert env.service.live.inflight("svc") == 1

            events, _ = await _stream_until(env, token, drain, deltas=20, interval=0.01)
            assert events[-1] == "[DONE]"
            assert env.service.live.inflight("svc") == 0


@pytest.mark.deadline(70)
async def test_an_engine_killed_mid_stream_ends_it_with_an_error_event(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")

            async def kill():
                await env.kill_engine(fence)

            events, seconds = await _stream_until(env, token, kill, deltas=2000, interval=0.01)
            assert seconds < 2.0, seconds
            error = _last_error(events)
            assert error["code"] == "engine_failed", error
            # The OpenAI client reads the error event as an APIError.
            client = openai.OpenAI(base_url=env.base_url("svc"), api_key=token, max_retries=0)
            fence2 = await env.launch()
            env.publish("svc", [fence2])

            def stream_and_kill():
                stream = client.chat.completions.create(
                    model=ALIAS,
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                    extra_body={"standin_deltas": 2000, "standin_interval": 0.01},
                )
                for number, _ in enumerate(stream):
                    if number == 2:
                        trio.from_thread.run(env.kill_engine, fence2)

            with pytest.raises(openai.APIError) as caught:
                await trio.to_thread.run_sync(stream_and_kill)
            assert "stream failed" in caught.value.message


@pytest.mark.deadline(70)
async def test_a_streamed_request_past_its_deadline_ends_with_an_error_event(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence], request_deadline=1.0)
            _, token = await env.token("svc")
            begin = trio.current_time()

            async def nothing():
                pass

            events, _ = await _stream_until(env, token, nothing, deltas=2000, interval=0.01)
            took = trio.current_time() - begin
            assert 1.0 <= took < 2.0, took
            assert _last_error(events)["code"] == "deadline_exceeded"


@pytest.mark.deadline(70)
async def test_a_client_that_goes_away_cancels_the_engine_request(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")
            before = await env.engine_stats(fence)
            async with env.http(token) as http:
                async with http.stream(
                    "POST", PATH, json=chat(True, deltas=100_000, interval=0.005)
                ) as response:
                    seen = 0
                    async for line in response.aiter_lines():
                        seen += line.startswith("data: ")
                        if seen == 5:
                            break
                    closed_at = trio.current_time()
            # The engine sees its client (the executor) go away.
            while True:
                stats = await env.engine_stats(fence)
                if stats["chat_disconnects"] > before["chat_disconnects"]:
                    break
                await trio.sleep(0.01)
            seconds = trio.current_time() - closed_at
            print(f"client disconnect -> engine disconnect: {seconds * 1000:.0f} ms")
            assert seconds < 1.0, seconds
            assert stats["chat_streams_open"] == 0
            assert env.gateway.load(fence.attempt_id) == 0
            assert env.service.live.inflight("svc") == 0
            assert [u.outcome for u in env.gateway.usage] == ["cancelled"]


@pytest.mark.deadline(70)
async def test_a_client_that_leaves_a_request_not_yet_answered_cancels_it(tmp_path):
    # Not streamed, the whole answer is generated before anything is sent: a client that
    # gives up meanwhile (a timeout) used to leave the request holding its slot, the
    # engine generating, until the engine finished by itself.
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            fence = await env.launch()
            env.publish("svc", [fence])
            _, token = await env.token("svc")
            slow = chat(False, deltas=400, interval=0.05)  # a 20 s answer
            async with env.http(token, timeout=0.5) as http:
                with pytest.raises(httpx.ReadTimeout):
                    await http.post(PATH, json=slow)
            left_at = trio.current_time()
            await eventually(lambda: env.gateway.load(fence.attempt_id) == 0, seconds=2)
            await eventually(lambda: env.service.live.inflight("svc") == 0, seconds=2)
            assert trio.current_time() - left_at < 2.0
            assert [u.outcome for u in env.gateway.usage] == ["cancelled"]
            # The slot serves the next request at once.
            async with env.http(token) as http:
                answered = await http.post(PATH, json=chat(False))
            assert answered.status_code == 200, answered.text


@pytest.mark.deadline(70)
async def test_a_new_generation_serves_the_queue_and_ends_the_old_answer(tmp_path):
    with trio.fail_after(60):
        async with gateway_env(tmp_path) as env:
            old = await env.launch()
            new = await env.launch(generation=2)
            view = env.publish("svc", [old], concurrency=1)
            _, token = await env.token("svc")
            results = {}
            async with env.http(token) as http, trio.open_nursery() as nursery:

                async def post(name, **options):
                    results[name] = await http.post(PATH, json=chat(**options))

                nursery.start_soon(partial(post, "in_flight", deltas=100, interval=0.05))
                await eventually(lambda: env.gateway.load(old.attempt_id) == 1)
                nursery.start_soon(partial(post, "queued", deltas=2))
                await eventually(lambda: env.gateway.queued("svc") == 1)
                env.service.live.publish(
                    attrs.evolve(view, generation=2, replicas=(env.replica(new),))
                )
            # The unanswered JSON request of the old generation: the envelope, at once.
            in_flight = results["in_flight"]
            assert in_flight.status_code == 503, in_flight.text
            assert in_flight.json()["error"]["code"] == "service_generation_changed"
            # The queued one had sent nothing yet: the new generation served it.
            assert results["queued"].status_code == 200, results["queued"].text
            assert [u.replica for u in env.gateway.usage if u.outcome == "ok"] == [new.attempt_id]


async def _login(env, password="a long enough password") -> tuple[str, str]:
    """A browser session holding ``inference:invoke``: (session cookie, CSRF token)."""
    await env.service.auth.create_user(
        "viewer", password, projects={"default": frozenset({"inference:invoke"})}
    )
    async with httpx.AsyncClient(base_url=env.url, timeout=30) as browser:
        login = await browser.post(
            "/api/v1/session",
            json={"username": "viewer", "password": password, "project": "default"},
        )
    assert login.status_code == 201, login.text
    return login.cookies["ficc_session"], login.json()["csrf_token"]


@pytest.mark.parametrize("credential", ["bearer", "cookie"])
@pytest.mark.deadline(70)
async def test_a_client_that_stops_reading_frees_its_slot_at_the_send_deadline(
    tmp_path, credential
):
    # A raw client with a tiny receive buffer asks for a long stream and never reads:
    # the server's send blocks, so the gateway never reaches its own deadline check.
    # The invoke handler must stop sending at the send deadline and free the slot,
    # for a bearer token and for a browser session alike.
    deadline, grace = 1.0, 1.5
    with trio.fail_after(60):
        async with gateway_env(tmp_path, send_grace=grace) as env:
            fence = await env.launch()
            env.publish("svc", [fence], concurrency=1, request_deadline=deadline)
            _, token = await env.token("svc")
            if credential == "bearer":
                authority = f"Authorization: Bearer {token}\r\n"
            else:
                cookie, csrf = await _login(env)
                authority = f"Cookie: ficc_session={cookie}\r\nX-CSRF-Token: {csrf}\r\n"
            host, port = env.url.removeprefix("http://").rsplit(":", 1)
            body = json.dumps(chat(True, deltas=2_000_000)).encode()
            head = (
                f"POST {PATH} HTTP/1.1\r\nHost: {host}\r\n{authority}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sock = trio.socket.socket()
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
            with sock:
                begin = trio.current_time()
                await sock.connect((host.strip("[]"), int(port)))
                await sock.send(head.encode() + body)
                await eventually(lambda: env.gateway.load(fence.attempt_id) == 1)
                # Past the request deadline, within the grace: the stalled send still holds it.
                await trio.sleep_until(begin + deadline + 0.5)
                assert env.gateway.load(fence.attempt_id) == 1
                await eventually(lambda: env.gateway.load(fence.attempt_id) == 0, seconds=10)
                freed = trio.current_time() - begin
                print(f"stalled reader's slot freed after {freed:.2f} s")
                assert deadline + grace <= freed < deadline + grace + 1.0, freed
            assert env.service.live.inflight("svc") == 0
            assert [u.outcome for u in env.gateway.usage] == ["cancelled"]
            # The slot is free for the next request.
            async with env.http(token) as http:
                response = await http.post(PATH, json=chat())
            assert response.status_code == 200, response.text
