"""A stand-in engine for executor conformance tests: a small HTTP server on a Unix socket.

Run it as ``python -m ficc_core.testing.standin_engine --socket PATH`` (or with
``FICC_ENDPOINT_SOCKET`` set), or with ``--port N`` to listen on ``127.0.0.1:N``.
It uses only the standard library, so it runs in any image that has a Python.
Its routes exist to make an executor's behaviour observable from the engine's side:

- ``GET /health``: 200 once ready (``--ready-after`` seconds after start).
- ``GET /stream``: 64 KiB chunks for as long as the client reads; the bytes the
  kernel accepted show in ``/stats`` (writes block when nobody reads).
- ``GET /slow``: a short line every 10 ms until the client goes away.
- ``GET /stats``: JSON counters: streamed bytes, disconnects and when the last one was seen.
- ``POST /echo``: the request headers, body length and body sha256, as JSON.
- ``POST /connect``: ``{"targets": [[host, port], ...]}``; tries each, reports what happened.
- ``POST /burn``: ``{"seconds": s}``; spins for ``s`` wall seconds, reports CPU seconds used.
- ``POST /alloc``: ``{"bytes": n}``; allocates and touches ``n`` bytes.
- ``POST /log``: ``{"lines": n}``; prints ``n`` numbered lines to stdout.
- ``POST /write``: ``{"path": p}``; tries to create ``p``, reports what happened.
- ``GET /env``: the engine's environment, working directory and PID.
- ``POST /spawn``: starts a child that sleeps in a new session; reports its PID.
- ``POST /blobs/<sha256 hex>``: a model-blob upload route: 201 when the body's
  sha256 is the one in the path, 400 otherwise; recorded in ``/received``.
- ``POST /setup``: records its JSON body in ``/received`` (a bootstrap step).
- ``GET /received``: the uploads and setups so far, in order, as JSON.

OpenAI-compatible routes (the inference gateway's tests and benchmark), serving
the model name given with ``--alias`` (default ``standin``):

- ``GET /v1/models``: the one model.
- ``POST /v1/chat/completions``: a ``chat.completion`` (JSON), or with
  ``"stream": true`` server-sent events: ``standin_deltas`` deltas (default 8)
  ``standin_interval`` seconds apart (default 0), a usage chunk when
  ``stream_options.include_usage`` is true, then ``data: [DONE]``. Prompt tokens
  are the words of the messages' contents, completion tokens the deltas. A client
  that goes away mid-stream counts in ``/stats`` (``chat_disconnects``).
- ``POST /v1/embeddings``: an 8-dimensional vector per input string.
- ``POST /tokenize``: vLLM's shape, ``{"messages": [...]}`` or ``{"prompt": text}``
  in, ``{"count", "max_model_len", "tokens"}`` out, counting words like the chat
  route's usage does (``tokenize_delay`` in ``/steer`` stalls it).
- ``POST /steer``: ``{"head_delay": s, "first_delay": s, "status": n, "body": text}``
  changes how this engine answers later chat requests (a stalled or failing replica
  beside healthy ones): wait ``head_delay`` seconds before the response head, wait
  ``first_delay`` seconds between a stream's head and its first delta, or answer
  ``status`` with ``body`` (JSON text) instead. ``{}`` restores the defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from typing import Any

CHUNK = 64 * 1024

#: Every route the stand-in serves (a conformance job's endpoint contract admits these).
ROUTES = (
    "/health",
    "/stream",
    "/slow",
    "/stats",
    "/echo",
    "/connect",
    "/burn",
    "/alloc",
    "/log",
    "/write",
    "/env",
    "/spawn",
    "/setup",
    "/received",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/tokenize",
    "/steer",
)
#: The prefix of the blob upload route (the full path ends with the sha256 in hex).
BLOBS = "/blobs/"

_stats_lock = threading.Lock()
_stats: dict[str, Any] = {
    "stream_bytes": 0,
    "disconnects": 0,
    "last_disconnect_at": None,
    "streams_open": 0,
    "chat_requests": 0,
    "chat_streams_open": 0,
    "chat_completed": 0,
    "chat_disconnects": 0,
    "last_chat_disconnect_at": None,
    "last_chat_request": None,
}
_received: list[dict[str, Any]] = []
_started = time.monotonic()
_ready_after = 0.0
_alias = "standin"
#: How chat requests are answered (``POST /steer``).
_steer: dict[str, Any] = {}


def _disconnected() -> None:
    with _stats_lock:
        _stats["disconnects"] += 1
        _stats["last_disconnect_at"] = time.time()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("standin: " + (format % args) + "\n")

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _raw_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _chunked(self, pieces: Any) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with _stats_lock:
            _stats["streams_open"] += 1
        try:
            for piece in pieces:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                with _stats_lock:
                    _stats["stream_bytes"] += len(piece)
        except OSError:
            _disconnected()
        finally:
            with _stats_lock:
                _stats["streams_open"] -= 1
            self.close_connection = True

    def do_GET(self) -> None:
        route = self.path.split("?", 1)[0]
        if route == "/health":
            if time.monotonic() - _started < _ready_after:
                self._json(503, {"status": "loading"})
            else:
                self._json(200, {"status": "ok"})
        elif route == "/stream":
            with _stats_lock:
                _stats["stream_bytes"] = 0
            self._chunked(iter(lambda: b"x" * CHUNK, None))
        elif route == "/slow":
            self._chunked(self._ticks())
        elif route == "/env":
            self._json(200, {"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid()})
        elif route == "/stats":
            with _stats_lock:
                self._json(200, dict(_stats, pid=os.getpid()))
        elif route == "/received":
            with _stats_lock:
                self._json(200, list(_received))
        elif route == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": _alias, "object": "model", "created": 0, "owned_by": "standin"}
                    ],
                },
            )
        else:
            self._json(404, {"error": "not found"})

    def _ticks(self) -> Any:
        while True:
            yield b"tick\n"
            time.sleep(0.01)

    def do_POST(self) -> None:
        route = self.path.split("?", 1)[0]
        raw = self._raw_body()
        if route == "/echo":
            self._json(
                200,
                {
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body_length": len(raw),
                    "body_sha256": hashlib.sha256(raw).hexdigest(),
                },
            )
            return
        if route.startswith(BLOBS):
            expected, actual = route[len(BLOBS) :], hashlib.sha256(raw).hexdigest()
            with _stats_lock:
                _received.append({"path": route, "length": len(raw), "sha256": actual})
            if actual == expected:
                self._json(201, {"sha256": actual})
            else:
                self._json(400, {"error": f"digest mismatch: the body's sha256 is {actual}"})
            return
        body = json.loads(raw) if raw else {}
        if route == "/v1/chat/completions":
            self._chat(body)
            return
        if route == "/v1/embeddings":
            self._embeddings(body)
            return
        if route == "/tokenize":
            if _steer.get("tokenize_delay"):
                time.sleep(float(_steer["tokenize_delay"]))
            count = _words(body)
            self._json(200, {"count": count, "max_model_len": 0, "tokens": list(range(count))})
            return
        if route == "/steer":
            _steer.clear()
            _steer.update(body)
            self._json(200, dict(_steer))
            return
        if route == "/setup":
            with _stats_lock:
                _received.append({"path": route, "body": body})
            self._json(200, {"status": "set up"})
            return
        if route == "/connect":
            self._json(200, {"results": [_try_connect(h, p) for h, p in body["targets"]]})
        elif route == "/burn":
            deadline, begin = time.monotonic() + float(body["seconds"]), time.process_time()
            while time.monotonic() < deadline:
                pass
            self._json(200, {"cpu_seconds": time.process_time() - begin})
        elif route == "/alloc":
            block = bytearray(int(body["bytes"]))
            for index in range(0, len(block), 4096):
                block[index] = 1
            self._json(200, {"allocated": len(block)})
        elif route == "/log":
            for number in range(int(body["lines"])):
                print(f"standin log line {number}", flush=True)
            self._json(200, {"printed": int(body["lines"])})
        elif route == "/spawn":
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True
            )
            self._json(200, {"pid": child.pid})
        elif route == "/write":
            try:
                with open(body["path"], "w") as file:
                    file.write("x")
                result = "written"
            except OSError as exc:
                result = f"{type(exc).__name__}: {exc.strerror}"
            self._json(200, {"result": result})
        else:
            self._json(404, {"error": "not found"})

    def _chat(self, body: dict[str, Any]) -> None:
        deltas = int(body.get("standin_deltas", 8))
        interval = float(body.get("standin_interval", 0.0))
        prompt_tokens = _words(body)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": deltas,
            "total_tokens": prompt_tokens + deltas,
        }
        model = body.get("model", _alias)
        with _stats_lock:
            _stats["chat_requests"] += 1
            _stats["last_chat_request"] = {
                key: value for key, value in body.items() if key != "messages"
            }
        created = int(time.time())
        if _steer.get("head_delay"):
            time.sleep(float(_steer["head_delay"]))
        if _steer.get("status"):
            data = str(_steer.get("body", "")).encode()
            self.send_response(int(_steer["status"]))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if not body.get("stream"):
            if interval:
                time.sleep(interval * deltas)
            self._json(
                200,
                {
                    "id": "chatcmpl-standin",
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": " ".join(f"w{n}" for n in range(deltas)),
                            },
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                },
            )
            with _stats_lock:
                _stats["chat_completed"] += 1
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def event(choices: list[Any], **extra: Any) -> bytes:
            chunk = {
                "id": "chatcmpl-standin",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": choices,
                **extra,
            }
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with _stats_lock:
            _stats["chat_streams_open"] += 1
        try:
            if _steer.get("first_delay"):
                self.wfile.flush()
                time.sleep(float(_steer["first_delay"]))
            for number in range(deltas):
                delta = {"content": f"w{number} "}
                if number == 0:
                    delta["role"] = "assistant"
                finish = "stop" if number == deltas - 1 else None
                piece = event([{"index": 0, "delta": delta, "finish_reason": finish}])
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
                if interval:
                    time.sleep(interval)
            tail = event([], usage=usage) if include_usage else b""
            tail += b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
            self.wfile.flush()
            with _stats_lock:
                _stats["chat_completed"] += 1
        except OSError:
            with _stats_lock:
                _stats["chat_disconnects"] += 1
                _stats["last_chat_disconnect_at"] = time.time()
            _disconnected()
        finally:
            with _stats_lock:
                _stats["chat_streams_open"] -= 1
            self.close_connection = True

    def _embeddings(self, body: dict[str, Any]) -> None:
        inputs = body.get("input", "")
        texts = [inputs] if isinstance(inputs, str) else [str(text) for text in inputs]
        data = []
        for index, text in enumerate(texts):
            digest = hashlib.sha256(text.encode()).digest()
            data.append(
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": [byte / 255.0 for byte in digest[:8]],
                }
            )
        tokens = sum(len(text.split()) for text in texts)
        self._json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", _alias),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )


def _words(body: dict[str, Any]) -> int:
    """The stand-in's token count of a request: the words of its messages (or prompt)."""
    if isinstance(body.get("prompt"), str):
        return len(body["prompt"].split())
    return sum(
        len(str(message.get("content", "")).split())
        for message in body.get("messages") or []
        if isinstance(message, dict)
    )


