"""Faults: a lost node leaves an unknown replica; a restarted controller adopts, not duplicates.

Both use a remote node with the real llama.cpp runtime and SmolLM2, staged over
HTTP from the controller's blob store.
"""

from __future__ import annotations

import logging
import signal

import pytest
import trio

from ficc_core.agent import Agent
from ficc_core.agent.remote import RemoteAgent
from ficc_core.agent.runtimes import AgentSettings

from ..agent.test_agent_processes import ExecutorProcess, _alive, _engine_pids, agent_dir  # noqa: F401
from ..support.agent_support import controller_missed
from ..support.inference_support import (
    llama_spec,
    open_inference_controller,
    register_smollm2,
    write_agent_settings,
)
from ..support.waiting import eventually

FAST_NODES = {"unreachable_after": "1s", "lost_after": "3s", "heartbeat_interval": "200ms"}


async def _ready_on(controller, node_id: str) -> tuple[str, dict]:
    """Once the node reports its runtime, start a SmolLM2 service there; wait for ready."""
    node = await controller.wait_node(node_id)
    while not node["snapshot"] or not node["snapshot"]["runtimes"]:
        node = await controller.node(node_id)
    model_id = await register_smollm2(controller)
    spec = await llama_spec(controller, model_id, node_ids=(node_id,))
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    assert (await controller.control(created["id"], "start")).status_code == 200
    return created["id"], await controller.wait_service(created["id"], _state("ready"))


def _state(*states: str):
    return lambda view: view["state"] in states


async def _lose_and_stop(controller, folder, settings_file) -> dict:
    """A SmolLM2 service on remote node gpu-1 whose executor is SIGKILLed, then stopped.

    Returns the node credential, the service, its ready view, the lost attempt, the
    engine's pid and the stopped view (the lost replica still ``unknown``).
    """
    _, credential = await controller.service.contributors.add_node("gpu-1")
    executor = ExecutorProcess(
        controller.url, credential, folder, "--agent-config", str(settings_file)
    )
    try:
        await executor.wait_connected()
        service_id, ready = await _ready_on(controller, "gpu-1")
        lost_attempt = ready["replicas"][0]["attempt_id"]
        [engine_pid] = _engine_pids(folder)
        # The node's agent dies; its engine's fate is unknown to the controller.
        executor.proc.send_signal(signal.SIGKILL)
    finally:
        executor.kill()
    # The service's own state follows its replica's: once both show it, nothing else
    # is written before the stop (which names the revision read).
    view = await controller.wait_service(
        service_id, lambda v: v["replicas"][0]["state"] == "unknown" and v["state"] == "unknown"
    )
    assert view["replicas"][0]["reason"] == "node_lost"
    assert view["unknown_attempts"] == [lost_attempt]
    assert controller.service.live.get(service_id).replicas == ()

    # Stop cannot confirm the unknown attempt's end: the service stops, the
    # unknown replica keeps its reservation.
    assert (await controller.control(service_id, "stop")).status_code == 200
    stopped = await controller.wait_service(service_id, _state("stopped"))
    assert stopped["replicas"][0]["state"] == "unknown"
    assert stopped["replicas"][0]["reservation"] is not None
    assert "1 replica(s) have an unknown outcome" in stopped["reason"]
    return {
        "credential": credential,
        "service_id": service_id,
        "ready": ready,
        "lost_attempt": lost_attempt,
        "engine_pid": engine_pid,
        "stopped": stopped,
    }


