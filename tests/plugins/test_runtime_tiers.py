"""Runtimes that require a GPU: declared by a plugin, advertised by the agent, refused on a
node without GPUs (422 ``tier_mismatch``) by create, replace, start and preview, and their
default GPU memory suggested by a preview.

Nodes with GPUs cannot exist on this machine, so (as in tests/inference/test_inference_api.py) the
API tests' nodes report their snapshots through the real registry; the plugin, the agent's
check of the runtime and the snapshot it advertises are real.
"""

from __future__ import annotations

import attrs
import pytest
import trio

from ficc_core import PluginError, RuntimeRegistry
from ficc_core.agent import AgentSettings, check_runtime
from ficc_core.base.errors import ConfigError
from ficc_core.inference.specification.tiers import TierMismatch, check_tier
from ficc_core.plugins import build_plugin_manager
from ficc_core.schema import (
    ExecutorSnapshot,
    GpuDevice,
    InstalledRuntime,
    NodeResources,
    ProviderInfo,
    structure,
    unstructure,
)

from ..inference.test_inference_api import _placement, _spec, _tiny_model
from ..support.inference_support import open_inference_controller
from .test_plugins_registry import plugin

GIB = 1024**3
PACKAGE = "sha256:" + "a" * 64
IMAGE = "sha256:" + "b" * 64  # what tests/inference/test_inference_api.py's _spec binds
DEFAULT_GPU_MEMORY = 4 * GIB


def _declare_gpu_runtime(registry: RuntimeRegistry) -> None:
    registry.add(
        "gpu_llama",
        provider="process",
        executable="/opt/gpu-llama/bin/serve",
        engines=["llama_cpp"],
        isolation="process",
        requires_gpu=True,
        default_gpu_memory_bytes=DEFAULT_GPU_MEMORY,
    )


# -- the declaration: plugin hook, agent settings, snapshot ---------------------------------


async def test_a_plugin_runtime_that_requires_a_gpu_is_advertised_so(tmp_path):
    plugin_set = build_plugin_manager(
        autoload=False, extra_plugins=[plugin("gpu", ficc_register_runtimes=_declare_gpu_runtime)]
    )
    assert plugin_set.refused == ()
    declared = plugin_set.runtimes["gpu_llama"]
    assert (declared.requires_gpu, declared.default_gpu_memory_bytes) == (True, DEFAULT_GPU_MEMORY)
    # The agent advertises both in the runtime it checked.
    engine = tmp_path / "serve"
    engine.write_bytes(b"#!/bin/sh\nexec true\n")
    check = await check_runtime(attrs.evolve(declared, executable=engine), {"process": PACKAGE})
    assert check.problem is None
    document = unstructure(check.installed)
    assert document["requires_gpu"] is True
    assert document["default_gpu_memory_bytes"] == DEFAULT_GPU_MEMORY
    assert structure(document, InstalledRuntime) == check.installed


async def test_a_runtime_that_runs_on_cpus_leaves_both_fields_out_of_its_snapshot(tmp_path):
    plugin_set = build_plugin_manager(autoload=True)
    llama = plugin_set.runtimes["llama_server"]
    assert (llama.requires_gpu, llama.default_gpu_memory_bytes) == (False, None)
    check = await check_runtime(llama, {"process": PACKAGE})
    document = unstructure(check.installed)
    # An older controller (which refuses unknown fields) still reads the snapshot.
    assert "requires_gpu" not in document and "default_gpu_memory_bytes" not in document
    # A snapshot from an older node, without either field, still parses.
    del document["engines"]
    assert structure(document, InstalledRuntime).requires_gpu is None


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"requires_gpu": "yes"}, "has requires_gpu 'yes': give true or false"),
        ({"default_gpu_memory_bytes": 0}, "has default_gpu_memory_bytes 0"),
        ({"default_gpu_memory_bytes": 1.5}, "has default_gpu_memory_bytes 1.5"),
        ({"default_gpu_memory_bytes": True}, "has default_gpu_memory_bytes True"),
    ],
)
def test_a_bad_tier_declaration_is_refused_naming_the_runtime(overrides, problem):
    registry = RuntimeRegistry()
    with pytest.raises(PluginError, match="runtime 'r'") as refused:
        registry.add(
            "r",
            provider="process",
            executable="/opt/r",
            engines=["e"],
            isolation="process",
            **overrides,
        )
    assert problem in str(refused.value)


