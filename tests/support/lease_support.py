"""Two controllers on one store (one SQLite file, one blob directory), and a remote node
connected to both, for the several-controllers tests.

Each controller is served in a task of its own (so either can end while the other
goes on); the node is one real :class:`~ficc_core.agent.Agent` running the stand-in
``vllm`` engine, with a real remote-agent connection to each controller.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from ficc_core.agent.remote import RemoteAgent
from ficc_core.inference import ModelContexts

from ..inference.test_inference_directory_models import register_tiny_hf, write_fake_vllm
from .inference_support import GIB, Controller, open_inference_controller
from .ops_support import _node_factory
from .waiting import eventually

#: Short leases, so a takeover takes a second or two.
FAST = {"leader_lease": "1.5s", "leader_renew_interval": "300ms", "follow_interval": "200ms"}


@attrs.define
class Served:
    """A controller served in its own task; :meth:`end` shuts it down cleanly."""

    controller: Controller
    stop: trio.Event
    done: trio.Event

    async def end(self) -> None:
        self.stop.set()
        await self.done.wait()


async def serve(nursery: trio.Nursery, tmp_path: Path, name: str, **settings: Any) -> Served:
    """Serve controller ``name`` on ``tmp_path``'s data directory (no embedded agent)."""
    stop, done = trio.Event(), trio.Event()

    async def run(task_status: trio.TaskStatus[Controller]) -> None:
        try:
            async with open_inference_controller(
                tmp_path, embedded=False, controller_id=name, **{**FAST, **settings}
            ) as controller:
                task_status.started(controller)
                await stop.wait()
        finally:
            done.set()

    controller = await nursery.start(run)
    return Served(controller, stop, done)


@attrs.define
class Pair:
    """Controllers ``a`` (started first: the leader) and ``b``, the node and the model."""

    a: Served
    b: Served
    model_id: str
    engine: Path
    tmp_path: Path
    nursery: trio.Nursery

    async def spec(self, alias: str = "tiny") -> dict[str, Any]:
        node = await self.a.controller.node("node-2")
        [runtime] = [r for r in node["snapshot"]["runtimes"] if r["name"] == "vllm"]
        return {
            "alias": alias,
            "model_id": self.model_id,
            "engine": "vllm",
            "runtime": {
                "executor_provider": "process",
                "package_digest": runtime["package_digest"],
                "image_digest": runtime["image_digest"],
                "isolation": "process",
            },
            "image_executable": str(self.engine),
            "context": 512,
            "concurrency": 2,
            "placements": [
                {"node_id": "node-2", "limits": {"cpus": 0.25, "memory_bytes": 2 * GIB}}
            ],
        }


@asynccontextmanager
async def open_pair(tmp_path: Path) -> AsyncIterator[Pair]:
    """Controllers ``ctl-a`` (the leader) and ``ctl-b`` (a standby) on one data directory,
    and node ``node-2`` connected to both."""
    engine, settings, files = write_fake_vllm(tmp_path)
    folder = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    try:
        async with trio.open_nursery() as nursery:
            a = await serve(nursery, tmp_path, "ctl-a")
            b = await serve(nursery, tmp_path, "ctl-b")
            _, credential = await a.controller.service.contributors.add_node("node-2")
            # One agent with a link to each controller, as `ficc executor --controller A
            # --controller B` runs it.
            remote = RemoteAgent(
                [a.controller.url, b.controller.url],
                credential,
                _node_factory(folder, settings),
                backoff_initial=0.1,
                backoff_max=0.5,
            )
            nursery.start_soon(remote.run)
            with trio.fail_after(30):
                for served in (a, b):
                    await eventually(
                        lambda served=served: served.controller.service.contributors.connected_here(
                            "node-2"
                        ),
                        None,
                        every=0.05,
                    )
                node = await a.controller.wait_node("node-2")
                while not node["snapshot"] or not node["snapshot"]["runtimes"]:
                    await trio.sleep(0.05)
                    node = await a.controller.node("node-2")
                model = await register_tiny_hf(a.controller, files)
                # The node shares this machine's disk and has no stager: it reads the model
                # directory where an embedded node would, assembled in the shared blob store.
                service = a.controller.service
                project = (await a.controller.ok("GET", "/api/v1/whoami"))["project"]
                context = await ModelContexts(models=service.models, blobs=service.blobs).get(
                    project["id"], model["id"]
                )
                for tree in context.directories.values():
                    await service.blobs.assemble_tree(tree)
            yield Pair(a, b, model["id"], engine, tmp_path, nursery)
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