@pytest.mark.slow
@pytest.mark.deadline(190)
async def test_a_killed_executor_leaves_an_unknown_replica_that_start_refuses_until_acknowledged(
    tmp_path,
    agent_dir,  # noqa: F811
):
    settings_file = write_agent_settings(tmp_path)
    executor = None
    try:
        with trio.fail_after(180):
            async with open_inference_controller(
                tmp_path, embedded=False, **FAST_NODES
            ) as controller:
                lost = await _lose_and_stop(controller, agent_dir, settings_file)
                credential, service_id = lost["credential"], lost["service_id"]
                ready, stopped = lost["ready"], lost["stopped"]
                lost_attempt, engine_pid = lost["lost_attempt"], lost["engine_pid"]

                # start without acknowledgement: 409 before any replica is retried.
                response = await controller.control(service_id, "start")
                assert response.status_code == 409, response.text
                error = response.json()["error"]
                assert error["code"] == "inference_unknown_outcome"
                assert [a["attempt_id"] for a in error["details"]["attempts"]] == [lost_attempt]
                # Acknowledgement belongs to start alone.
                response = await controller.control(service_id, "stop", acknowledge_unknown=True)
                assert response.status_code == 400
                assert response.json()["error"]["code"] == "acknowledge_not_allowed"
                after = await controller.ok("GET", f"/api/v1/inference/{service_id}")
                assert after["revision"] == stopped["revision"]
                assert [a["attempt_id"] for a in (await controller.node("gpu-1"))["attempts"]] == [
                    lost_attempt
                ]

                # The node comes back (its restarted agent ends what the old one left).
                executor = ExecutorProcess(
                    controller.url, credential, agent_dir, "--agent-config", str(settings_file)
                )
                await executor.wait_connected()
                await controller.wait_node("gpu-1")
                # Reconciling the node's first report may move the revision between the
                # read and the start: a client reads it again and retries, as this does.
                for _ in range(5):
                    response = await controller.control(
                        service_id, "start", acknowledge_unknown=True
                    )
                    if response.status_code != 409 or "stale_revision" not in response.text:
                        break
                assert response.status_code == 200, response.text
                assert response.json()["generation"] == ready["generation"] + 1
                again = await controller.wait_service(service_id, _state("ready"))
                new_attempt = again["replicas"][0]["attempt_id"]
                assert new_attempt != lost_attempt
                assert again["unknown_attempts"] == []
                # A new attempt, a new engine: the old one was never resumed.
                [new_pid] = _engine_pids(agent_dir)
                assert new_pid != engine_pid
                # Nothing was replayed: the new engine has served no request.
                metrics = await _engine_metrics(controller, again)
                assert "llamacpp:requests_processing 0" in metrics
                assert "llamacpp:n_decode_total 0" in metrics or "n_decode_total" not in metrics

                assert (await controller.control(service_id, "stop")).status_code == 200
                await controller.wait_service(service_id, _state("stopped"))
    finally:
        if executor is not None:
            executor.kill()


@pytest.mark.slow
@pytest.mark.deadline(190)
async def test_a_resolved_unknown_outcome_leaves_no_reason_behind_and_a_plain_start_works(
    tmp_path,
    agent_dir,  # noqa: F811
):
    settings_file = write_agent_settings(tmp_path)
    executor = None
    try:
        with trio.fail_after(180):
            async with open_inference_controller(
                tmp_path, embedded=False, **FAST_NODES
            ) as controller:
                lost = await _lose_and_stop(controller, agent_dir, settings_file)
                service_id = lost["service_id"]

                # The executor restarts: the replica resolves by itself, with no start.
                executor = ExecutorProcess(
                    controller.url,
                    lost["credential"],
                    agent_dir,
                    "--agent-config",
                    str(settings_file),
                )
                await executor.wait_connected()
                resolved = await controller.wait_service(
                    service_id, lambda v: v["unknown_attempts"] == []
                )
                assert resolved["replicas"][0]["state"] == "stopped"
                assert resolved["replicas"][0]["reason"] == "not_running_after_reconnect"
                assert resolved["state"] == "stopped"
                assert resolved["reason"] is None
                assert not _alive(lost["engine_pid"])

                response = await controller.control(service_id, "start")
                assert response.status_code == 200, response.text
                await controller.wait_service(service_id, _state("ready"))
                assert (await controller.control(service_id, "stop")).status_code == 200
                await controller.wait_service(service_id, _state("stopped"))
    finally:
        if executor is not None:
            executor.kill()


async def _engine_metrics(controller, view: dict) -> str:
    from ficc_core.schema import Fence
    from ficc_core.testing.executor_kit import exchange

    replica = view["replicas"][0]
    fence = Fence(
        attempt_id=replica["attempt_id"],
        generation=replica["generation"],
        plan_digest=replica["plan_digest"],
    )
    endpoint = controller.service.contributors.endpoint(replica["node_id"])
    status, _, chunks = await exchange(endpoint, fence, "GET", "/metrics")
    assert status == 200
    return b"".join(chunks).decode()


def _remote_agent_factory(folder, settings_file):
    from ficc_executor_process.provider import ProcessProvider

    async def no_gpus():
        return ()

    def make(named: str) -> Agent:
        return Agent(
            node_id=named,
            providers={"process": ProcessProvider(state_dir=folder / "p", default_grace=2.0)},
            state_dir=folder,
            settings=AgentSettings.load(settings_file),
            gpu_query=no_gpus,
            stop_grace=2.0,
        )

    return make


