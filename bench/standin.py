#!/usr/bin/env python3
"""A fast stand-in inference engine: OpenAI-compatible, instant, on a Unix socket or TCP.

Standard library only (a raw asyncio protocol, HTTP/1.1 keep-alive), so it costs
the benchmark little CPU and runs under any Python 3.11+. It accepts llama-server's
command line (the FICC ``llama_cpp`` adapter's flags; unknown flags are ignored)::

    standin.py --model m.gguf --host /run/engine.sock --ctx-size 2048 --parallel 4 \
        --threads 1 --n-gpu-layers 0 --alias chat --metrics --no-webui
    standin.py --host 127.0.0.1 --port 8001 --alias chat

Routes: ``GET /health``, ``GET /v1/models``, ``GET /metrics``, ``GET /stats`` (its
counters as JSON), ``POST /v1/chat/completions``, ``POST /v1/embeddings`` and
``POST /steer``.

``/metrics`` reports the load in llama.cpp's names (``llamacpp:requests_processing``:
chat answers being written; ``llamacpp:requests_deferred``). ``POST /steer`` with
``{"delay": 0.05, "queued": 4}`` makes this one engine slow: every chat answer starts
``delay`` seconds late, and ``/metrics`` says ``queued`` more requests wait in it, as an
engine behind with its own queue (other clients, a long batch) says. Sent straight to
one replica's socket, it makes that replica the slow one.

What a chat request gets is steered by its last message's content, so it passes
unchanged through any gateway: ``n=64 gap=0.02`` streams 64 deltas 20 ms apart when
the request says ``"stream": true`` (``gap=0``: as fast as the socket takes them,
honouring backpressure). Without ``stream`` the answer is one fixed JSON body.
Request bodies of any size (Content-Length or chunked) are read and parsed.

A client that closes its connection while a response is still being written counts
as a disconnect; ``/stats`` reports the count and the ``time.monotonic()`` of the
latest one (CLOCK_MONOTONIC is shared by every process on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import sys
import time

_STEER = re.compile(r"n=(\d+)(?:\s+gap=([0-9.]+))?")
CHAT_BODY = json.dumps(
    {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "standin",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello from the stand-in engine."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    },
    separators=(",", ":"),
).encode()
EMBEDDING_BODY = json.dumps(
    {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.015625] * 384}],
        "model": "standin",
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
    },
    separators=(",", ":"),
).encode()


class Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.streams = 0
        self.chunks = 0
        self.disconnects = 0
        self.last_disconnect = 0.0
        self.body_bytes = 0
        self.active = 0  # chat answers being written (or waiting out the delay)


STATS = Stats()
ALIAS = "standin"
#: The delay steer (``POST /steer``): seconds before each chat answer, and the queue
#: ``/metrics`` reports.
STEER: dict[str, float] = {"delay": 0.0, "queued": 0}


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _head(status: int, content_type: bytes, length: int | None) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"OK")
    lines = [b"HTTP/1.1 %d %s" % (status, reason), b"Content-Type: " + content_type]
    if length is None:
        lines.append(b"Transfer-Encoding: chunked")
        if content_type.startswith(b"text/event-stream"):
            lines.append(b"Cache-Control: no-cache")
    else:
        lines.append(b"Content-Length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _delta(seq: int, text: str) -> bytes:
    return (
        b'data: {"id":"chatcmpl-standin","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"standin","choices":[{"index":0,"delta":{"content":"'
        + text.encode()
        + b'"},"finish_reason":null}]}\n\n'
    )


_FINAL = (
    b'data: {"id":"chatcmpl-standin","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"standin","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
)


def _usage_event(n: int) -> bytes:
    return (
        b'data: {"id":"chatcmpl-standin","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"standin","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d,'
        b'"total_tokens":%d}}\n\n' % (n, n + 12)
    )


class Engine(asyncio.Protocol):
    """One HTTP/1.1 connection: parse requests, answer them one after another."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a response is being written
        self.closed = False
        self.paused = False
        self.resume: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.busy:
            STATS.disconnects += 1
            STATS.last_disconnect = time.monotonic()
            self.busy = False
        if self.resume is not None and not self.resume.done():
            self.resume.set_result(None)
        if self.task is not None:
            self.task.cancel()

    def eof_received(self) -> bool:
        # The client went away (or half-closed): a response in progress is abandoned.
        if self.busy:
            STATS.disconnects += 1
            STATS.last_disconnect = time.monotonic()
            self.busy = False
            if self.task is not None:
                self.task.cancel()
        return False

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.resume is not None and not self.resume.done():
            self.resume.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self.parse()

    def parse(self) -> None:
        while not self.busy and not self.closed:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1")
            lines = head.split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            start = end + 4
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body, consumed = _dechunk(self.buffer, start)
                if body is None:
                    return
                del self.buffer[:consumed]
            else:
                length = int(headers.get("content-length", "0") or 0)
                if len(self.buffer) < start + length:
                    return
                body = bytes(self.buffer[start : start + length])
                del self.buffer[: start + length]
            self.close_after = headers.get("connection", "").lower() == "close"
            self.handle(method, target.split("?", 1)[0], body)
            if self.close_after and not self.busy and self.transport is not None:
                self.transport.close()

    def send(self, status: int, content_type: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_head(status, content_type, len(body)) + body)

    def handle(self, method: str, path: str, body: bytes) -> None:
        STATS.requests += 1
        STATS.body_bytes += len(body)
        if path == "/health":
            self.send(200, b"application/json", b'{"status":"ok"}')
        elif path == "/v1/models":
            models = {"object": "list", "data": [{"id": ALIAS, "object": "model", "owned_by": "x"}]}
            self.send(200, b"application/json", json.dumps(models).encode())
        elif path == "/metrics":
            text = b"standin_requests %d\nllamacpp:requests_processing %d\n" % (
                STATS.requests,
                STATS.active,
            )
            text += b"llamacpp:requests_deferred %d\n" % STEER["queued"]
            self.send(200, b"text/plain; version=0.0.4", text)
        elif path == "/steer" and method == "POST":
            try:
                steer = json.loads(body)
                STEER["delay"] = float(steer.get("delay", 0.0))
                STEER["queued"] = int(steer.get("queued", 0))
            except (ValueError, TypeError, AttributeError):
                self.send(400, b"application/json", b'{"error":{"message":"bad steer"}}')
                return
            self.send(200, b"application/json", json.dumps(STEER).encode())
        elif path == "/stats":
            stats = dict(vars(STATS), now=time.monotonic(), pid=os.getpid())
            self.send(200, b"application/json", json.dumps(stats).encode())
        elif path == "/v1/embeddings" and method == "POST":
            self.send(200, b"application/json", EMBEDDING_BODY)
        elif path == "/v1/chat/completions" and method == "POST":
            try:
                request = json.loads(body)
                content = request["messages"][-1]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                self.send(400, b"application/json", b'{"error":{"message":"bad request"}}')
                return
            if not request.get("stream"):
                if STEER["delay"]:
                    self.busy = True
                    STATS.active += 1
                    self.task = asyncio.get_running_loop().create_task(self.later(CHAT_BODY))
                else:
                    self.send(200, b"application/json", CHAT_BODY)
                return
            steer = _STEER.search(content[-64:] if isinstance(content, str) else "")
            n = int(steer.group(1)) if steer else 16
            gap = float(steer.group(2) or 0) if steer else 0.0
            usage = bool((request.get("stream_options") or {}).get("include_usage"))
            self.busy = True
            STATS.streams += 1
            self.task = asyncio.get_running_loop().create_task(self.stream(n, gap, usage))
        else:
            self.send(404, b"application/json", b'{"error":{"message":"not found"}}')

    async def later(self, body: bytes) -> None:
        """Answer a chat after the steered delay, then go on with the connection."""
        try:
            await asyncio.sleep(STEER["delay"])
            if self.closed:
                return
            self.send(200, b"application/json", body)
        except asyncio.CancelledError:
            return
        finally:
            STATS.active -= 1
            self.task = None
        self.busy = False
        self.next_request()

    def next_request(self) -> None:
        if self.close_after and self.transport is not None:
            self.transport.close()
        elif self.buffer:
            self.parse()

    async def stream(self, n: int, gap: float, usage: bool) -> None:
        transport = self.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        STATS.active += 1
        try:
            if STEER["delay"]:
                await asyncio.sleep(STEER["delay"])
            if self.closed:
                return
            transport.write(_head(200, b"text/event-stream", None))
            started = loop.time()
            for seq in range(n):
                if gap:
                    delay = started + (seq + 1) * gap - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                while self.paused and not self.closed:
                    self.resume = loop.create_future()
                    await self.resume
                if self.closed:
                    return
                transport.write(_chunk(_delta(seq, f"tok{seq} ")))
                STATS.chunks += 1
            tail = _FINAL + (_usage_event(n) if usage else b"") + b"data: [DONE]\n\n"
            transport.write(_chunk(tail) + b"0\r\n\r\n")
        except asyncio.CancelledError:
            return
        finally:
            STATS.active -= 1
            self.task = None
        self.busy = False
        self.next_request()


def _dechunk(buffer: bytearray, at: int) -> tuple[bytes | None, int]:
    body = bytearray()
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None, 0
        size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n", at)
            if trailer_end < 0:
                return None, 0
            return bytes(body), trailer_end + 2
        if len(buffer) < at + size + 2:
            return None, 0
        body += buffer[at : at + size]
        at += size + 2


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    if host.endswith(".sock"):
        try:
            os.unlink(host)
        except FileNotFoundError:
            pass
        server = await loop.create_unix_server(Engine, host, backlog=1024)
    else:
        server = await loop.create_server(
            Engine, host, port, backlog=1024, reuse_address=True, family=socket.AF_INET
        )
        for sock in server.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    print(f"standin: listening on {host}:{port} (pid {os.getpid()})", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    global ALIAS
    parser = argparse.ArgumentParser(description="a fast stand-in inference engine")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--alias", default="standin")
    parser.add_argument("--model", default=None)
    args, _ignored = parser.parse_known_args(argv)
    ALIAS = args.alias
    try:
        asyncio.run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
