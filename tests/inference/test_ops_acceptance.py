"""Acceptance: a move and a rollout of a real llama.cpp service under continuous traffic.

SmolLM2 on the embedded node and on a real remote ``ficc executor`` process (its
model staged over HTTP); two clients send chat completions through the gateway the
whole time, and not one of them fails. Then the remote replica's engine log is
followed with a ticket, and closing the stream ends the follow on that node.
"""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio

from ..agent.test_agent_processes import ExecutorProcess, agent_dir  # noqa: F401
from ..logs.test_logs_remote import _read_until
from ..support.inference_support import (
    llama_spec,
    open_inference_controller,
    register_smollm2,
    write_agent_settings,
)
from ..support.logs_support import sse_items
from ..support.ops_support import Traffic
from ..support.waiting import eventually


async def _under_traffic(controller, service_id: str, token: str, action, settled):
    """Run ``action()`` while two clients send requests; wait until ``settled(view)``;
    return the action's answer and the traffic."""
    traffic = Traffic(body={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(traffic.run, controller.http, service_id, token)
        await eventually(lambda: traffic.sent >= 3, None, every=0.05)
        answer = await action()
        await controller.wait_service(service_id, settled, period=0.2)
        sent = traffic.sent
        await eventually(lambda: traffic.sent >= sent + 5, None, every=0.05)
        traffic.stop.set()
    return answer, traffic


@pytest.mark.slow
@pytest.mark.deadline(610)
async def test_a_move_and_a_rollout_under_continuous_traffic_fail_no_request(
    tmp_path,
    agent_dir,  # noqa: F811
):
    settings_file = write_agent_settings(tmp_path)
    with trio.fail_after(600):
        async with open_inference_controller(tmp_path) as controller:
            _, credential = await controller.service.contributors.add_node("gpu-1")
            executor = ExecutorProcess(
                controller.url, credential, agent_dir, "--agent-config", str(settings_file)
            )
            try:
                await executor.wait_connected()
                node = await controller.wait_node("gpu-1")
                while not node["snapshot"] or not node["snapshot"]["runtimes"]:
                    node = await controller.node("gpu-1")
                model_id = await register_smollm2(controller)
                spec = await llama_spec(controller, model_id, node_ids=("local", "local"), cpus=0.5)
                created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
                service_id = created["id"]
                assert (await controller.control(service_id, "start")).status_code == 200
                ready = await controller.wait_service(service_id, lambda v: v["state"] == "ready")
                issued = await controller.ok(
                    "POST",
                    f"/api/v1/inference/{service_id}/tokens",
                    status=201,
                    json={"lifetime": 600},
                )

                async def move():
                    return await controller.call(
                        "POST",
                        f"/api/v1/inference/{service_id}/replicas/1/move",
                        json={"target_node_id": "gpu-1"},
                    )

                response, traffic = await _under_traffic(
                    controller,
                    service_id,
                    issued["token"],
                    move,
                    lambda v: v["spec"]["placements"][1]["node_id"] == "gpu-1",
                )
                assert response.status_code == 200, response.text
                assert response.json()["final_state"] == "moved", response.json()
                assert traffic.failures == [], traffic.failures
                moved = await controller.ok("GET", f"/api/v1/inference/{service_id}")

                next_spec = {
                    **moved["spec"],
                    "context": 1024,
                    "placements": [
                        *moved["spec"]["placements"],
                        moved["spec"]["placements"][1],
                    ],
                }

                async def rollout():
                    return await controller.call(
                        "POST",
                        f"/api/v1/inference/{service_id}/rollout",
                        json={"revision": moved["revision"], "spec": next_spec},
                    )

                response, traffic = await _under_traffic(
                    controller,
                    service_id,
                    issued["token"],
                    rollout,
                    lambda v: v["generation"] > ready["generation"] and v["state"] == "ready",
                )
                assert response.status_code == 202, response.text
                assert traffic.failures == [], traffic.failures
                after = await controller.ok("GET", f"/api/v1/inference/{service_id}")
                assert after["spec"]["context"] == 1024
                assert [p["node_id"] for p in after["spec"]["placements"]] == [
                    "local",
                    "gpu-1",
                    "gpu-1",
                ]
                assert len(controller.service.live.get(service_id).replicas) == 3

                await _follow_remote_log(controller, executor, service_id, replica=1)
                assert (await controller.control(service_id, "stop")).status_code == 200
                await controller.wait_service(service_id, lambda v: v["state"] == "stopped")
            finally:
                executor.kill()


async def _follow_remote_log(controller, executor, service_id: str, replica: int) -> None:
    """Follow a replica's real llama.cpp log on the remote node with a ticket: its last
    lines arrive; the ticket opens one stream only; closing it ends the node's follow."""
    base = f"/api/v1/inference/{service_id}/replicas/{replica}/logs"
    snapshot = await controller.ok("GET", base, params={"tail": 1000})
    assert snapshot["node_id"] == "gpu-1", snapshot
    assert any("ficc-llama-server" in line for line in snapshot["lines"]), snapshot["lines"]
    attempt_id = snapshot["attempt_id"]
    tail = min(5, len(snapshot["lines"]))
    ticket = (await controller.ok("POST", base + "/ticket"))["ticket"]
    params = {"ticket": ticket, "tail": tail}
    async with controller.http.stream("GET", base + "/stream", params=params) as opened:
        assert opened.status_code == 200
        assert opened.headers["content-type"].startswith("text/event-stream")
        lines = []
        async with aclosing(sse_items(opened)) as items:
            with trio.fail_after(30):
                async for kind, value in items:
                    if kind == "data":
                        lines.append(value)
                    if len(lines) == tail:
                        break
        await _read_until(executor.proc.stderr, f"following the log of attempt {attempt_id}")
    # The stream's last lines are the log's (the engine is idle: no new ones meanwhile).
    assert lines == snapshot["lines"][-tail:]
    await _read_until(executor.proc.stderr, f"stopped following the log of attempt {attempt_id}")
    reused = await controller.http.get(base + "/stream", params=params)
    assert reused.status_code == 401, reused.text
    assert reused.json()["error"]["code"] == "ticket_invalid"
