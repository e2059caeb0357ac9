"""While the database is down, a controller serves its ready replicas and loses nothing.

A real controller (its background tasks, an embedded agent, the stand-in engine as
the llama_server runtime, a tiny GGUF) on a real SQLite file, whose store the
switch of :mod:`.store_faults` takes down for longer than a node takes to be lost
(``lost_after`` is two seconds here): invoke requests with a credential used before
keep succeeding, a credential never seen gets 503 ``store_unavailable`` with
``Retry-After`` (never 401), management routes get the same 503, and once the store
answers again the usage of every request is there, the node was never unreachable
or lost, the replica was never failed, and a service created then is placed.
"""

from __future__ import annotations

import pytest
import trio

from ..agent.test_agent_processes import ExecutorProcess, agent_dir  # noqa: F401
from ..support.inference_support import (
    llama_spec,
    open_inference_controller,
    register_gguf,
    standin_engine,
)
from ..support.models_support import tiny_gguf
from ..support.store_faults import store_outage
from ..support.waiting import eventually

#: Short node timeouts, so that an outage of a few seconds outlasts them.
NODE_TIMEOUTS = {"unreachable_after": "1s", "lost_after": "2s", "usage_flush_interval": "100ms"}
#: How long the store stays down: longer than lost_after plus a sweep.
OUTAGE_SECONDS = 3.5


def _chat(alias: str) -> dict:
    return {
        "model": alias,
        "messages": [{"role": "user", "content": "say some words please"}],
        "standin_deltas": 2,
    }


async def _standin_service(controller, model_id: str, engine, alias: str) -> str:
    spec = await llama_spec(controller, model_id, alias=alias, memory_bytes=256 << 20)
    spec["image_executable"] = str(engine)
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    assert (await controller.control(created["id"], "start")).status_code == 200
    await controller.wait_service(
        created["id"],
        lambda v: v["state"] == "ready" and controller.service.live.get(created["id"]).replicas,
    )
    return created["id"]


async def _events(service, reasons: tuple[str, ...]) -> list[dict]:
    marks = ",".join("?" * len(reasons))
    return await service.store.read(
        lambda tx: tx.fetch_all(
            f"SELECT reason, message FROM events WHERE reason IN ({marks})", reasons
        )
    )


@pytest.mark.deadline(130)
async def test_an_outage_is_served_from_memory_and_nothing_is_lost_when_it_ends(tmp_path):
    engine, settings = standin_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(
            tmp_path, agent_config=str(settings), **NODE_TIMEOUTS
        ) as controller:
            service = controller.service
            tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
            model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
            service_id = await _standin_service(controller, model_id, engine, "smol")
            [attempt] = [r.key for r in service.live.get(service_id).replicas]
            path = f"/api/v1/inference/{service_id}/v1/chat/completions"
            issued = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 600}
            )
            token, credential_id = issued["token"], issued["credential"]["id"]
            never_used = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 600}
            )
            made = 0
            for _ in range(3):
                ok = await controller.call("POST", path, token=token, json=_chat("smol"))
                assert ok.status_code == 200, ok.text
                made += 1

            with store_outage(service.store) as outage:
                outage.down = True
                began = trio.current_time()
                while trio.current_time() - began < OUTAGE_SECONDS:
                    with trio.fail_after(2):  # a known credential waits for no store
                        served = await controller.call(
                            "POST", path, token=token, json=_chat("smol")
                        )
                    assert served.status_code == 200, served.text
                    made += 1
                    await trio.sleep(0.1)
                # A credential never verified here: the store must say; it cannot, so 503.
                unknown = await controller.call(
                    "POST", path, token=never_used["token"], json=_chat("smol")
                )
                assert unknown.status_code == 503, unknown.text
                assert unknown.json()["error"]["code"] == "store_unavailable"
                assert int(unknown.headers["Retry-After"]) >= 1
                # A management route reads the store: 503 with Retry-After, the envelope.
                listed = await controller.call("GET", "/api/v1/inference")
                assert listed.status_code == 503, listed.text
                assert listed.json()["error"]["code"] == "store_unavailable"
                assert int(listed.headers["Retry-After"]) >= 1
                created = await controller.call(
                    "POST", f"/api/v1/inference/{service_id}/tokens", json={"lifetime": 600}
                )
                assert created.status_code == 503
                assert service.usage.failures > 0 and outage.refused > 0

            # The store answers: every request's usage is written, and the credential
            # never seen is known now.
            with trio.fail_after(30):
                await eventually(lambda: not service.usage.buffered, None, every=0.05)
            report = await controller.ok(
                "GET", "/api/v1/usage", params={"service": service_id, "group_by": "key"}
            )
            [group] = [g for g in report["groups"] if g["key"]["id"] == credential_id]
            assert group["requests"] == made and group["errors"] == 0
            assert service.usage.dropped == 0
            later = await controller.call(
                "POST", path, token=never_used["token"], json=_chat("smol")
            )
            assert later.status_code == 200, later.text

            # The outage was not the node's silence, nor the replica's failure.
            node = await controller.node("local")
            assert node["state"] == "connected"
            assert await _events(service, ("no_heartbeat", "node_lost")) == []
            view = await controller.ok("GET", f"/api/v1/inference/{service_id}")
            assert view["state"] == "ready"
            assert [r.key for r in service.live.get(service_id).replicas] == [attempt]

            # Every background loop lives on: a service created now is placed and serves.
            second = await _standin_service(controller, model_id, engine, "smol-2")
            response = await controller.call(
                "POST",
                f"/api/v1/inference/{second}/v1/chat/completions",
                json=_chat("smol-2"),
            )
            assert response.status_code == 200, response.text


