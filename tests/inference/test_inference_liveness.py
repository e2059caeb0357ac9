"""Liveness: a hung (SIGSTOPped) real llama.cpp engine is noticed, routed around, restarted.

Real engines (SmolLM2 through the embedded agent); the probe settings are shortened
so the test runs in seconds, except where the defaults themselves are what is tested.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
from pathlib import Path

import pytest
import trio

from ficc_core.config import Config
from ficc_core.executor.types import EndOfStream, ResponseHead
from ficc_core.gateway.relay import Timeouts
from ficc_core.routing.live import LiveReplica, LiveService, LiveTable
from ficc_core.schema import Fence

from ..support.inference_support import (
    engine_pid,
    open_inference_controller,
    ready_service,
    register_smollm2,
)
from ..support.waiting import eventually

FAST = {"liveness_interval": "1s", "liveness_timeout": "1s", "liveness_misses": 3}
#: Probes are brought forward by failed scrapes: three misses of one second each, a
#: scrape's second before the first, and the next-probe spacing.
DETECTED_WITHIN = 8.0
SHORT = {"role": "user", "content": "Hi"}
LONG = {"role": "user", "content": "Write a very long story about a lighthouse keeper."}


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _invoke(service_id: str) -> str:
    return f"/api/v1/inference/{service_id}/v1/chat/completions"


async def _stream(http, service_id: str, token: str, box: dict) -> None:
    """Stream a long answer; record its chunks and the error event that ends it, if any."""
    body = {"model": "smol", "stream": True, "max_tokens": 400, "messages": [LONG]}
    headers = {"Authorization": f"Bearer {token}"}
    box["chunks"] = 0
    async with http.stream("POST", _invoke(service_id), json=body, headers=headers) as response:
        box["status"] = response.status_code
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            document = json.loads(line[len("data: ") :])
            if "error" in document:
                box["error"] = document["error"]
            else:
                box["chunks"] += 1
    box["ended_at"] = trio.current_time()


async def _traffic(http, service_id: str, token: str, results: list, stop: trio.Event) -> None:
    """Short non-streamed requests one after the other: (started, ended, status, body)."""
    body = {"model": "smol", "max_tokens": 4, "messages": [SHORT]}
    headers = {"Authorization": f"Bearer {token}"}
    while not stop.is_set():
        started = trio.current_time()
        response = await http.post(_invoke(service_id), json=body, headers=headers, timeout=60)
        results.append((started, trio.current_time(), response.status_code, response.text))


@pytest.mark.slow
@pytest.mark.deadline(310)
async def test_a_sigstopped_engine_leaves_routing_its_stream_ends_and_it_is_restarted(tmp_path):
    with trio.fail_after(300):
        async with open_inference_controller(tmp_path, **FAST) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(
                controller, model_id, node_ids=("local", "local"), cpus=0.5, concurrency=2
            )
            live, gateway = controller.service.live, controller.service.gateway
            hung, other = live.get(service_id).replicas
            agent_dir = Path(controller.service.config.agent_path)
            pid = await trio.to_thread.run_sync(engine_pid, agent_dir, hung.key)
            http = controller.http
            results: list = []
            streams: list[dict] = [{}, {}, {}]
            stop = trio.Event()
            try:
                async with trio.open_nursery() as nursery:
                    for box in streams:
                        nursery.start_soon(_stream, http, service_id, token, box)
                    # A stream is under way on the replica about to hang.
                    with trio.fail_after(30):
                        await eventually(
                            lambda: (
                                gateway.load(hung.key) and any(b.get("chunks") for b in streams)
                            ),
                            None,
                            every=0.05,
                        )
                    for _ in range(2):
                        nursery.start_soon(_traffic, http, service_id, token, results, stop)
                    await trio.sleep(0.5)
                    os.kill(pid, signal.SIGSTOP)
                    stopped_at = trio.current_time()

                    # Detected within the configured bound: out of routing.
                    with trio.fail_after(DETECTED_WITHIN + 5):
                        await eventually(
                            lambda: (
                                not any(r.key == hung.key for r in live.get(service_id).replicas)
                            ),
                            None,
                            every=0.05,
                        )
                    detected_at = trio.current_time()
                    assert detected_at - stopped_at < DETECTED_WITHIN
                    assert live.suspended(hung.key) == "unresponsive"
                    assert [r.key for r in live.get(service_id).replicas] == [other.key]

                    # Traffic goes on on the other replica: wait (bounded) until two
                    # requests sent after the detection have had their answers.
                    with trio.fail_after(90):
                        await eventually(
                            lambda: sum(1 for r in results if r[0] >= detected_at) >= 2,
                            None,
                            every=0.05,
                        )
                    stop.set()
            finally:
                await trio.to_thread.run_sync(_resume, pid)

            # Every request sent after the detection was answered.
            after = [r for r in results if r[0] >= detected_at]
            assert len(after) >= 2
            assert all(status == 200 for _, _, status, _ in after), after
            # The streams on the hung replica ended with an error event naming why; the
            # others finished.
            cut = [box for box in streams if "error" in box]
            assert cut, streams
            for box in cut:
                assert box["error"]["code"] == "replica_unresponsive", box
                assert box["error"]["details"]["reason"] == "unresponsive"
                assert box["ended_at"] - detected_at < 5.0  # at once, on a busy machine too
            # The replica is restarted: a new attempt of it serves.
            view = await controller.wait_service(
                service_id,
                lambda v: (
                    v["state"] == "ready"
                    and all(r["attempt_id"] != hung.key for r in v["replicas"])
                    and len(live.get(service_id).replicas) == 2
                ),
            )
            [replaced] = [r for r in view["replicas"] if r["index"] == hung.index]
            assert replaced["attempt"] >= 2
            # The events say what happened and for how long.
            events = (await controller.ok("GET", f"/api/v1/inference/{service_id}/events"))[
                "events"
            ]
            mine = [e for e in events if e.get("reason") == "unresponsive"]
            messages = " | ".join(e["message"] for e in mine)
            assert "missed 3 liveness probes in a row" in messages, messages
            assert "answered no liveness probe for" in messages, messages
            # The metrics too.
            metrics = (await controller.call("GET", "/metrics")).text
            misses = [
                line
                for line in metrics.splitlines()
                if line.startswith("ficc_replica_liveness_misses_total") and hung.key in line
            ]
            assert misses and float(misses[0].split()[-1]) >= 3, misses
            restarted = [
                line
                for line in metrics.splitlines()
                if line.startswith("ficc_replica_unresponsive_seconds_count")
                and 'outcome="restarted"' in line
            ]
            assert restarted and float(restarted[0].split()[-1]) == 1.0, restarted


def test_every_engine_wait_has_a_finite_default_bound():
    timeouts = Timeouts.from_config(Config())
    for bound in ("dial", "response_header", "generation", "first_token", "idle"):
        assert math.isfinite(getattr(timeouts, bound)), bound
    config = Config()
    assert (config.liveness_interval, config.liveness_timeout, config.liveness_misses) == (
        10.0,
        5.0,
        3,
    )


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_a_non_streamed_request_to_a_hung_engine_ends_under_the_default_settings(tmp_path):
    """No shortened setting: the default liveness probes end the request (brought forward
    by the gateway's failed scrapes), well before the default generation bound."""
    with trio.fail_after(240):
        async with open_inference_controller(tmp_path) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(controller, model_id)
            [replica] = controller.service.live.get(service_id).replicas
            agent_dir = Path(controller.service.config.agent_path)
            pid = await trio.to_thread.run_sync(engine_pid, agent_dir, replica.key)
            body = {"model": "smol", "max_tokens": 4, "messages": [SHORT]}
            headers = {"Authorization": f"Bearer {token}"}
            os.kill(pid, signal.SIGSTOP)
            try:
                sent = trio.current_time()
                response = await controller.http.post(
                    _invoke(service_id), json=body, headers=headers, timeout=120
                )
                took = trio.current_time() - sent
            finally:
                await trio.to_thread.run_sync(_resume, pid)
            # Three 5 s probes once the first failed scrape brought them forward, then the
            # request waits for a replica (the restarted one, or band_queue_ttl).
            # Three 5 s probes once the first failed scrape (1 s) brought them forward.
            assert took < 1 + 3 * 5 + 6, took
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "replica_unresponsive", error
            assert error["details"]["reason"] == "unresponsive"
            assert response.headers["retry-after"] == "1"
            status = await controller.ok("GET", f"/api/v1/inference/{service_id}/status")
            assert status is not None


@pytest.mark.slow
@pytest.mark.deadline(250)
async def test_a_hung_engine_that_answers_again_before_its_restart_is_put_back(tmp_path):
    # A 3 s probe timeout: the restart waits at least one more probe, time to resume it.
    settings = {**FAST, "liveness_timeout": "3s"}
    with trio.fail_after(240):
        async with open_inference_controller(tmp_path, **settings) as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(controller, model_id)
            live = controller.service.live
            [replica] = live.get(service_id).replicas
            agent_dir = Path(controller.service.config.agent_path)
            pid = await trio.to_thread.run_sync(engine_pid, agent_dir, replica.key)
            os.kill(pid, signal.SIGSTOP)
            try:
                with trio.fail_after(20):
                    await eventually(lambda: not live.get(service_id).replicas, None, every=0.05)
                view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            finally:
                await trio.to_thread.run_sync(_resume, pid)
            # While out: the replica says why.
            [shown] = view["replicas"]
            assert shown["reason"] == "unresponsive", shown
            # Answering again, it is put back: the same attempt, no restart.
            with trio.fail_after(20):
                await eventually(
                    lambda: [r.key for r in live.get(service_id).replicas] == [replica.key],
                    None,
                    every=0.05,
                )
            view = await controller.wait_service(
                service_id, lambda v: v["replicas"][0]["reason"] is None and v["state"] == "ready"
            )
            assert view["replicas"][0]["attempt_id"] == replica.key
            events = (await controller.ok("GET", f"/api/v1/inference/{service_id}/events"))[
                "events"
            ]
            assert any("answered its liveness probe again after" in e["message"] for e in events)
            response = await controller.http.post(
                _invoke(service_id),
                json={"model": "smol", "max_tokens": 4, "messages": [SHORT]},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert response.status_code == 200, response.text
            metrics = (await controller.call("GET", "/metrics")).text
            assert any(
                line.startswith("ficc_replica_unresponsive_seconds_count")
                and 'outcome="answered"' in line
                and line.endswith(" 1.0")
                for line in metrics.splitlines()
            ), metrics


def _view(*keys: str) -> LiveService:
    replicas = tuple(
        LiveReplica(
            index=i,
            node_id="local",
            fence=Fence(attempt_id=key, generation=1, plan_digest="sha256:" + "ab" * 32),
        )
        for i, key in enumerate(keys)
    )
    return LiveService(
        id="svc",
        project_id="p",
        alias="smol",
        generation=1,
        admission="serving",
        concurrency=1,
        replicas=replicas,
    )


async def test_a_suspended_replica_leaves_the_view_at_once_and_every_later_one_until_resumed():
    table = LiveTable()
    table.publish(_view("a-1", "a-2"))
    changed = table.changed("svc")
    table.suspend("svc", "a-1", "unresponsive")
    assert changed.is_set()  # in-flight streams re-check at once
    assert [r.key for r in table.get("svc").replicas] == ["a-2"]
    assert table.suspended("a-1") == "unresponsive"
    table.publish(_view("a-1", "a-2"))  # the reconciler's next view keeps it out
    assert [r.key for r in table.get("svc").replicas] == ["a-2"]
    table.resume("a-1")
    table.publish(_view("a-1", "a-2"))
    assert [r.key for r in table.get("svc").replicas] == ["a-1", "a-2"]


async def test_a_gateway_suspicion_wakes_the_prober_and_only_a_waiting_one():
    table = LiveTable()
    table.suspect("a-1")  # nobody probes it: nothing kept
    event = table.suspicion("a-1")
    assert not event.is_set()
    table.suspect("a-1")
    assert event.is_set()
    assert not table.suspicion("a-1").is_set()  # a fresh one for the next wait


def test_a_replica_that_gave_up_unresponsive_is_told_it_hung_and_what_to_look_at():
    from ficc_core.inference.reconciliation.publication import give_up_reason
    from ficc_core.inference.records import AttemptRecord, AttemptState

    attempt = AttemptRecord(
        attempt_id="svc_1.r0.g1.a3.abcdef",
        service_id="svc_1",
        replica=0,
        generation=1,
        number=3,
        node_id="gpu-1",
        provider="process",
        plan_digest="sha256:" + "0" * 64,
        state=AttemptState.FAILED,
        reason="unresponsive",
        message="its engine answered no liveness probe for 3.0 s",
        released=True,
        created_at=0.0,
        updated_at=0.0,
    )
    reason = give_up_reason(0, attempt, 3)
    assert "failed the same way (unresponsive)" in reason
    assert "stopped answering after it was ready" in reason
    assert "ficc inference logs svc_1 --replica 0" in reason and "node gpu-1" in reason
    assert "liveness_timeout" in reason
    assert "estimate" not in reason  # no memory hint for a hang


# -- the prober alone, with a stand-in endpoint and a virtual clock ------------------------


class _Endpoint:
    """Answers GET /health with 200, or never (``hung``)."""

    def __init__(self) -> None:
        self.hung = False
        self.probes = 0
        self._events: dict[str, list] = {}

    async def open(self, fence, stream_id, method, path, headers, body) -> None:
        assert (method, path) == ("GET", "/health")
        self.probes += 1
        if self.hung:
            await trio.sleep_forever()
        self._events[stream_id] = [ResponseHead(status=200, headers=()), EndOfStream()]

    async def read(self, fence, stream_id):
        return self._events[stream_id].pop(0)

    async def cancel(self, fence, stream_id) -> None:
        self._events.pop(stream_id, None)


class _Nodes:
    def __init__(self, endpoint: _Endpoint) -> None:
        self._endpoint = endpoint

    def endpoint(self, node_id: str) -> _Endpoint:
        return self._endpoint

    def attempt_trouble(self, node_id: str, attempt_id: str) -> None:
        return None


class _Records:
    def __init__(self) -> None:
        self.writes: list[dict] = []

    def changed(self, service_id: str) -> None:
        pass

    async def set_attempt(self, service_id: str, attempt_id: str, **changes) -> None:
        self.writes.append(changes)


def _ready_attempt(reason: str | None = None):
    from ficc_core.inference.records import AttemptRecord, AttemptState

    workload = {"endpoint": {"paths": ["/health", "/metrics", "/v1/chat/completions"]}}
    return AttemptRecord(
        attempt_id="a-1",
        service_id="svc",
        replica=0,
        generation=1,
        number=1,
        node_id="local",
        provider="process",
        plan_digest="sha256:" + "ab" * 32,
        workload=json.dumps(workload),
        state=AttemptState.READY,
        reason=reason,
        created_at=0.0,
        updated_at=0.0,
    )


def _prober(endpoint: _Endpoint, records: _Records, table: LiveTable):
    from ficc_core.inference.reconciliation.liveness import Liveness

    return Liveness(table, _Nodes(endpoint), records, interval=10, timeout=5, misses=3)


async def test_three_missed_probes_take_it_out_and_the_grace_ends_in_a_restart(autojump_clock):
    endpoint, records, table = _Endpoint(), _Records(), LiveTable()
    table.publish(_view("a-1", "a-2"))
    prober = _prober(endpoint, records, table)
    endpoint.hung = True
    started = trio.current_time()
    seconds = await prober.follow(_ready_attempt(), grace=lambda: 4.0)
    # Probes at 0, 10, 20 each time out after 5 s: unresponsive at 25 s; the grace
    # (at least one probe's 5 s) holds it out until 30 s, then it is to be restarted.
    assert trio.current_time() - started == pytest.approx(30, abs=0.1)
    assert seconds == pytest.approx(5, abs=0.1)
    assert [r.key for r in table.get("svc").replicas] == ["a-2"]
    assert table.suspended("a-1") == "unresponsive"  # out until its attempt is released
    [out] = records.writes
    assert out["reason"] == "unresponsive" and out["health"] == "no answer"
    assert "missed 3 liveness probes in a row" in out["message"]


async def test_a_gateway_suspicion_brings_the_probes_forward(autojump_clock):
    endpoint, records, table = _Endpoint(), _Records(), LiveTable()
    table.publish(_view("a-1"))
    prober = _prober(endpoint, records, table)

    async def suspect_every_second() -> None:
        while True:
            await trio.sleep(1)
            table.suspect("a-1")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(suspect_every_second)
        await trio.sleep(0.5)
        endpoint.hung = True  # the first probe (at 0) answered
        started = trio.current_time()
        await prober.follow(_ready_attempt(), grace=lambda: 1.0)
        nursery.cancel_scope.cancel()
    # Probes back to back (one per timeout) once suspected, not one per 10 s.
    assert trio.current_time() - started < 3 * 5 + 2 + 5 + 1


async def test_one_that_answers_before_its_restart_is_put_back(autojump_clock):
    endpoint, records, table = _Endpoint(), _Records(), LiveTable()
    table.publish(_view("a-1"))
    prober = _prober(endpoint, records, table)
    endpoint.hung = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(prober.follow, _ready_attempt(), lambda: 30.0)
        await eventually(lambda: table.suspended("a-1") is not None, None, every=0.5)
        endpoint.hung = False
        await eventually(lambda: table.suspended("a-1") is None, None, every=0.5)
        nursery.cancel_scope.cancel()
    out, back = records.writes
    assert out["reason"] == "unresponsive"
    assert back["reason"] is None and back["health"] == "200"
    # Probed again at once (the probe that missed took its whole timeout), or once more
    # after one more missed probe: trio schedules the test and the prober in either order.
    again = re.search(
        r"answered its liveness probe again after ([\d.]+) s unresponsive", back["message"]
    )
    assert again and float(again[1]) in (0.0, 5.0), back["message"]


async def test_one_recorded_unresponsive_before_a_controller_restart_stays_out_until_it_answers(
    autojump_clock,
):
    endpoint, records, table = _Endpoint(), _Records(), LiveTable()
    table.publish(_view("a-1", "a-2"))
    prober = _prober(endpoint, records, table)
    endpoint.hung = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(prober.follow, _ready_attempt("unresponsive"), lambda: 30.0)
        await trio.sleep(1)
        assert [r.key for r in table.get("svc").replicas] == ["a-2"]
        endpoint.hung = False
        await eventually(lambda: table.suspended("a-1") is None, None, every=0.5)
        nursery.cancel_scope.cancel()
    [back] = records.writes
    assert back["reason"] is None
