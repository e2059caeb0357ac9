"""Requests to an idle on-demand service: one activation, a bounded wait, keepalives, demand.

A :class:`FakeScaler` stands in for the autoscaler behind ``Gateway.activate``: its
activation is single-flight like the real one, records itself (``activating``)
before it answers, and after a virtual delay publishes either a ready replica (a
real stand-in engine launched beforehand) or the failure. The trio clock is the
``idle_clock``: it jumps ahead whenever the process is idle, so a load delay of
seconds costs none, while the engines answer in real time.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from ficc_core.base.errors import FiccError
from ficc_core.gateway import ProjectEndpoint
from ficc_core.gateway.relay import Timeouts
from ficc_core.routing.live import ActivationFailure

from ..support.gateway_support import chat, gateway_env, sse_events
from ..support.waiting import eventually

PATH = "/v1/chat/completions"
ROUTE = f"/api/v1/inference/svc{PATH}"
COMMENT = b": ficc waiting for standin-chat to load\n\n"


class FakeScaler:
    """The autoscaler's activation, single-flight: ``launches`` counts real activations.

    :param ready: the replicas a successful activation publishes.
    :param delay: virtual seconds from the activation to its outcome.
    :param fail: ``(code, message)``: the activation fails with it instead.
    :param record: virtual seconds ``activate`` takes before it answers (a store write).
    """

    def __init__(
        self,
        env: Any,
        nursery: trio.Nursery,
        ready: list[Any],
        *,
        delay: float,
        fail: tuple[str, str] | None = None,
        record: float = 0.0,
        **view: Any,
    ) -> None:
        self.env, self.nursery, self.ready = env, nursery, ready
        self.delay, self.fail, self.record = delay, fail, record
        self.view = view
        self.calls = 0
        self.launches = 0
        self.refusal: FiccError | None = None
        self.recorded: trio.Event | None = None
        self.done = trio.Event()
        self.finished_at: float | None = None

    def idle(self, service_id: str = "svc") -> None:
        """Publish ``service_id`` idle: no replica, the next request wakes it."""
        self.publish(service_id, [], activation="idle")

    def publish(self, service_id: str, replicas: list[Any], **fields: Any) -> None:
        self.env.publish(service_id, replicas, scaled=True, **{**self.view, **fields})

    async def activate(self, service_id: str) -> None:
        self.calls += 1
        if self.refusal is not None:
            raise self.refusal
        if self.recorded is None:
            self.launches += 1
            self.recorded = trio.Event()
            self.nursery.start_soon(self._run, service_id, self.recorded)
        await self.recorded.wait()

    async def _run(self, service_id: str, recorded: trio.Event) -> None:
        await trio.sleep(self.record)
        self.publish(service_id, [], activation="activating")
        recorded.set()
        await trio.sleep(self.delay)
        if self.fail is not None:
            self.publish(service_id, [], activation="failed", activation_error=self.fail)
        else:
            self.publish(service_id, self.ready)
        self.finished_at = trio.current_time()
        self.done.set()


@asynccontextmanager
async def scaled_env(tmp_path, clock) -> AsyncIterator[tuple[Any, trio.Nursery]]:
    """A gateway environment and the nursery the fake autoscaler's work runs in."""
    async with gateway_env(tmp_path, clock=clock) as env, trio.open_nursery() as nursery:
        yield env, nursery
        nursery.cancel_scope.cancel()


def _metric(env, name: str, **labels: str) -> float:
    text = env.service.metrics.render()[0].decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _actor(env, service_id: str | None = "svc"):
    _, token = await env.token(service_id)
    return await env.service.auth.authenticate_bearer(token)


async def _refusal(gateway, actor, body) -> FiccError:
    with pytest.raises(FiccError) as caught:
        _, response = await gateway.invoke("svc", PATH, body, actor)
        await response.aclose()
    return caught.value