@pytest.mark.deadline(130)
async def test_a_remote_nodes_relayed_requests_flow_while_the_store_does_not_answer(
    tmp_path,
    agent_dir,  # noqa: F811
):
    """A store that hangs (no answer at all, as a database host gone from the network):
    the remote node's heartbeats wait for it beside its connection, never in front of
    the relayed streams, and a known credential waits for it at most once."""
    engine, settings = standin_engine(tmp_path)
    executor = None
    try:
        with trio.fail_after(120):
            async with open_inference_controller(
                tmp_path, embedded=False, **NODE_TIMEOUTS
            ) as controller:
                service = controller.service
                _, credential = await service.contributors.add_node("gpu-1")
                executor = ExecutorProcess(
                    controller.url, credential, agent_dir, "--agent-config", str(settings)
                )
                await executor.wait_connected()
                node = await controller.wait_node("gpu-1")
                while not node["snapshot"] or not node["snapshot"]["runtimes"]:
                    node = await controller.node("gpu-1")
                tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
                model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
                spec = await llama_spec(
                    controller, model_id, node_ids=("gpu-1",), memory_bytes=256 << 20
                )
                spec["image_executable"] = str(engine)
                created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
                service_id = created["id"]
                assert (await controller.control(service_id, "start")).status_code == 200
                await controller.wait_service(
                    service_id,
                    lambda v: v["state"] == "ready" and service.live.get(service_id).replicas,
                )
                path = f"/api/v1/inference/{service_id}/v1/chat/completions"
                made = 0
                for _ in range(2):
                    ok = await controller.call("POST", path, json=_chat("smol"))
                    assert ok.status_code == 200, ok.text
                    made += 1

                with store_outage(service.store) as outage:
                    outage.down, outage.hang = True, True
                    began = trio.current_time()
                    slow = 0
                    while trio.current_time() - began < OUTAGE_SECONDS:
                        asked = trio.current_time()
                        with trio.fail_after(5):
                            served = await controller.call("POST", path, json=_chat("smol"))
                        assert served.status_code == 200, served.text
                        made += 1
                        slow += trio.current_time() - asked > 1
                        await trio.sleep(0.1)
                    # At most the check that found the store silent waited for it.
                    assert slow <= 1, slow

                with trio.fail_after(30):
                    await eventually(lambda: not service.usage.buffered, None, every=0.05)
                report = await controller.ok(
                    "GET", "/api/v1/usage", params={"service": service_id, "group_by": "key"}
                )
                assert sum(g["requests"] for g in report["groups"]) == made
                assert (await controller.node("gpu-1"))["state"] == "connected"
                assert await _events(service, ("no_heartbeat", "node_lost")) == []
    finally:
        if executor is not None:
            executor.kill()
