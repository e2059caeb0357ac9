"""A real ficc-llama-server with SmolLM2: health, a chat completion, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h11
import pytest
import trio

COMMAND = [sys.executable, "-m", "ficc_llama_server.cli"]


async def _request(socket: Path, method: str, path: str, payload=None) -> tuple[int, bytes]:
    """One HTTP/1.1 request over the Unix socket; the whole answer."""
    body = b"" if payload is None else json.dumps(payload).encode()
    headers = [("host", "engine"), ("content-length", str(len(body)))]
    if payload is not None:
        headers.append(("content-type", "application/json"))
    connection = h11.Connection(h11.CLIENT)
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        await stream.send_all(
            connection.send(h11.Request(method=method, target=path, headers=headers))
        )
        await stream.send_all(
            connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage())
        )
        status, data = 0, b""
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                data += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return status, data


async def _wait_healthy(process: trio.Process, socket: Path) -> None:
    while True:
        assert process.returncode is None, "ficc-llama-server exited before it was ready"
        try:
            status, _ = await _request(socket, "GET", "/health")
        except OSError:  # not bound yet
            status = 0
        if status == 200:
            return
        await trio.sleep(0.05)


async def _start(model: Path, socket: Path, log: Path, *flags: str) -> trio.Process:
    argv = [*COMMAND, "--model", str(model), "--host", str(socket), "--ctx-size", "1024"]
    argv += ["--parallel", "1", "--threads", "1", "--alias", "smol", "--no-webui", *flags]
    # A file, not a pipe: llama.cpp's log must never block on a full pipe.
    with log.open("wb") as sink:
        return await trio.lowlevel.open_process(
            argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_it_serves_health_and_chat_on_the_socket_and_stops_cleanly(
    smollm2_gguf, short_dir, signum
):
    socket = short_dir / "engine.sock"
    log = short_dir / "log"
    process = await _start(smollm2_gguf, socket, log, "--metrics")
    try:
        with trio.fail_after(30):
            await _wait_healthy(process, socket)
            status, answer = await _request(
                socket,
                "POST",
                "/v1/chat/completions",
                {"model": "smol", "messages": [{"role": "user", "content": "Say hi"}],
                 "max_tokens": 8},
            )  # fmt: skip
            assert status == 200, answer
            reply = json.loads(answer)
            assert reply["model"] == "smol"
            assert reply["choices"][0]["message"]["role"] == "assistant"
            assert reply["usage"]["completion_tokens"] <= 8
            status, metrics = await _request(socket, "GET", "/metrics")
            assert status == 200 and b"llamacpp:" in metrics
            process.send_signal(signum)
            assert await process.wait() == 0
        assert f"received {signum.name}, stopping" in log.read_text()
        assert not socket.exists(), "the socket file is removed on shutdown"
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await process.wait()


async def test_a_model_that_does_not_load_exits_with_status_1_and_leaves_no_socket(short_dir):
    model = short_dir / "broken.gguf"
    model.write_bytes(b"not a gguf file")
    socket = short_dir / "engine.sock"
    log = short_dir / "log"
    process = await _start(model, socket, log)
    try:
        with trio.fail_after(30):
            assert await process.wait() == 1
        assert "the server did not start" in log.read_text()
        assert not socket.exists()
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await process.wait()


async def test_a_stop_signal_while_the_model_loads_still_exits_cleanly(smollm2_gguf, short_dir):
    socket = short_dir / "engine.sock"
    log = short_dir / "log"
    process = await _start(smollm2_gguf, socket, log)
    try:
        with trio.fail_after(30):
            # Signal once llama.cpp has begun to load the model (loading takes ~0.5 s).
            while True:
                if "loading model" in await trio.Path(log).read_text():
                    break
                await trio.sleep(0.01)
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
        assert not socket.exists()
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await process.wait()