def test_agent_settings_declare_the_tier_fields_too():
    runtime = {
        "name": "gpu_llama",
        "provider": "process",
        "image_digest": IMAGE,
        "executable": "/opt/x",
        "requires_gpu": True,
        "default_gpu_memory_bytes": GIB,
    }
    settings = AgentSettings.from_document({"runtimes": [runtime]}, "agent.toml")
    [declared] = settings.runtimes
    assert (declared.requires_gpu, declared.default_gpu_memory_bytes) == (True, GIB)
    for key, value in (("requires_gpu", 1), ("default_gpu_memory_bytes", -1)):
        with pytest.raises(ConfigError, match=rf"runtimes\[0\]\.{key} must be"):
            AgentSettings.from_document({"runtimes": [{**runtime, key: value}]}, "agent.toml")


def test_check_tier_is_the_peers_refusal():
    check_tier("llama_server", False, "cpu-1", 0, action="move")
    check_tier("vllm", True, "gpu-1", 2, action="move")
    with pytest.raises(TierMismatch) as refused:
        check_tier("llama_server", True, "cpu-1", 0, action="move")
    error = refused.value
    assert (error.status, error.code) == (422, "tier_mismatch")
    assert error.message == "llama_server requires a GPU; node cpu-1 has none"
    assert error.details == {
        "action": "move",
        "runtime": "llama_server",
        "node": "cpu-1",
        "reason": "tier_mismatch",
        "target_gpus": 0,
    }


# -- the API: create, replace, start and preview -------------------------------------------


async def _node(controller, node_id: str, *, gpus: tuple[int, ...]) -> None:
    """Register ``node_id`` with the GPU runtime and ``gpus`` (memory of each), connected."""
    registry = controller.service.contributors
    if node_id not in {node.id for node in await registry.list()}:
        await registry.add_node(node_id)
    connection = await registry.connect(node_id)
    snapshot = ExecutorSnapshot(
        node_id=node_id,
        providers=[ProviderInfo(name="process", package_digest=PACKAGE)],
        resources=NodeResources(
            cpus=16,
            memory_bytes=64 * GIB,
            disk_free_bytes=1000 * GIB,
            gpus=[
                GpuDevice(index=index, name="NVIDIA H100", memory_bytes=size)
                for index, size in enumerate(gpus)
            ],
        ),
        runtimes=[
            InstalledRuntime(
                name="gpu_llama",
                executor_provider="process",
                package_digest=PACKAGE,
                image_digest=IMAGE,
                engines=["llama_cpp"],
                executable="/opt/gpu-llama/bin/serve",
                isolation="process",
                requires_gpu=True,
                default_gpu_memory_bytes=DEFAULT_GPU_MEMORY,
            )
        ],
        endpoint_version=1,
    )
    await registry.heartbeat(node_id, connection, snapshot)


