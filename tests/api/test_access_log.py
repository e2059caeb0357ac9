"""The access log: a line per request (management and invoke) with who asked, the
service, replica, node and tokens; ``--log-format json`` as one JSON object per line."""

from __future__ import annotations

import json
import logging
import os

import pytest
import trio

from ficc_core.cli.logs import JsonFormatter

from ..support.inference_support import (
    llama_spec,
    open_inference_controller,
    register_gguf,
    standin_engine,
)
from ..support.models_support import tiny_gguf


def _lines(caplog) -> list[dict]:
    return [r.fields for r in caplog.records if r.name == "ficc.access"]


@pytest.mark.deadline(130)
async def test_management_and_invoke_requests_each_get_one_access_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ficc.access")
    engine, settings = standin_engine(tmp_path)
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            tiny_gguf(tmp_path / "tiny.gguf", size=64 << 10)
            model_id = await register_gguf(controller, tmp_path / "tiny.gguf", "tiny")
            spec = await llama_spec(controller, model_id, alias="tiny-chat", memory_bytes=256 << 20)
            spec["image_executable"] = str(engine)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            await controller.wait_service(service_id, lambda v: v["state"] == "ready")
            issued = await controller.ok(
                "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 60}
            )
            caplog.clear()
            await controller.ok("GET", "/api/v1/models")
            answer = await controller.http.post(
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                headers={"Authorization": f"Bearer {issued['token']}"},
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            )
            assert answer.status_code == 200, answer.text
            refused = await controller.http.post(
                f"/api/v1/inference/{service_id}/v1/chat/completions",
                headers={"Authorization": "Bearer ficc_nonsense"},
                json={"messages": [{"role": "user", "content": "hi"}]},
            )
            assert refused.status_code == 401
    listing, invoked, unauthenticated = _lines(caplog)[:3]
    assert listing["method"] == "GET" and listing["path"] == "/api/v1/models"
    assert listing["status"] == 200 and listing["credential"] == "operator"
    assert listing["duration_ms"] >= 0 and "service" not in listing
    usage = answer.json()["usage"]
    assert invoked["path"] == f"/api/v1/inference/{service_id}/v1/chat/completions"
    assert (invoked["status"], invoked["service"], invoked["replica"], invoked["node"]) == (
        200,
        "tiny-chat",
        0,
        "local",
    )
    assert invoked["credential"] == issued["credential"]["name"]
    assert invoked["prompt_tokens"] == usage["prompt_tokens"]
    assert invoked["completion_tokens"] == usage["completion_tokens"]
    assert unauthenticated["status"] == 401 and "credential" not in unauthenticated
    # The text form says the same, with no prompt in it.
    [text] = [r.getMessage() for r in caplog.records if r.fields is invoked]
    assert "service=tiny-chat replica=0 node=local" in text and "hi" not in text.split()


def test_json_lines_carry_the_fields_beside_time_level_and_message():
    record = logging.LogRecord("ficc.access", logging.INFO, __file__, 1, "GET / 200", (), None)
    record.fields = {"method": "GET", "path": "/", "status": 200, "duration_ms": 1.5}
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "info" and line["logger"] == "ficc.access"
    assert line["message"] == "GET / 200" and line["status"] == 200
    assert line["time"].endswith("Z")


@pytest.mark.deadline(60)
async def test_ficc_serve_with_log_format_json_writes_json_lines(tmp_path):
    import httpx

    from ..support.ha_support import ControllerProcess

    env = {**os.environ, "FICC_DATA_DIR": str(tmp_path / "data"), "FICC_LOG_FORMAT": "json"}
    env["FICC_EMBEDDED_AGENT"] = "false"
    env.pop("FICC_CONFIG", None)
    server = ControllerProcess(env, tmp_path / "serve.log")
    try:
        url = await server.start()
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/api/v1/health")).status_code == 200
    finally:
        server.stop()
    lines = [line for line in server.output().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    [health] = [r for r in records if r.get("path") == "/api/v1/health"]
    assert (health["logger"], health["status"], health["method"]) == ("ficc.access", 200, "GET")
