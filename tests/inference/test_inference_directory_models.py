"""A directory (Hugging Face format) model on the embedded node, through the vllm adapter.

vLLM itself needs a minute to start on this CPU (its own tests cover it); here the
runtime is a stand-in for the ``vllm`` command that checks the model directory the
job names (every file present, read-only, the right bytes) and then serves the
OpenAI routes. The directory is assembled by the controller from the verified
blobs (hard links), once, and removed when the model's content is evicted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ..support.inference_support import Controller, open_inference_controller
from ..support.models_support import random_bytes

GIB = 1024**3

_FAKE_VLLM = """#!{python}
# A stand-in for `vllm serve <model dir> --uds <socket> ...`: checks the model
# directory, then serves the OpenAI routes on the socket.
import hashlib, json, os, sys
argv = sys.argv[1:]
assert argv[0] == "serve", argv
model, sock = argv[1], argv[argv.index("--uds") + 1]
expected = json.loads({expected!r})
for path, sha in expected.items():
    full = os.path.join(model, path)
    with open(full, "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == sha, path
    assert not os.access(full, os.W_OK), path  # inputs are admitted read-only
os.execv(sys.executable, [sys.executable, "-m", "ficc_core.testing.standin_engine",
                          "--socket", sock])
"""


def _files() -> dict[str, bytes]:
    return {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(),
        "tokenizer/tokenizer.json": b"{}",
        "model.safetensors": random_bytes(64 * 1024, seed=7),
    }


def write_fake_vllm(folder: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """The stand-in ``vllm`` and the agent settings that declare it; the model's files."""
    files = _files()
    expected = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
    engine = folder / "vllm"
    engine.write_text(_FAKE_VLLM.format(python=sys.executable, expected=json.dumps(expected)))
    engine.chmod(0o755)
    digest = "sha256:" + hashlib.sha256(engine.read_bytes()).hexdigest()
    settings = folder / "agent.toml"
    settings.write_text(
        "[[runtimes]]\n"
        'name = "vllm"\nprovider = "process"\n'
        f'image_digest = "{digest}"\nexecutable = "{engine}"\n'
    )
    return engine, settings, files


async def register_tiny_hf(controller: Controller, files: dict[str, bytes]) -> dict[str, Any]:
    """Register the directory model and upload its files; return it once verified."""
    manifest = {
        "name": "tiny-hf",
        "format": "hf-directory",
        "files": [
            {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for path, data in files.items()
        ],
    }
    model = await controller.ok("POST", "/api/v1/models", status=201, json=manifest)
    for index, file in enumerate(model["files"]):
        response = await controller.call(
            "POST",
            f"/api/v1/models/{model['id']}/files/{file['index']}/bytes",
            params={"offset": 0},
            content=files[file["path"]],
            headers={"Content-Type": "application/octet-stream"},
        )
        assert response.status_code in (200, 201), (index, response.text)
    model_url = f"/api/v1/models/{model['id']}"
    while (await controller.ok("GET", model_url))["state"] != "verified":  # noqa: ASYNC110
        await trio.sleep(0.02)
    return model


async def vllm_spec(
    controller: Controller, model_id: str, engine: Path, alias: str = "tiny"
) -> dict[str, Any]:
    """A vllm specification for the stand-in, on the embedded node."""
    node = await controller.node()
    [runtime] = [r for r in node["snapshot"]["runtimes"] if r["name"] == "vllm"]
    return {
        "alias": alias,
        "model_id": model_id,
        "engine": "vllm",
        "runtime": {
            "executor_provider": "process",
            "package_digest": runtime["package_digest"],
            "image_digest": runtime["image_digest"],
            "isolation": "process",
        },
        "image_executable": str(engine),
        "context": 512,
        "concurrency": 2,
        "placements": [{"node_id": "local", "limits": {"cpus": 1, "memory_bytes": 2 * GIB}}],
    }


async def chat(controller: Controller, service_id: str) -> httpx.Response:
    """One chat completion through the gateway, with a fresh invoke token."""
    issued = await controller.ok(
        "POST", f"/api/v1/inference/{service_id}/tokens", status=201, json={"lifetime": 60}
    )
    return await controller.http.post(
        f"/api/v1/inference/{service_id}/v1/chat/completions",
        headers={"Authorization": f"Bearer {issued['token']}"},
        json={"messages": [{"role": "user", "content": "hi"}]},
    )


@pytest.mark.slow
@pytest.mark.deadline(130)
async def test_a_directory_model_is_assembled_in_place_for_the_embedded_node(tmp_path):
    engine, settings, files = write_fake_vllm(tmp_path)
    expected = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
    with trio.fail_after(120):
        async with open_inference_controller(tmp_path, agent_config=str(settings)) as controller:
            model = await register_tiny_hf(controller, files)
            model_url = f"/api/v1/models/{model['id']}"
            spec = await vllm_spec(controller, model["id"], engine)
            created = await controller.ok("POST", "/api/v1/inference", status=201, json=spec)
            service_id = created["id"]
            assert (await controller.control(service_id, "start")).status_code == 200
            ready = await controller.wait_service(
                service_id, lambda v: v["state"] in ("ready", "failed")
            )
            assert ready["state"] == "ready", ready["replicas"]

            # The tree lives in the blob store, made of hard links to the verified blobs.
            blobs = controller.service.blobs
            trees = list((blobs.root / "trees").iterdir())
            assert len(trees) == 1
            for path, sha in expected.items():
                linked = trees[0] / path
                assert os.stat(linked).st_ino == os.stat(blobs.published_path(sha)).st_ino
            # (The stand-in refused to start unless it saw every file read-only: the
            # executor admits inputs read-only.)

            # The gateway reaches it like any engine.
            response = await chat(controller, service_id)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == "tiny"

            # A restart of the replica reuses the tree; evicting the model removes it.
            assert (await controller.control(service_id, "remove")).status_code == 200
            while (  # noqa: ASYNC110
                await controller.call("GET", f"/api/v1/inference/{service_id}")
            ).status_code != 404:
                await trio.sleep(0.05)
            await controller.ok("DELETE", model_url, params={"evict": "true"})
            assert list((blobs.root / "trees").iterdir()) == []