def _refused_tier(response, action: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "tier_mismatch"
    assert error["message"] == "gpu_llama requires a GPU; node cpu-1 has none"
    assert error["details"] == {
        "action": action,
        "runtime": "gpu_llama",
        "node": "cpu-1",
        "reason": "tier_mismatch",
        "target_gpus": 0,
    }


@pytest.fixture
async def controller(tmp_path):
    with trio.fail_after(60):
        async with open_inference_controller(tmp_path, embedded=False) as controller:
            await _node(controller, "cpu-1", gpus=())
            await _node(controller, "gpu-1", gpus=(80 * GIB, 80 * GIB))
            yield controller


async def test_create_replace_and_preview_refuse_a_gpu_runtime_on_a_node_without_gpus(
    controller,
):
    model_id = await _tiny_model(controller)
    on_cpu = _spec(model_id, _placement("cpu-1"))
    _refused_tier(await controller.call("POST", "/api/v1/inference", json=on_cpu), "create")
    preview = await controller.call("POST", "/api/v1/inference/preview", json=on_cpu)
    _refused_tier(preview, "preview")
    assert (await controller.ok("GET", "/api/v1/inference"))["services"] == []

    # On the GPU node it is admitted; replacing it onto the CPU node is refused, unchanged.
    on_gpu = _spec(model_id, _placement("gpu-1", gpus=[(0, GIB)]))
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=on_gpu)
    response = await controller.call(
        "PUT",
        f"/api/v1/inference/{created['id']}",
        json={"revision": created["revision"], "spec": on_cpu},
    )
    _refused_tier(response, "replace")
    kept = await controller.ok("GET", f"/api/v1/inference/{created['id']}")
    assert kept["revision"] == created["revision"]
    assert kept["spec"]["placements"][0]["node_id"] == "gpu-1"


async def test_start_refuses_when_the_node_no_longer_reports_a_gpu(controller):
    model_id = await _tiny_model(controller)
    spec = _spec(model_id, _placement("cpu-1"))
    # The node had a GPU when the service was created; its GPU is gone by the start.
    await _node(controller, "cpu-1", gpus=(80 * GIB,))
    created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
    await _node(controller, "cpu-1", gpus=())
    _refused_tier(await controller.control(created["id"], "start"), "start")
    assert (await controller.ok("GET", f"/api/v1/inference/{created['id']}"))["state"] == "stopped"


async def test_preview_suggests_the_runtimes_gpu_memory_and_skips_nodes_without_gpus(controller):
    model_id = await _tiny_model(controller)
    partial = {
        "alias": "svc",
        "model_id": model_id,
        "engine": "llama_cpp",
        "context": 512,
        "concurrency": 1,
    }
    preview = await controller.ok("POST", "/api/v1/inference/preview", json=partial)
    assert preview["fits"] is True
    [placement] = preview["spec"]["placements"]
    # cpu-1 sorts first but cannot run the runtime: the replica goes on gpu-1.
    assert placement["node_id"] == "gpu-1"
    assert placement["limits"]["gpus"] == [{"index": 0, "memory_bytes": DEFAULT_GPU_MEMORY}]
    assert "$.placements[0].limits" in preview["suggested"]

    # Given limits without gpus: only the gpus are filled, and named.
    limits = {"cpus": 2, "memory_bytes": 8 * GIB}
    given = await controller.ok(
        "POST",
        "/api/v1/inference/preview",
        json={**partial, "placements": [{"node_id": "gpu-1", "limits": limits}] * 2},
    )
    assert [p["limits"]["gpus"] for p in given["spec"]["placements"]] == [
        [{"index": 0, "memory_bytes": DEFAULT_GPU_MEMORY}],
        # The second replica goes on the GPU with the most memory left.
        [{"index": 1, "memory_bytes": DEFAULT_GPU_MEMORY}],
    ]
    assert "$.placements[0].limits.gpus" in given["suggested"]
    assert "$.placements[1].limits.gpus" in given["suggested"]
    # A replica's given GPU memory counts: the suggestion goes where memory is left.
    taken = {**limits, "gpus": [{"index": 0, "memory_bytes": 70 * GIB}]}
    mixed = await controller.ok(
        "POST",
        "/api/v1/inference/preview",
        json={
            **partial,
            "placements": [
                {"node_id": "gpu-1", "limits": taken},
                {"node_id": "gpu-1", "limits": limits},
            ],
        },
    )
    assert mixed["spec"]["placements"][1]["limits"]["gpus"][0]["index"] == 1
    # Given gpus (even none) are the operator's: nothing is suggested for them.
    none = await controller.ok(
        "POST",
        "/api/v1/inference/preview",
        json={**partial, "placements": [{"node_id": "gpu-1", "limits": {**limits, "gpus": []}}]},
    )
    assert none["spec"]["placements"][0]["limits"]["gpus"] == []
    assert not any("gpus" in path for path in none.get("suggested", []))
