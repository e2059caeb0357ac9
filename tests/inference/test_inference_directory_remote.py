"""A directory (Hugging Face format) model placed only on a remote node.

The node stages the model's files from the controller into its own cache (each
verified, as a single-file model's is), assembles its own copy of the tree from
them, and the engine reads that copy: the controller assembles no tree of its own
(only an embedded launch needs one), so nothing on the node points into the
controller's data directory. Once as an in-process remote agent (the operations
tests' node-2), once as a real ``ficc executor`` process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import trio

from ..agent.test_agent_processes import ExecutorProcess
from ..support.inference_support import Controller, open_inference_controller
from ..support.ops_support import open_two_nodes
from .test_inference_directory_models import chat, register_tiny_hf, vllm_spec, write_fake_vllm


async def _serves_from_its_own_tree(
    controller: Controller, spec: dict, agent_dir: Path, expected: dict[str, str]
) -> None:
    """Start ``spec`` (one replica on node-2): it is ready, reads node-2's own tree, serves."""
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    service_id = created["id"]
    assert (await controller.control(service_id, "start")).status_code == 200
    ready = await controller.wait_service(service_id, lambda v: v["state"] in ("ready", "failed"))
    assert ready["state"] == "ready", ready["replicas"]

    # The node's tree is made of hard links to the blobs it staged and verified.
    [tree] = list((agent_dir / "blobs" / "trees").iterdir())
    for path, sha in expected.items():
        staged = agent_dir / "blobs" / "sha256" / sha
        assert os.stat(tree / path).st_ino == os.stat(staged).st_ino
        assert hashlib.sha256(staged.read_bytes()).hexdigest() == sha
    # The controller assembled none: the engine's arguments never named its data dir.
    trees = controller.service.blobs.root / "trees"
    assert not trees.exists() or list(trees.iterdir()) == []

    response = await chat(controller, service_id)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "tiny"
    assert (await controller.control(service_id, "stop")).status_code == 200
    await controller.wait_service(service_id, lambda v: v["state"] == "stopped")


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_directory_model_only_on_an_in_process_remote_node_is_staged_there(tmp_path):
    with trio.fail_after(120):
        async with open_two_nodes(tmp_path) as ops:
            assert ops.node_2_dir is not None
            expected = {
                f["path"]: f["sha256"]
                for f in (await ops.controller.ok("GET", f"/api/v1/models/{ops.model_id}"))["files"]
            }
            spec = await ops.spec("node-2")
            await _serves_from_its_own_tree(ops.controller, spec, ops.node_2_dir, expected)


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_directory_model_only_on_an_executor_process_is_staged_there(tmp_path):
    engine, settings, files = write_fake_vllm(tmp_path)
    expected = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
    agent_dir = Path(tempfile.mkdtemp(prefix="fr-", dir="/tmp"))
    executor = None
    try:
        with trio.fail_after(120):
            async with open_inference_controller(
                tmp_path, agent_config=str(settings)
            ) as controller:
                _, credential = await controller.service.contributors.add_node("node-2")
                executor = ExecutorProcess(
                    controller.url, credential, agent_dir, "--agent-config", str(settings)
                )
                await executor.wait_connected()
                node = await controller.wait_node("node-2")
                while not node["snapshot"] or not node["snapshot"]["runtimes"]:
                    await trio.sleep(0.05)
                    node = await controller.node("node-2")
                model = await register_tiny_hf(controller, files)
                spec = await vllm_spec(controller, model["id"], engine)
                spec["placements"][0]["node_id"] = "node-2"
                await _serves_from_its_own_tree(controller, spec, agent_dir, expected)
    finally:
        if executor is not None:
            executor.kill()
        shutil.rmtree(agent_dir, ignore_errors=True)