def _try_connect(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return "connected"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 256  # many concurrent streams connect at once


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM (or forever with ``--ignore-sigterm``)."""
    global _ready_after, _alias
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=os.environ.get("FICC_ENDPOINT_SOCKET"))
    parser.add_argument("--port", type=int, default=None, help="listen on 127.0.0.1:PORT")
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--alias", default="standin", help="the model name /v1 routes serve")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--exit-after", type=float, default=None)
    args = parser.parse_args(argv)
    if not args.socket and args.port is None:
        parser.error("--socket (or FICC_ENDPOINT_SOCKET) or --port is required")
    _ready_after = args.ready_after
    _alias = args.alias
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: print("standin ignoring SIGTERM", flush=True))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server: socketserver.BaseServer
    if args.port is not None:
        server = _TcpServer(("127.0.0.1", args.port), _Handler)
        where = f"127.0.0.1:{args.port}"
    else:
        if os.path.exists(args.socket):
            os.unlink(args.socket)
        server = _Server(args.socket, _Handler)
        where = args.socket
    print(f"standin engine listening on {where}", flush=True)
    if args.exit_after is not None:
        threading.Timer(args.exit_after, lambda: os._exit(3)).start()
    try:
        server.serve_forever(poll_interval=0.05)
    finally:
        print("standin engine stopping", flush=True)


if __name__ == "__main__":
    main()
