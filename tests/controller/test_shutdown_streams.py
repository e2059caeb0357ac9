"""SIGTERM with streams open: they keep streaming through the shutdown grace, then each gets a
last SSE event ``{"error": {"code": "server_shutting_down", ...}}`` and a clean end of
stream, so the ``openai`` client raises an ``APIError`` with that code, not a connection error;
a request still queued for a slot is answered 503 with the same code, and a replica's live
log stream ends with an ``error`` event carrying it.

A real ``ficc serve`` subprocess, its embedded agent and a managed llama_cpp service whose
runtime is a stand-in for ``llama-server`` (the stand-in engine, streaming one delta every
50 ms for a minute): nothing here is faked but the engine.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import trio

from ..support.gateway_support import sse_events
from ..support.models_support import random_bytes
from ..support.serve_support import ServeProcess

GRACE = 1.0

_FAKE_LLAMA_SERVER = """#!{python}
# A stand-in for `llama-server --host <socket> --alias <name> ...`: the stand-in engine there.
import os, sys
argv = sys.argv[1:]
sock, alias = argv[argv.index("--host") + 1], argv[argv.index("--alias") + 1]
os.execv(sys.executable, [sys.executable, "-m", "ficc_core.testing.standin_engine",
                          "--socket", sock, "--alias", alias])
"""


def _fake_llama_server(folder: Path) -> Path:
    """The stand-in ``llama-server`` and the agent settings declaring it as llama_server."""
    engine = folder / "llama-server"
    engine.write_text(_FAKE_LLAMA_SERVER.format(python=sys.executable))
    engine.chmod(0o755)
    digest = "sha256:" + hashlib.sha256(engine.read_bytes()).hexdigest()
    settings = folder / "agent.toml"
    settings.write_text(
        '[[runtimes]]\nname = "llama_server"\nprovider = "process"\n'
        f'image_digest = "{digest}"\nexecutable = "{engine}"\nengines = ["llama_cpp"]\n'
    )
    return settings


async def _ready_service(http: httpx.AsyncClient) -> str:
    """Register a tiny GGUF, create and start a stand-in llama_cpp service; return its ID."""
    content = random_bytes(4096, seed=17)
    manifest = {
        "name": "tiny",
        "format": "gguf",
        "files": [
            {"path": "t.gguf", "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
        ],
    }
    model = (await http.post("/api/v1/models", json=manifest)).json()
    uploaded = await http.post(
        f"/api/v1/models/{model['id']}/files/0/bytes",
        params={"offset": 0},
        content=content,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert uploaded.status_code in (200, 201), uploaded.text
    while (await http.get(f"/api/v1/models/{model['id']}")).json()["state"] != "verified":  # noqa: ASYNC110
        await trio.sleep(0.05)
    while not (await http.get("/api/v1/contributors/local")).json().get("snapshot"):  # noqa: ASYNC110
        await trio.sleep(0.05)
    partial = {
        "alias": "standin",
        "model_id": model["id"],
        "engine": "llama_cpp",
        "context": 512,
        "concurrency": 2,
        "placements": [{"node_id": "local", "limits": {"cpus": 1, "memory_bytes": 1 << 30}}],
    }
    preview = await http.post("/api/v1/inference/preview", json=partial)
    assert preview.status_code == 200, preview.text
    created = await http.post("/api/v1/inference", json=preview.json()["spec"])
    assert created.status_code == 201, created.text
    service = created.json()
    started = await http.post(
        f"/api/v1/inference/{service['id']}/control/start", json={"revision": service["revision"]}
    )
    assert started.status_code == 200, started.text
    while (await http.get(f"/api/v1/inference/{service['id']}")).json()["state"] != "ready":  # noqa: ASYNC110
        await trio.sleep(0.05)
    return service["id"]


async def _wait_queued(http: httpx.AsyncClient, service_id: str) -> None:
    """Until the gateway's queue gauge shows one request of the service waiting."""
    line = f'ficc_gateway_queued_requests{{service="{service_id}"}} 1.0'
    while line not in (await http.get("/metrics")).text:  # noqa: ASYNC110
        await trio.sleep(0.02)


def _chat() -> dict:
    return {
        "model": "standin",
        "messages": [{"role": "user", "content": "count slowly"}],
        "stream": True,
        "standin_deltas": 1200,
        "standin_interval": 0.05,
    }


