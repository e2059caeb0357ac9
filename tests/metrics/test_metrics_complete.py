"""/metrics during a real-engine run: state gauges with aliases and nodes, node resources,
engine load, per-request figures; per-replica series stay bounded as attempts come and go."""

from __future__ import annotations

import re

import pytest
import trio

from ficc_core.controller.metrics import Metrics
from ficc_core.gateway.accounting import SERIES_KEPT, Accounting

from ..support.inference_support import open_inference_controller, ready_service, register_smollm2


def _samples(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of ``name``'s samples with value 1 (gauges) or any value."""
    found = []
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            labels["value"] = match.group(2)
            found.append(labels)
    return found


@pytest.mark.slow
@pytest.mark.deadline(310)
async def test_a_scrape_during_a_real_engine_run_has_every_series_with_alias_labels(tmp_path):
    with trio.fail_after(300):
        async with open_inference_controller(tmp_path, metrics_state_interval="0.2s") as controller:
            model_id = await register_smollm2(controller)
            service_id, token, _ = await ready_service(controller, model_id, alias="smol")
            answer = await controller.http.post(
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                headers={"Authorization": f"Bearer {token}"},
                json={"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8},
            )
            assert answer.status_code == 200, answer.text
            while True:
                text = (await controller.http.get("/metrics")).text
                states = _samples(text, "ficc_replica_state")
                if any(s["state"] == "ready" for s in states) and _samples(
                    text, "ficc_gateway_engine_running_requests"
                ):
                    break
                await trio.sleep(0.1)

    [service] = _samples(text, "ficc_service_state")
    assert (service["service"], service["alias"], service["state"]) == (service_id, "smol", "ready")
    [replica] = states
    assert (replica["alias"], replica["index"], replica["node"]) == ("smol", "0", "local")
    replicas = {s["kind"]: s["value"] for s in _samples(text, "ficc_service_replicas")}
    assert replicas == {"desired": "1.0", "ready": "1.0"}
    [info] = _samples(text, "ficc_replica_info")
    assert (info["alias"], info["index"], info["node"]) == ("smol", "0", "local")
    attempt = info["replica"]
    assert {"node": "local", "state": "connected", "value": "1.0"} in _samples(
        text, "ficc_node_state"
    )
    assert _samples(text, "ficc_node_heartbeat_age_seconds")
    memory = {s["kind"]: float(s["value"]) for s in _samples(text, "ficc_node_memory_bytes")}
    assert memory["reserved"] == 1024**3 and memory["capacity"] > memory["reserved"]
    cpus = {s["kind"]: float(s["value"]) for s in _samples(text, "ficc_node_cpus")}
    assert cpus["reserved"] == 1.0
    # The request's own figures, per replica (its attempt, which replica_info names).
    for name in (
        "ficc_gateway_requests_total",
        "ficc_gateway_time_to_first_byte_seconds_count",
        "ficc_gateway_request_duration_seconds_count",
        "ficc_gateway_output_tokens_per_second_count",
    ):
        assert [s["replica"] for s in _samples(text, name)] == [attempt], name
    tokens = {s["kind"]: float(s["value"]) for s in _samples(text, "ficc_gateway_tokens_total")}
    assert tokens["completion"] == answer.json()["usage"]["completion_tokens"]
    # The engine's own load, as the router scraped it, per replica.
    assert [s["replica"] for s in _samples(text, "ficc_gateway_engine_running_requests")] == [
        attempt
    ]
    assert "ficc_usage_dropped_total" in text
    # This controller holds the lease (alone on its store), at its first term.
    assert [s["value"] for s in _samples(text, "ficc_controller_leader")] == ["1.0"]
    assert [s["value"] for s in _samples(text, "ficc_controller_term")] == ["1.0"]
    assert _samples(text, "ficc_model_transfer_bytes") == []  # the upload is verified


async def test_a_departed_replicas_series_go_after_they_were_kept(autojump_clock):
    metrics = Metrics()
    accounting = Accounting(metrics)
    accounting.series("svc", "a1").requests.inc()
    metrics.gateway_tokens.labels("svc", "a1", "completion").inc(5)
    accounting.series("svc", "a2").requests.inc()

    def shown() -> set[str]:
        text = metrics.render()[0].decode()
        return set(re.findall(r'ficc_gateway_\w+\{[^}]*replica="(a\d)"', text))

    accounting.forget_departed({"a2"})
    await trio.sleep(SERIES_KEPT - 1)
    accounting.forget_departed({"a2"})
    assert shown() == {"a1", "a2"}  # still kept: scrapes see its last counts
    await trio.sleep(2)
    accounting.forget_departed({"a2"})
    assert shown() == {"a2"}


@pytest.mark.deadline(130)
async def test_state_series_follow_the_store_and_go_with_what_they_describe(tmp_path):
    from ..support.inference_support import llama_spec, register_gguf
    from ..support.models_support import tiny_gguf

    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, metrics_state_interval="0.1s") as controller:
            tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
            model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
            spec = await llama_spec(controller, model_id, alias="held", memory_bytes=256 << 20)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)

            async def scrape(name: str) -> list[dict[str, str]]:
                return _samples((await controller.http.get("/metrics")).text, name)

            while not await scrape("ficc_service_state"):  # noqa: ASYNC110
                await trio.sleep(0.05)
            [state] = await scrape("ficc_service_state")
            assert (state["alias"], state["state"]) == ("held", "stopped")
            [stopped] = await scrape("ficc_replica_state")
            assert (stopped["index"], stopped["node"], stopped["state"]) == (
                "0",
                "local",
                "stopped",
            )
            memory = {s["kind"]: float(s["value"]) for s in await scrape("ficc_node_memory_bytes")}
            assert memory["reserved"] == 256 << 20  # a stopped service holds its reservation
            assert (await controller.control(created["id"], "remove")).status_code == 200
            while await scrape("ficc_service_state"):  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert await scrape("ficc_replica_state") == []
