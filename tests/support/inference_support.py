"""A controller with an embedded agent that has the llama.cpp runtime installed, for services.

The runtime is the ``ficc-llama-server`` console script (llama.cpp's own server,
from xllamacpp), declared in the agent's settings with the sha256 of the
executable as its image digest, exactly as an operator declares it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from ficc_core.agent.embedded import run_embedded_agent
from ficc_core.auth import ALL_SCOPES
from ficc_core.controller.service import Service

from ..conftest import bearer, issue_token
from .agent_support import open_controller
from .models_support import sha256_of, smollm2_path
from .waiting import eventually

GIB = 1024**3


def llama_server_executable() -> Path:
    """The ``ficc-llama-server`` console script beside this Python."""
    found = shutil.which("ficc-llama-server", path=str(Path(sys.executable).parent))
    assert found, "install runtimes/llama_server (make install)"
    return Path(found).absolute()


def runtime_digest(executable: Path) -> str:
    return "sha256:" + hashlib.sha256(executable.read_bytes()).hexdigest()


def engine_pid(agent_dir: Path, attempt_id: str) -> int:
    """The pid of the engine the agent under ``agent_dir`` runs for ``attempt_id``, from
    the process provider's attempt record (blocking: call it in a thread)."""
    for record in agent_dir.glob("*/attempts/*/attempt.json"):
        document = json.loads(record.read_text())
        if attempt_id in str(record) or document.get("attempt_id") == attempt_id:
            return document["pid"]
    raise AssertionError(f"no engine record for {attempt_id}")


def write_agent_settings(folder: Path, executable: Path | None = None) -> Path:
    """An agent settings file declaring the llama.cpp runtime for the process provider
    (``executable``, by default the installed llama-server)."""
    executable = executable or llama_server_executable()
    path = folder / "agent.toml"
    path.write_text(
        "[[runtimes]]\n"
        'name = "llama_server"\n'
        'provider = "process"\n'
        f'image_digest = "{runtime_digest(executable)}"\n'
        f'executable = "{executable}"\n'
    )
    return path


def broken_engine(folder: Path) -> tuple[Path, Path]:
    """An engine executable that always fails at start, and agent settings declaring it
    as the llama_server runtime."""
    engine = folder / "broken-llama-server"
    engine.write_text("#!/bin/sh\necho 'cannot load the model' >&2\nexit 3\n")
    engine.chmod(0o755)
    return engine, write_agent_settings(folder, engine)


def standin_engine(folder: Path) -> tuple[Path, Path]:
    """The stand-in engine as a llama_server runtime (it ignores llama.cpp's flags and
    listens on the executor's socket), and agent settings declaring it."""
    engine = folder / "standin-llama-server"
    engine.write_text(f"#!/bin/sh\nexec {sys.executable} -m ficc_core.testing.standin_engine\n")
    engine.chmod(0o755)
    return engine, write_agent_settings(folder, engine)