def _openai_stream(base_url: str, token: str, first: threading.Event) -> dict:
    """Stream with the ``openai`` client (in a thread); what it got and how it ended."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=60)
    chunks = 0
    try:
        stream = client.chat.completions.create(
            model="standin",
            messages=[{"role": "user", "content": "count slowly"}],
            stream=True,
            extra_body={"standin_deltas": 1200, "standin_interval": 0.05},
        )
        for _chunk in stream:
            chunks += 1
            first.set()
    except openai.APIError as exc:
        return {"error": type(exc).__name__, "code": exc.code, "message": exc.message, "n": chunks}
    finally:
        first.set()
        client.close()
    return {"error": None, "n": chunks}


@pytest.mark.deadline(130)
async def test_sigterm_ends_open_streams_with_a_last_server_shutting_down_event(tmp_path):
    pytest.importorskip("openai")
    agent_dir = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
    server = ServeProcess(
        tmp_path / "data",
        "--shutdown-grace",
        str(GRACE),
        "--agent-dir",
        str(agent_dir),
        "--agent-config",
        str(_fake_llama_server(tmp_path)),
    )
    try:
        with trio.fail_after(90):
            url = await server.wait_ready()
            token = await server.admin_token()
            auth = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=url, headers=auth, timeout=30) as http:
                service_id = await _ready_service(http)
                base_url = f"{url}/api/v1/inference/{service_id}/v1"
                first = threading.Event()
                ended: dict = {}
                queued: list[httpx.Response] = []
                log_raw = bytearray()
                log_open = trio.Event()

                async def follow_log() -> None:
                    base = f"/api/v1/inference/{service_id}/replicas/0/logs"
                    ticket = (await http.post(base + "/ticket")).json()["ticket"]
                    params = {"ticket": ticket, "tail": 1}
                    async with http.stream("GET", base + "/stream", params=params) as opened:
                        assert opened.status_code == 200
                        log_open.set()
                        async for chunk in opened.aiter_raw():
                            log_raw.extend(chunk)

                async def with_openai() -> None:
                    ended.update(
                        await trio.to_thread.run_sync(_openai_stream, base_url, token, first)
                    )

                async def waiting_for_a_slot() -> None:
                    body = {**_chat(), "stream": False}
                    queued.append(await http.post(f"{base_url}/chat/completions", json=body))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(with_openai)
                    nursery.start_soon(follow_log)
                    await log_open.wait()
                    async with http.stream(
                        "POST", f"{base_url}/chat/completions", json=_chat()
                    ) as response:
                        assert response.status_code == 200
                        raw = b""
                        chunks = response.aiter_raw()
                        while b"data: " not in raw:
                            raw += await chunks.__anext__()
                        await trio.to_thread.run_sync(first.wait, 30)
                        # Both slots (concurrency 2) are taken: a third request queues.
                        nursery.start_soon(waiting_for_a_slot)
                        await _wait_queued(http, service_id)
                        signalled = time.monotonic()
                        server.proc.send_signal(signal.SIGTERM)
                        # The stream keeps going through the grace, then ends cleanly.
                        async for chunk in chunks:
                            raw += chunk
                        cut = time.monotonic() - signalled
        events = sse_events(raw)
        *deltas, last = events
        assert last["error"]["code"] == "server_shutting_down", events[-3:]
        assert "the server is shutting down" in last["error"]["message"]
        assert all("choices" in event for event in deltas)
        assert "[DONE]" not in events
        # Deltas kept arriving during the grace (one every 50 ms), and it was cut after it.
        assert GRACE <= cut < GRACE + 5, cut
        assert len(deltas) >= GRACE / 0.05 / 2
        # The openai client raised an APIError with the code, not a connection error.
        assert ended["error"] == "APIError", ended
        assert ended["code"] == "server_shutting_down"
        assert ended["n"] > 0
        # The queued request was answered too, before its connection closed.
        [answer] = queued
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "server_shutting_down"
        assert answer.headers["retry-after"] == "1"
        # The live log stream ended with the same code as its last event.
        *_, last_log = [block for block in log_raw.decode().split("\n\n") if block]
        assert last_log.startswith("event: error\ndata: "), last_log
        assert '"code":"server_shutting_down"' in last_log.replace(" ", ""), last_log
        with trio.fail_after(30):
            assert await trio.to_thread.run_sync(server.proc.wait) == 0
    finally:
        server.kill()
        shutil.rmtree(agent_dir, ignore_errors=True)
