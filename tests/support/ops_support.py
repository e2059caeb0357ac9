"""Two nodes for the operations tests: the embedded ``local`` and a remote ``node-2``.

Both run the stand-in ``vllm`` engine (tests/inference/test_inference_directory_models.py), so a
replica is ready in well under a second; ``node-2`` is a real remote agent in this
trio run, dialling the controller's WebSocket like ``ficc executor`` does, and staging
the model's files from the controller into its own directory before a launch.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from ficc_core.agent import Agent
from ficc_core.agent.remote import RemoteAgent
from ficc_core.agent.runtimes import AgentSettings
from ficc_core.inference import repository

from ..inference.test_inference_directory_models import register_tiny_hf, vllm_spec, write_fake_vllm
from .inference_support import Controller, open_inference_controller


@attrs.define
class Ops:
    """The controller, the model, a specification maker and the invoke traffic."""

    controller: Controller
    model_id: str
    engine: Path
    #: Ends node-2's agent (as if its process stopped): it no longer dials in.
    node_2: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: node-2's agent directory (its staged blobs and trees are under ``blobs/``).
    node_2_dir: Path | None = None

    async def spec(self, *nodes: str, alias: str = "tiny", cpus: float = 0.25) -> dict[str, Any]:
        spec = await vllm_spec(self.controller, self.model_id, self.engine, alias=alias)
        limits = {**spec["placements"][0]["limits"], "cpus": cpus}
        spec["placements"] = [{"node_id": node, "limits": limits} for node in nodes or ("local",)]
        return spec

    async def running(self, *nodes: str, alias: str = "tiny") -> str:
        """Create and start a service with one replica per node; wait until it is ready."""
        created = await self.controller.ok(
            "POST", "/api/v1/inference", status=201, json=await self.spec(*nodes, alias=alias)
        )
        assert (await self.controller.control(created["id"], "start")).status_code == 200
        await self.controller.wait_service(created["id"], lambda v: v["state"] == "ready")
        return created["id"]

    async def reservations(self, service_id: str) -> list[tuple[int, int, str]]:
        """The service's reservations as (generation, replica, node) keys, in the store."""
        held = await self.controller.service.store.read(
            lambda tx: repository.reservations(tx, service_id)
        )
        return sorted(r.key for r in held)

    async def token(self, service_id: str) -> str:
        issued = await self.controller.ok(
            "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 600}
        )
        return issued["token"]


@attrs.define
class Traffic:
    """Chat requests sent one after another (``clients`` at once) until stopped."""

    sent: int = 0
    failures: list[str] = attrs.Factory(list)
    stop: trio.Event = attrs.Factory(trio.Event)
    body: dict[str, Any] = attrs.Factory(lambda: {"messages": [{"role": "user", "content": "hi"}]})

    async def run(self, http: httpx.AsyncClient, service_id: str, token: str, clients: int = 2):
        async def client() -> None:
            while not self.stop.is_set():
                response = await http.post(
                    f"/api/v1/inference/{service_id}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {token}"},
                    json=self.body,
                )
                self.sent += 1
                if response.status_code != 200:
                    self.failures.append(f"{response.status_code} {response.text[:300]}")
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)


def _node_factory(folder: Path, settings_file: Path):
    from ficc_executor_process.provider import ProcessProvider

    async def no_gpus():
        return ()

    def make(named: str) -> Agent:
        return Agent(
            node_id=named,
            providers={"process": ProcessProvider(state_dir=folder / "p", default_grace=2.0)},
            state_dir=folder,
            settings=AgentSettings.load(settings_file),
            gpu_query=no_gpus,
            stop_grace=2.0,
        )

    return make


@asynccontextmanager
async def open_two_nodes(
    tmp_path: Path, *, requires_gpu_on_node_2: bool = False, **settings: Any
) -> AsyncIterator[Ops]:
    """A controller with the embedded node and a remote ``node-2``, the stand-in model on
    record; yields :class:`Ops`. ``requires_gpu_on_node_2``: node-2 declares the runtime
    as requiring a GPU (it has none)."""
    engine, agent_settings, files = write_fake_vllm(tmp_path)
    node_2_settings = agent_settings
    if requires_gpu_on_node_2:
        node_2_settings = tmp_path / "node-2.toml"
        node_2_settings.write_text(agent_settings.read_text() + "requires_gpu = true\n")
    folder = Path(tempfile.mkdtemp(prefix="fo-", dir="/tmp"))
    try:
        async with open_inference_controller(
            tmp_path, agent_config=str(agent_settings), **settings
        ) as controller:
            _, credential = await controller.service.contributors.add_node("node-2")
            remote = RemoteAgent(
                controller.url,
                credential,
                _node_factory(folder, node_2_settings),
                backoff_initial=0.1,
                backoff_max=0.5,
            )
            node_2 = trio.CancelScope()

            async def run_node_2() -> None:
                with node_2:
                    await remote.run()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_node_2)
                node = await controller.wait_node("node-2")
                while not node["snapshot"] or not node["snapshot"]["runtimes"]:
                    await trio.sleep(0.05)
                    node = await controller.node("node-2")
                model = await register_tiny_hf(controller, files)
                yield Ops(
                    controller=controller,
                    model_id=model["id"],
                    engine=engine,
                    node_2=node_2,
                    node_2_dir=folder,
                )
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