@pytest.mark.slow
@pytest.mark.deadline(190)
async def test_a_restarted_controller_adopts_the_running_replica_instead_of_launching_another(
    tmp_path,
    agent_dir,  # noqa: F811
    caplog,
):
    caplog.set_level(logging.WARNING, logger="ficc.agent")
    settings_file = write_agent_settings(tmp_path)
    with trio.fail_after(180):
        async with open_inference_controller(tmp_path, embedded=False) as controller:
            _, credential = await controller.service.contributors.add_node("gpu-1")
            port = controller.url.rsplit(":", 1)[1]
            url = controller.url
        remote = RemoteAgent(
            url,
            credential,
            _remote_agent_factory(agent_dir, settings_file),
            backoff_initial=0.1,
            backoff_max=0.5,
        )
        async with trio.open_nursery() as nursery:
            async with open_inference_controller(tmp_path, embedded=False, port=port) as controller:
                await nursery.start(remote.run)
                service_id, ready = await _ready_on(controller, "gpu-1")
                attempt = ready["replicas"][0]["attempt_id"]
                [engine_pid] = _engine_pids(agent_dir)

            # The controller is gone; the node keeps its engine (its lease outlives this).
            await controller_missed(caplog, dials=2)
            assert _alive(engine_pid)
            async with open_inference_controller(tmp_path, embedded=False, port=port) as controller:
                await eventually(
                    lambda: controller.service.contributors.connected_here("gpu-1"),
                    None,
                    every=0.05,
                )
                view = await controller.wait_service(
                    service_id,
                    lambda v: (
                        v["state"] == "ready"
                        and controller.service.live.get(service_id) is not None
                        and bool(controller.service.live.get(service_id).replicas)
                    ),
                )
                assert view["replicas"][0]["attempt_id"] == attempt
                assert view["replicas"][0]["attempt"] == 1
                assert view["generation"] == ready["generation"]
                # Still the one engine: adopted, not duplicated.
                assert _engine_pids(agent_dir) == [engine_pid]
                [live] = controller.service.live.get(service_id).replicas
                assert live.fence.attempt_id == attempt
                # What the adopted engine serves is known without relaunching it.
                assert controller.service.live.get(service_id).capabilities == (
                    "chat",
                    "completions",
                    "streaming",
                    "tokenize.llama_cpp",
                )
                await _engine_metrics(controller, view)

                assert (await controller.control(service_id, "stop")).status_code == 200
                await controller.wait_service(service_id, _state("stopped"))
                assert not _alive(engine_pid)
            nursery.cancel_scope.cancel()


@pytest.mark.deadline(190)
async def test_restarting_ficc_serve_stops_the_embedded_replica_and_starts_it_again(tmp_path):
    # Every `ficc serve` starts a fresh embedded agent, which runs nothing the last one
    # ran: the node stopped those engines, none failed. They used to end `failed`
    # (not_reported): the service went `failed` at each restart and, once the restarts
    # outnumbered replica_give_up_after, gave up for good.
    settings = {"replica_give_up_after": 2}
    with trio.fail_after(180):
        async with open_inference_controller(tmp_path, **settings) as controller:
            service_id, _ = await _ready_on(controller, "local")
        for number in (2, 3, 4):
            async with open_inference_controller(tmp_path, **settings) as controller:
                # The service's stored state may still say ready for a moment at start
                # (before the old attempt is judged): wait for the new attempt's own.
                await controller.wait_service(
                    service_id,
                    lambda v, n=number: (
                        v["state"] == "ready"
                        and v["replicas"][0]["attempt"] == n
                        and v["replicas"][0]["state"] == "ready"
                    ),
                )
                page = await controller.ok(
                    "GET", f"/api/v1/inference/{service_id}/events", params={"limit": 500}
                )
        events = page["events"]
        states = [e["message"] for e in events if e["kind"] == "service.state"]
        assert not [m for m in states if "→ failed" in m], states
        ended = [e for e in events if e["kind"] == "attempt.state" and "released" in e["message"]]
        assert len(ended) == 3, [e["message"] for e in ended]
        for event in ended:
            assert event["reason"] == "not_reported" and "→ stopped" in event["message"], event
