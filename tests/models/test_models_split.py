"""A split GGUF through the controller: one model of every part, and the job that loads it.

llama.cpp opens a split GGUF's first part and finds the others beside it by their
names, so the job's one input is a directory holding every part under its own
name, and ``--model`` names the first part inside it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ficc_core import Placement, ResourceLimits, Runtime, Specification
from ficc_core.inference.specification.model_context import ModelContexts
from ficc_core.models.gguf import read_gguf_file
from ficc_core.testing.models import split_gguf

from ..conftest import bearer
from ..support.models_support import smollm2_path

DIGEST = "sha256:" + "0" * 64


@pytest.mark.deadline(180)
async def test_the_llama_cpp_job_of_a_split_model_has_every_part_beside_the_first(
    service, bootstrap, client, tmp_path
):
    parts = split_gguf(smollm2_path(), tmp_path / "split", parts=2, stem="smol")
    admin = bearer(bootstrap["token"])
    manifest = {
        "name": "smol",
        "format": "gguf",
        "files": [  # listed last part first: the order of the parts is their numbers'
            {"path": f"q4/{p.name}", "size": p.stat().st_size,
             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
            for p in reversed(parts)
        ],
    }  # fmt: skip
    model = await (await client.post("/api/v1/models", headers=admin, json=manifest)).get_json()
    shown = await (await client.get(f"/api/v1/models/{model['id']}", headers=admin)).get_json()
    assert shown["metadata"] is None  # read from the verified files only
    for index, file in enumerate(manifest["files"]):
        content = (tmp_path / "split" / file["path"].removeprefix("q4/")).read_bytes()
        for offset in range(0, len(content), 16 << 20):
            uploaded = await client.post(
                f"/api/v1/models/{model['id']}/files/{index}/bytes?offset={offset}",
                headers={**admin, "Content-Type": "application/octet-stream"},
                data=content[offset : offset + (16 << 20)],
            )
            assert uploaded.status_code == 200, await uploaded.get_json()
    project = (await (await client.get("/api/v1/whoami", headers=admin)).get_json())["project"]
    shown = await (await client.get(f"/api/v1/models/{model['id']}", headers=admin)).get_json()
    assert shown["state"] == "verified"
    assert shown["metadata"]["split_count"] == 2
    assert [f["path"] for f in shown["files"]] == [f["path"] for f in manifest["files"]]

    context = await ModelContexts(models=service.models, blobs=service.blobs).get(
        project["id"], model["id"]
    )
    [model_input] = context.inputs
    assert model_input.digest is None  # a directory, not one file
    assert context.directories == {
        "model": {f["path"]: (f["sha256"], f["size"]) for f in manifest["files"]}
    }
    whole = read_gguf_file(smollm2_path())
    assert context.record.metadata.parameter_count == whole.parameter_count
    assert context.record.metadata.context_length == whole.context_length

    placement = Placement(node_id="node-1", limits=ResourceLimits(cpus=1, memory_bytes=1 << 30))
    specification = Specification(
        alias="smol",
        model_id=model["id"],
        engine="llama_cpp",
        runtime=Runtime(
            executor_provider="process",
            package_digest=DIGEST,
            image_digest=DIGEST,
            isolation="process",
        ),
        image_executable="/usr/bin/llama-server",
        context=512,
        concurrency=1,
        placements=[placement],
    )
    job = service.plugins.adapters["llama_cpp"].job(
        specification, context.record, placement, context.inputs
    )
    assert job.inputs == context.inputs
    # The embedded node assembles the directory where the input says (hard links).
    root = await service.blobs.assemble_tree(context.directories["model"])
    assert str(root) == model_input.path
    first = Path(job.argv[job.argv.index("--model") + 1])
    assert first == root / "q4" / parts[0].name
    assert sorted(os.listdir(first.parent)) == [part.name for part in parts]
    for part in parts:
        assert (first.parent / part.name).read_bytes() == part.read_bytes()