@attrs.define
class Controller:
    """A served controller, its URL, an all-scopes token and an HTTP client."""

    service: Service
    url: str
    token: str
    http: httpx.AsyncClient

    async def call(self, method: str, path: str, token: str | None = None, **kwargs: Any):
        headers = {**bearer(token or self.token), **kwargs.pop("headers", {})}
        return await self.http.request(method, path, headers=headers, **kwargs)

    async def ok(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = await self.call(method, path, **kwargs)
        assert response.status_code == status, (method, path, response.text)
        return response.json()

    async def node(self, node_id: str = "local") -> dict[str, Any]:
        return await self.ok("GET", f"/api/v1/contributors/{node_id}")

    async def wait_node(self, node_id: str = "local", state: str = "connected") -> dict:

        async def answer() -> Any:
            response = await self.call("GET", f"/api/v1/contributors/{node_id}")
            return response.json() if response.status_code == 200 else None

        return await eventually(
            answer, None, until=lambda node: node is not None and node["state"] == state, every=0.05
        )

    async def wait_service(self, service_id: str, predicate, period: float = 0.05) -> dict:
        """Poll the service until ``predicate(view)`` holds; return that view."""
        return await eventually(
            lambda: self.ok("GET", f"/api/v1/inference/{service_id}"),
            None,
            until=predicate,
            every=period,
        )

    async def wait_status(self, service_id: str, predicate, period: float = 0.05) -> dict:
        """Poll the service's status route until ``predicate(status)`` holds; return it."""
        return await eventually(
            lambda: self.ok("GET", f"/api/v1/inference/{service_id}/status"),
            None,
            until=predicate,
            every=period,
        )

    async def control(self, service_id: str, action: str, **body: Any) -> httpx.Response:
        if "revision" not in body:
            body["revision"] = (await self.ok("GET", f"/api/v1/inference/{service_id}"))["revision"]
        return await self.call(
            "POST", f"/api/v1/inference/{service_id}/control/{action}", json=body
        )


@asynccontextmanager
async def open_inference_controller(
    tmp_path: Path, *, embedded: bool = True, **settings: Any
) -> AsyncIterator[Controller]:
    """A controller on 127.0.0.1 with (by default) an embedded agent named ``local``."""
    agent_dir = Path(tempfile.mkdtemp(prefix="fi-", dir="/tmp"))
    try:
        overrides = {
            "agent_dir": str(agent_dir),
            "agent_config": str(write_agent_settings(agent_dir)),
            "node_name": "local",
            **settings,
        }
        async with open_controller(tmp_path, **overrides) as (service, url):
            await service.auth.bootstrap()
            token = await issue_token(
                service, scopes=ALL_SCOPES, name="operator", generated_name=True
            )
            async with (
                trio.open_nursery() as nursery,
                httpx.AsyncClient(base_url=url, timeout=30) as http,
            ):
                if embedded:
                    await nursery.start(run_embedded_agent, service)
                controller = Controller(service, url, token, http)
                if embedded:
                    with trio.fail_after(30):
                        await controller.wait_node("local")
                yield controller
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(agent_dir, ignore_errors=True)


async def register_smollm2(controller: Controller, name: str = "smollm2") -> str:
    """Register the SmolLM2 GGUF and upload it through the byte upload route; return its id."""
    return await register_gguf(controller, smollm2_path(), name)


async def register_gguf(controller: Controller, path: Path, name: str) -> str:
    """Register a local GGUF file and upload it through the byte upload route; return its id."""
    sha = await trio.to_thread.run_sync(sha256_of, path)
    size = (await trio.to_thread.run_sync(path.stat)).st_size
    manifest = {
        "name": name,
        "format": "gguf",
        "files": [{"path": path.name, "size": size, "sha256": sha}],
    }
    model = await controller.ok("POST", "/api/v1/models", status=201, json=manifest)
    chunk = 16 << 20

    def read(offset: int) -> bytes:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(chunk)

    offset = 0
    while offset < size:
        data = await trio.to_thread.run_sync(read, offset)
        response = await controller.call(
            "POST",
            f"/api/v1/models/{model['id']}/files/0/bytes",
            params={"offset": offset},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert response.status_code in (200, 201, 202), response.text
        offset += len(data)
    while (await controller.ok("GET", f"/api/v1/models/{model['id']}"))[  # noqa: ASYNC110
        "state"
    ] != "verified":
        await trio.sleep(0.05)
    return model["id"]


def node_llama_spec(
    node: dict[str, Any],
    model_id: str,
    placements: list[dict[str, Any]],
    *,
    alias: str = "smol",
    context: int = 512,
    concurrency: int = 2,
    **options: Any,
) -> dict[str, Any]:
    """A llama_cpp specification for the llama_server runtime ``node`` (the API's view of
    a node) advertises, its replicas at ``placements``."""
    [runtime] = [r for r in node["snapshot"]["runtimes"] if r["name"] == "llama_server"]
    return {
        "alias": alias,
        "model_id": model_id,
        "engine": "llama_cpp",
        "runtime": {
            "executor_provider": runtime["executor_provider"],
            "package_digest": runtime["package_digest"],
            "image_digest": runtime["image_digest"],
            "isolation": "process",
            "network": "none",
        },
        "image_executable": str(llama_server_executable()),
        "context": context,
        "concurrency": concurrency,
        "placements": placements,
        **options,
    }


async def llama_spec(
    controller: Controller,
    model_id: str,
    *,
    alias: str = "smol",
    node_ids: tuple[str, ...] = ("local",),
    cpus: float = 1,
    memory_bytes: int = 1 * GIB,
    context: int = 512,
    concurrency: int = 2,
    **options: Any,
) -> dict[str, Any]:
    """A llama_cpp specification for the runtime the first node advertises."""
    node = await controller.node(node_ids[0])
    limits = {"cpus": cpus, "memory_bytes": memory_bytes}
    placements = [{"node_id": node_id, "limits": dict(limits)} for node_id in node_ids]
    return node_llama_spec(
        node, model_id, placements, alias=alias, context=context, concurrency=concurrency, **options
    )


async def ready_service(
    controller: Controller, model_id: str, **options: Any
) -> tuple[str, str, str]:
    """Create and start a llama_cpp service, wait until every replica is routed; return
    (service id, a service-bound invoke token, its credential id)."""
    spec = await llama_spec(controller, model_id, **options)
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    service_id = created["id"]
    assert (await controller.control(service_id, "start")).status_code == 200
    await controller.wait_service(
        service_id,
        lambda v: (
            v["state"] == "ready"
            and len(controller.service.live.get(service_id).replicas) == len(spec["placements"])
        ),
    )
    issued = await controller.ok(
        "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 600}
    )
    return service_id, issued["token"], issued["credential"]["id"]