@pytest.mark.deadline(130)
async def test_fifty_requests_to_an_idle_service_wake_it_once_and_are_all_served(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            fence = await env.launch()
            scaler = FakeScaler(env, nursery, [fence], delay=4.0, concurrency=16)
            env.gateway.activations.serve(scaler.activate)
            scaler.idle()
            actor = await _actor(env)
            statuses: list[int] = []
            started = trio.current_time()

            async def one(stream: bool) -> None:
                body = chat(stream, deltas=2)
                async with env.gateway.open_response("svc", PATH, body, actor) as response:
                    answer = b"".join([chunk async for chunk in response])
                    assert answer.endswith(b"data: [DONE]\n\n" if stream else b"}")
                    statuses.append(response.status)

            async with trio.open_nursery() as requests:
                for number in range(50):
                    requests.start_soon(one, number % 2 == 0)
            # Every request asked; one activation ran; every one was answered.
            assert (scaler.calls, scaler.launches) == (50, 1)
            assert statuses == [200] * 50
            assert scaler.finished_at == pytest.approx(started + 4.0, abs=0.5)
            waits = [u.queue_wait for u in env.gateway.usage]
            assert len(waits) == 50
            assert all(3.99 <= wait < env.gateway.activation.wait_bound for wait in waits), waits
            assert {u.outcome for u in env.gateway.usage} == {"ok"}
            assert _metric(env, "ficc_activation_waiting", service="svc") == 0
            assert _metric(env, "ficc_activation_wait_seconds_count", outcome="served") == 50
            assert env.gateway.demand("svc").queued == 0
            # Once ready, a request goes straight to the replica: no activation asked.
            async with env.gateway.open_response("svc", PATH, chat(), actor) as response:
                assert response.status == 200
            assert scaler.calls == 50


@pytest.mark.deadline(130)
async def test_past_activation_wait_the_answer_is_503_activation_timeout(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            scaler = FakeScaler(env, nursery, [], delay=math.inf)
            env.gateway.activations.serve(scaler.activate)
            env.gateway.activation.wait_bound = 10.0
            scaler.idle()
            _, token = await env.token("svc")
            started = trio.current_time()
            async with env.http(token, timeout=300) as http:
                response = await http.post(ROUTE, json=chat())
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "10"  # activation_retry
            error = response.json()["error"]
            assert error["code"] == "activation_timeout"
            assert error["details"]["service"] == "svc"
            assert error["details"]["activation_wait"] == 10.0
            assert error["details"]["waited"] == pytest.approx(10.0, abs=0.5)
            assert trio.current_time() - started == pytest.approx(10.0, abs=1.0)
            [usage] = env.gateway.usage
            assert (usage.status, usage.outcome, usage.replica) == (503, "activation_timeout", "")
            assert usage.queue_wait == pytest.approx(10.0, abs=0.5)
            assert _metric(env, "ficc_activation_wait_seconds_count", outcome="timeout") == 1
            # A request deadline sooner than activation_wait bounds the wait instead.
            scaler.publish("svc", [], activation="activating", request_deadline=4.0)
            actor = await _actor(env)
            started = trio.current_time()
            error = await _refusal(env.gateway, actor, chat())
            assert error.code == "activation_timeout"
            assert trio.current_time() - started == pytest.approx(4.0, abs=0.5)
            assert "request deadline" in error.message
            assert _metric(env, "ficc_activation_waiting", service="svc") == 0


@pytest.mark.deadline(130)
async def test_a_request_refused_activation_timeout_is_demand_until_its_retry_window_passed(
    tmp_path, idle_clock
):
    """It is expected back after its Retry-After (10 s) and 10 s more: until then the
    autoscaler reads it in ``Demand.returning`` and keeps the woken replica up."""
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            scaler = FakeScaler(env, nursery, [], delay=math.inf)
            env.gateway.activations.serve(scaler.activate)
            env.gateway.activation.wait_bound = 5.0
            scaler.idle()
            _, token = await env.token("svc")
            async with env.http(token, timeout=300) as http:
                first = await http.post(ROUTE, json=chat())
                refused_at = trio.current_time()
                assert first.json()["error"]["code"] == "activation_timeout"
                assert env.gateway.demand("svc").returning == 1
                assert env.gateway.demand("svc").queued == 0
                await trio.sleep(3.0)
                second = await http.post(ROUTE, json=chat())
                assert second.json()["error"]["code"] == "activation_timeout"
            assert first.headers["retry-after"] == "10"
            assert env.gateway.activation.retry_window == 20.0
            assert env.gateway.demand("svc").returning == 2
            await trio.sleep_until(refused_at + 19.5)
            assert env.gateway.demand("svc").returning == 2
            await trio.sleep_until(refused_at + 20.5)
            assert env.gateway.demand("svc").returning == 1  # the first one's window passed
            await trio.sleep_until(refused_at + 30.0)
            assert env.gateway.demand("svc").returning == 0
            assert env.gateway.demand("other").returning == 0


@pytest.mark.deadline(130)
async def test_a_failed_activation_answers_every_waiter_at_once_with_its_reason(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            reason = ("engine_load_failed", "the engine exited while loading the model")
            failure = ActivationFailure(
                code=reason[0], message=reason[1], details={"attempt_reason": "exited"}
            )
            scaler = FakeScaler(env, nursery, [], delay=3.0, fail=failure)
            env.gateway.activations.serve(scaler.activate)
            scaler.idle()
            actor = await _actor(env)
            errors: list[FiccError] = []
            started = trio.current_time()

            async def one() -> None:
                errors.append(await _refusal(env.gateway, actor, chat()))

            async with trio.open_nursery() as requests:
                for _ in range(10):
                    requests.start_soon(one)
            # At the failure, not at the 60 s bound.
            assert trio.current_time() - started == pytest.approx(3.0, abs=0.5)
            assert scaler.launches == 1
            assert {(e.code, e.message, e.status) for e in errors} == {(*reason, 503)}
            # The failure's own details come with it.
            assert errors[0].details == {
                "attempt_reason": "exited",
                "service": "svc",
                "activation": "failed",
            }
            assert errors[0].headers == {"Retry-After": "10"}
            assert _metric(env, "ficc_activation_wait_seconds_count", outcome="failed") == 10
            assert [u.outcome for u in env.gateway.usage] == ["engine_load_failed"] * 10
            # While the failure is recent the autoscaler refuses at once: that refusal,
            # marked as the activation's.
            scaler.refusal = FiccError("no placement fits", code="no_capacity", status=503)
            error = await _refusal(env.gateway, actor, chat())
            assert (error.code, error.status, error.message) == (
                "no_capacity",
                503,
                "no placement fits",
            )
            assert error.details == {"service": "svc", "activation": "failed"}
            assert error.headers["Retry-After"] == "10"
            # A gateway without an autoscaler cannot wake anything: it says so.
            env.gateway.activations.serve(None)
            scaler.idle()
            error = await _refusal(env.gateway, actor, chat())
            assert (error.code, error.status) == ("activation_failed", 503)
            assert _metric(env, "ficc_activation_waiting", service="svc") == 0


@pytest.mark.deadline(130)
async def test_one_more_than_activation_queue_is_refused_429_at_once(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            scaler = FakeScaler(env, nursery, [], delay=math.inf)
            env.gateway.activations.serve(scaler.activate)
            env.gateway.activation.capacity = 3
            env.gateway.activation.wait_bound = 5.0
            scaler.idle()
            actor = await _actor(env)
            held: list[FiccError] = []

            async def waiter() -> None:
                held.append(await _refusal(env.gateway, actor, chat()))

            async with trio.open_nursery() as waiters:
                for _ in range(3):
                    waiters.start_soon(waiter)
                await eventually(lambda: env.gateway.activation.waiting("svc") == 3)
                _, token = await env.token("svc")
                async with env.http(token) as http:
                    response = await http.post(ROUTE, json=chat())
                assert response.status_code == 429, response.text
                assert response.headers["retry-after"] == "1"
                error = response.json()["error"]
                assert error["code"] == "service_saturated"
                assert error["details"] == {"service": "svc", "waiting": 3, "activation_queue": 3}
                assert env.gateway.usage[-1].outcome == "service_saturated"
                assert env.gateway.demand("svc").queued == 3
            # The three waited their bound; the refused one never joined.
            assert [e.code for e in held] == ["activation_timeout"] * 3
            assert _metric(env, "ficc_activation_wait_seconds_count") == 3


@pytest.mark.deadline(130)
async def test_a_stream_gets_keepalive_comments_while_it_waits_then_the_answer(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            fence = await env.launch()
            scaler = FakeScaler(env, nursery, [fence], delay=3.5)
            env.gateway.activations.serve(scaler.activate)
            env.gateway.activation.keepalive = 1.0
            scaler.idle()
            _, token = await env.token("svc")
            async with env.http(token, timeout=300) as http:
                async with http.stream("POST", ROUTE, json=chat(True, deltas=3)) as response:
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("text/event-stream")
                    body = b"".join([chunk async for chunk in response.aiter_raw()])
            # A comment at 1, 2 and 3 s, then the engine's stream as it is.
            comments, _, rest = body.rpartition(COMMENT)
            assert comments.replace(COMMENT, b"") == b""
            assert body.count(COMMENT) == 3
            events = sse_events(rest)
            assert events[-1] == "[DONE]" and all("choices" in e for e in events[:-1])
            [usage] = env.gateway.usage
            assert (usage.status, usage.outcome, usage.replica) == (200, "ok", fence.attempt_id)
            assert usage.queue_wait == pytest.approx(3.5, abs=0.5)
            assert usage.completion_tokens == 3
            # A stream that loads before the first keepalive answers with no comment at all.
            async with env.http(token, timeout=300) as http:
                response = await http.post(ROUTE, json=chat(True, deltas=2))
            assert not response.content.startswith(b":")


@pytest.mark.deadline(130)
async def test_a_failure_after_keepalives_ends_the_stream_with_the_sse_error_event(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            reason = ("engine_load_failed", "the engine ran out of memory while loading")
            failure = ActivationFailure(code=reason[0], message=reason[1])
            scaler = FakeScaler(env, nursery, [], delay=2.5, fail=failure)
            env.gateway.activations.serve(scaler.activate)
            env.gateway.activation.keepalive = 1.0
            scaler.idle()
            _, token = await env.token("svc")
            async with env.http(token, timeout=300) as http:
                response = await http.post(ROUTE, json=chat(True))
            assert response.status_code == 200
            assert response.content.count(COMMENT) == 2
            [event] = sse_events(response.content)
            assert event["error"]["code"] == "engine_load_failed"
            assert event["error"]["message"] == reason[1]
            assert event["error"]["details"] == {"service": "svc", "activation": "failed"}
            [usage] = env.gateway.usage
            assert (usage.status, usage.outcome) == (200, "engine_load_failed")
            assert _metric(env, "ficc_activation_wait_seconds_count", outcome="failed") == 1
            # Past the bound after keepalives: the timeout, as the stream's last event.
            scaler.fail, scaler.delay, scaler.recorded = None, math.inf, None
            env.gateway.activation.wait_bound = 3.0
            scaler.idle()
            async with env.http(token, timeout=300) as http:
                response = await http.post(ROUTE, json=chat(True))
            assert response.status_code == 200
            assert response.content.count(COMMENT) == 2  # at 1 and 2 s; the bound at 3
            [event] = sse_events(response.content)
            assert event["error"]["code"] == "activation_timeout"
            assert env.gateway.usage[-1].outcome == "activation_timeout"


@pytest.mark.deadline(130)
async def test_a_waiter_that_leaves_does_not_cancel_the_activation(tmp_path, idle_clock):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            fence = await env.launch()
            # activate() itself takes a second (the autoscaler recording it).
            scaler = FakeScaler(env, nursery, [fence], delay=4.0, record=1.0)
            env.gateway.activations.serve(scaler.activate)
            env.gateway.activation.keepalive = 1.0
            scaler.idle()
            actor = await _actor(env)
            # One leaves while activate() has not answered, one while waiting for the load.
            for leave_after in (0.5, 2.0):
                with trio.move_on_after(leave_after):
                    await env.gateway.invoke("svc", PATH, chat(), actor)
                    raise AssertionError("served before the load finished")
                assert env.gateway.activation.waiting("svc") == 0
            # A stream closed while it gets keepalives leaves too.
            _, response = await env.gateway.invoke("svc", PATH, chat(True), actor)
            assert await response.__anext__() == COMMENT
            await response.aclose()
            assert _metric(env, "ficc_activation_waiting", service="svc") == 0
            assert _metric(env, "ficc_activation_wait_seconds_count", outcome="left") == 3
            assert [u.outcome for u in env.gateway.usage] == ["cancelled"] * 3
            assert env.service.live.inflight("svc") == 0
            # The activation went on to its end: the next request is served at once.
            await scaler.done.wait()
            assert scaler.launches == 1
            _, response = await env.gateway.invoke("svc", PATH, chat(), actor)
            await response.aclose()
            assert env.gateway.usage[-1].outcome == "ok"


@pytest.mark.deadline(130)
async def test_demand_counts_waiters_their_wait_and_how_long_replicas_served_nothing(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            env.gateway.relay.timeouts = Timeouts()
            fence = await env.launch()
            key = fence.attempt_id
            scaler = FakeScaler(env, nursery, [fence], delay=math.inf, concurrency=1)
            env.gateway.activations.serve(scaler.activate)
            scaler.idle()
            gateway, actor = env.gateway, await _actor(env)
            demand = gateway.demand("svc")
            assert (demand.queued, demand.oldest_wait, demand.inflight) == (0, 0.0, 0)
            assert (demand.idle_for, demand.waits) == ({}, ())
            async with trio.open_nursery() as waiters:
                waiters.start_soon(_refusal, gateway, actor, chat())
                await trio.sleep(2.0)
                waiters.start_soon(_refusal, gateway, actor, chat())
                await trio.sleep(1.0)
                demand = gateway.demand("svc")
                assert (demand.queued, demand.inflight) == (2, 2)
                assert demand.oldest_wait == pytest.approx(3.0, abs=0.3)
                # Each waiter's wait, longest first: two have waited 1 s, one 3 s.
                assert demand.waits == pytest.approx((3.0, 1.0), abs=0.3)
                assert demand.waited(1) == demand.oldest_wait
                assert demand.waited(2) == pytest.approx(1.0, abs=0.3)
                assert demand.waited(3) == demand.waited(0) == 0.0
                waiters.cancel_scope.cancel()
            # A replica joins: first seen now, so idle from now.
            scaler.publish("svc", [fence])
            assert gateway.demand("svc").idle_for == {key: 0.0}
            await trio.sleep(5.0)
            assert gateway.demand("svc").idle_for[key] == pytest.approx(5.0, abs=0.3)
            # One request in flight (not read yet), one queued behind it for the one slot.
            _, first = await gateway.invoke("svc", PATH, chat(True, deltas=3), actor)
            second: list[Any] = []
            answered = trio.Event()

            async def queued() -> None:
                second.append(await gateway.invoke("svc", PATH, chat(), actor))
                answered.set()

            nursery.start_soon(queued)
            await trio.sleep(1.5)
            demand = gateway.demand("svc")
            assert (demand.queued, demand.inflight, demand.idle_for) == (1, 2, {key: 0.0})
            assert demand.oldest_wait == pytest.approx(1.5, abs=0.3)
            assert demand.waits == pytest.approx((1.5,), abs=0.3)  # the one for a slot
            async with first:
                assert b"[DONE]" in b"".join([chunk async for chunk in first])
            await answered.wait()
            await second[0][1].aclose()
            await trio.sleep(2.0)
            demand = gateway.demand("svc")
            assert (demand.queued, demand.oldest_wait, demand.inflight) == (0, 0.0, 0)
            assert demand.idle_for[key] == pytest.approx(2.0, abs=0.3)
            # A replica no longer routed to is forgotten at the router's sweep: back, it
            # counts from when it is seen again.
            scaler.idle()
            assert gateway.demand("svc").idle_for == {}
            gateway.router.sweep(set())
            scaler.publish("svc", [fence])
            assert gateway.demand("svc").idle_for == {key: 0.0}


@pytest.mark.deadline(130)
async def test_the_project_endpoint_wakes_an_idle_service_and_falls_back_when_it_fails(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            fence, spare = await env.launch(), await env.launch()
            scaler = FakeScaler(env, nursery, [fence], delay=2.0, names=("smol",))
            env.gateway.activations.serve(scaler.activate)
            scaler.idle()
            # "spare" answers to the same name but has no replica and cannot be woken.
            env.publish("other", [], alias="spare-chat", names=("smol",))
            project = ProjectEndpoint(env.gateway)
            actor = await _actor(env, None)
            # /v1/models lists the idle service as any other.
            served = await project.invoke("/v1/models", b"", actor)
            listed = b"".join([chunk async for chunk in served.response])
            assert b'"id":"standin-chat"' in listed.replace(b" ", b"")
            # By its name: the idle service is woken, not skipped for one that cannot serve.
            served = await project.invoke(PATH, {**chat(), "model": "smol"}, actor)
            await served.response.aclose()
            assert (served.status, served.service.id) == (200, "svc")
            assert scaler.launches == 1
            # A failed activation sends the request on to the service's fallbacks.
            env.publish("other", [spare], alias="spare-chat")
            scaler.refusal = FiccError("no placement fits", code="no_capacity", status=503)
            scaler.publish(
                "svc",
                [],
                activation="failed",
                activation_error=ActivationFailure(code="x", message="y"),
                fallbacks=("spare-chat",),
            )
            served = await project.invoke(PATH, chat(), actor)
            await served.response.aclose()
            assert (served.status, served.service.id) == (200, "other")
            # So does one that does not load in time.
            scaler.refusal, scaler.recorded = None, None
            scaler.delay = math.inf
            env.gateway.activation.wait_bound = 5.0
            scaler.publish("svc", [], activation="idle", fallbacks=("spare-chat",))
            served = await project.invoke(PATH, chat(), actor)
            await served.response.aclose()
            assert served.service.id == "other"
            assert [u.outcome for u in env.gateway.usage][-2:] == ["activation_timeout", "ok"]


@pytest.mark.deadline(130)
async def test_a_drain_stop_removal_or_revocation_ends_the_wait_with_its_own_refusal(
    tmp_path, idle_clock
):
    with trio.fail_after(120):
        async with scaled_env(tmp_path, idle_clock) as (env, nursery):
            scaler = FakeScaler(env, nursery, [], delay=math.inf)
            env.gateway.activations.serve(scaler.activate)
            live = env.service.live
            credential_id, token = await env.token("svc")
            actor = await env.service.auth.authenticate_bearer(token)

            async def revoke() -> None:
                await env.service.auth.revoke_credential(None, credential_id)

            cases = [
                (lambda: live.close("svc", "draining", 1), "service_draining"),
                (lambda: live.close("svc", "stopped", 2), "service_stopped"),
                (lambda: live.remove("svc"), "service_not_found"),
                (revoke, "credential_revoked"),
            ]
            for action, code in cases:
                scaler.idle()
                errors: list[FiccError] = []

                async def waiter() -> None:
                    errors.append(await _refusal(env.gateway, actor, chat()))  # noqa: B023

                async with trio.open_nursery() as waiters:
                    waiters.start_soon(waiter)
                    await eventually(lambda: env.gateway.activation.waiting("svc") == 1)
                    await trio.sleep(1.0)
                    done = action()
                    if done is not None:
                        await done
                    acted = trio.current_time()
                # Within the re-check interval, long before the 60 s bound.
                assert trio.current_time() - acted < 1.0
                assert [e.code for e in errors] == [code]
            assert _metric(env, "ficc_activation_wait_seconds_count", outcome="failed") == 4
            assert _metric(env, "ficc_activation_waiting", service="svc") == 0
