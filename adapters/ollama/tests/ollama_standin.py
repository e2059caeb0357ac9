"""A STAND-IN for ``ollama serve``, for tests only: Ollama's HTTP API over real llama.cpp.

No working Ollama server can be installed on our CI machines, so the ollama
adapter's jobs are tested against this program instead. It is not Ollama. It
serves the part of Ollama's current HTTP API a FICC job uses, as Ollama documents it,
and generates real tokens with llama.cpp's own server (the ``xllamacpp`` wheel):

- ``GET /`` answers ``Ollama is running``; ``GET /api/version`` answers
  ``{"version": ...}`` (docs/api.md, "Version").
- ``HEAD /api/blobs/sha256:<hex>``: 200 when the blob exists, 404 when it does not
  (docs/api.md, "Check if a Blob Exists").
- ``POST /api/blobs/sha256:<hex>``: stores the body as ``$OLLAMA_MODELS/blobs/sha256-<hex>``
  after checking its sha256: 201 Created, 400 Bad Request on a digest mismatch, and
  200 when the blob already exists (docs/api.md, "Push a Blob";
  ``CreateBlobHandler`` in server/routes.go).
- ``POST /api/create`` with ``{"model", "files": {"<name>.gguf": "sha256:<hex>"},
  "parameters": {...}, "stream"}``: the named blobs must exist (400 otherwise); the
  GGUF blob is loaded into a llama.cpp server with ``num_ctx`` tokens of context per
  parallel request (``OLLAMA_NUM_PARALLEL`` slots, as Ollama allocates), ``num_thread``
  threads; answers a stream of ``{"status": ...}`` lines ending in
  ``{"status":"success"}``, or that one object with ``"stream": false``
  (docs/api.md, "Create a Model", "Create a model from GGUF").
- OpenAI compatibility (docs/openai.md): ``GET /v1/models`` lists created models as
  ``<name>:latest``; ``POST /v1/chat/completions`` (JSON or SSE) and
  ``POST /v1/embeddings`` check the ``model`` names a created model (404
  ``model "x" not found`` otherwise, as Ollama answers) and are proxied to llama.cpp.

Configuration comes from Ollama's own environment variables (envconfig/config.go):
``OLLAMA_HOST`` (``127.0.0.1:11434`` by default), ``OLLAMA_MODELS``,
``OLLAMA_NUM_PARALLEL``, ``OLLAMA_CONTEXT_LENGTH`` (the default ``num_ctx``),
``OLLAMA_KEEP_ALIVE`` (only ``-1``, keep loaded, is honoured: the stand-in never unloads).

Where it differs from Ollama: it loads the model when it is created rather than on
first use, keeps one model, and passes llama.cpp's response bodies through
unchanged (the ``model`` field of a response names the GGUF file).

Documents followed: https://github.com/ollama/ollama/blob/main/docs/api.md and
https://github.com/ollama/ollama/blob/main/docs/openai.md.

Run as ``python ollama_standin.py serve`` with the environment above; SIGTERM stops it.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import json
import os
import re
import signal
import socket
import socketserver
import sys
import tempfile
import threading
import time
from typing import Any

VERSION = "0.12.0-ficc-standin"
_BLOB_ROUTE = re.compile(r"/api/blobs/sha256[:-]([0-9a-f]{64})")
_CHUNK = 1024 * 1024

_lock = threading.Lock()
_models: dict[str, dict[str, Any]] = {}  # "name:latest" -> {"socket", "server", ...}


def _models_dir() -> str:
    return os.environ.get("OLLAMA_MODELS") or os.path.expanduser("~/.ollama/models")


def _blob_path(hex_digest: str) -> str:
    return os.path.join(_models_dir(), "blobs", f"sha256-{hex_digest}")


def _full_name(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("llama.cpp", timeout=600)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _load(blob: str, parameters: dict[str, Any]) -> tuple[Any, str]:
    """Start llama.cpp's server on the GGUF blob, listening on a Unix socket."""
    import xllamacpp  # imported here so the module's --help works without it

    parallel = max(1, int(os.environ.get("OLLAMA_NUM_PARALLEL") or 1))
    num_ctx = int(parameters.get("num_ctx") or os.environ.get("OLLAMA_CONTEXT_LENGTH") or 4096)
    params = xllamacpp.CommonParams()
    params.model.path = blob
    params.n_parallel = parallel
    # Ollama gives each parallel request num_ctx tokens: the pool is num_ctx * parallel.
    params.n_ctx = num_ctx * parallel
    if "num_thread" in parameters:
        params.cpuparams.n_threads = int(parameters["num_thread"])
        params.cpuparams_batch.n_threads = int(parameters["num_thread"])
    params.n_gpu_layers = int(parameters.get("num_gpu", 0))
    # One runner serves chat and embeddings, as an Ollama runner does.
    params.embedding = True
    params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    directory = tempfile.mkdtemp(prefix="runner-", dir=_models_dir())
    path = os.path.join(directory, "llama.sock")
    params.hostnames = [path]
    return xllamacpp.Server(params), path


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ollama-standin"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("ollama-standin: " + (format % args) + "\n")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _openai_error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"message": message, "type": "api_error", "code": None}})

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # -- routes ------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        match = _BLOB_ROUTE.fullmatch(self.path)
        if match is None:
            self._send(404, b"")
        else:
            self._send(200 if os.path.exists(_blob_path(match.group(1))) else 404, b"")

    def do_GET(self) -> None:
        route = self.path.split("?", 1)[0]
        if route == "/":
            self._send(200, b"Ollama is running", "text/plain; charset=utf-8")
        elif route == "/api/version":
            self._json(200, {"version": VERSION})
        elif route == "/v1/models":
            with _lock:
                names = sorted(_models)
            data = [
                {
                    "id": name,
                    "object": "model",
                    "created": _models[name]["created"],
                    "owned_by": "library",
                }
                for name in names
            ]
            self._json(200, {"object": "list", "data": data})
        else:
            self._send(404, b"404 page not found", "text/plain")

    def do_POST(self) -> None:
        route = self.path.split("?", 1)[0]
        match = _BLOB_ROUTE.fullmatch(route)
        if match is not None:
            self._push_blob(match.group(1))
        elif route == "/api/create":
            self._create()
        elif route in ("/v1/chat/completions", "/v1/embeddings"):
            self._proxy(route)
        else:
            self._send(404, b"404 page not found", "text/plain")

    def _push_blob(self, expected: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        final = _blob_path(expected)
        if os.path.exists(final):
            self.rfile.read(length)
            self._send(200, b"")
            return
        os.makedirs(os.path.dirname(final), exist_ok=True)
        digest = hashlib.sha256()
        fd, partial = tempfile.mkstemp(
            prefix="sha256-", suffix="-partial", dir=os.path.dirname(final)
        )
        try:
            with os.fdopen(fd, "wb") as file:
                remaining = length
                while remaining:
                    data = self.rfile.read(min(_CHUNK, remaining))
                    if not data:
                        break
                    remaining -= len(data)
                    digest.update(data)
                    file.write(data)
            actual = digest.hexdigest()
            if actual != expected:
                self._error(
                    400, f'digest mismatch, expected "sha256:{expected}", got "sha256:{actual}"'
                )
                return
            os.replace(partial, final)
            partial = ""
            self._send(201, b"")
        finally:
            if partial:
                os.unlink(partial)

    def _create(self) -> None:
        try:
            request = json.loads(self._body() or b"{}")
        except ValueError:
            self._error(400, "invalid JSON")
            return
        name, files = request.get("model"), request.get("files")
        if not name:
            self._error(400, "model is required")
            return
        if not files:
            self._error(400, "neither 'from' or 'files' was specified")
            return
        ggufs = []
        for file_name, digest in files.items():
            hex_digest = str(digest).removeprefix("sha256:")
            if not os.path.exists(_blob_path(hex_digest)):
                self._error(400, f"blob {digest} for {file_name} not found; push it first")
                return
            if file_name.endswith(".gguf"):
                ggufs.append(_blob_path(hex_digest))
        if len(ggufs) != 1:
            self._error(400, "the stand-in creates models from exactly one GGUF file")
            return
        with open(ggufs[0], "rb") as file:
            if file.read(4) != b"GGUF":
                self._error(400, "invalid file magic")
                return
        statuses = [{"status": "parsing GGUF"}]
        full = _full_name(name)
        with _lock:
            if full not in _models:
                try:
                    server, path = _load(ggufs[0], request.get("parameters") or {})
                except Exception as exc:  # the llama.cpp loader's own refusal
                    self._error(500, f"unable to load model: {exc}")
                    return
                _models[full] = {"server": server, "socket": path, "created": int(time.time())}
        statuses += [{"status": "writing manifest"}, {"status": "success"}]
        if request.get("stream") is False:
            self._json(200, statuses[-1])
        else:
            lines = b"".join(json.dumps(status).encode() + b"\n" for status in statuses)
            self._send(200, lines, "application/x-ndjson")

    def _proxy(self, route: str) -> None:
        raw = self._body()
        try:
            name = json.loads(raw).get("model")
        except (ValueError, AttributeError):
            self._openai_error(400, "invalid request body")
            return
        with _lock:
            model = _models.get(_full_name(str(name or "")))
        if model is None:
            self._openai_error(404, f'model "{name}" not found, try pulling it first')
            return
        upstream = _UnixConnection(model["socket"])
        try:
            upstream.request("POST", route, raw, {"Content-Type": "application/json"})
            answer = upstream.getresponse()
            self.send_response(answer.status)
            content_type = answer.getheader("Content-Type", "application/json")
            self.send_header("Content-Type", content_type)
            if answer.getheader("Content-Length") is not None:
                body = answer.read()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            # Streamed (SSE): pass each piece on as it comes, chunked.
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                piece = answer.read1(65536)
                if not piece:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            upstream.close()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(argv: list[str]) -> int:
    """``serve``: listen on ``OLLAMA_HOST`` until SIGTERM."""
    if argv[1:] != ["serve"]:
        sys.stderr.write("usage: ollama_standin.py serve\n")
        return 2
    host = os.environ.get("OLLAMA_HOST") or "127.0.0.1:11434"
    address, _, port = host.removeprefix("http://").rpartition(":")
    os.makedirs(_models_dir(), exist_ok=True)
    server = _Server((address or "127.0.0.1", int(port or 11434)), _Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"ollama-standin {VERSION} listening on {host}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        with _lock:
            _models.clear()  # stops each llama.cpp server
        print("ollama-standin stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
