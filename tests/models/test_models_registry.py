"""Registering, listing and deleting model manifests through the HTTP API."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time

from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.store.migrations import MIGRATIONS

from ..conftest import bearer, issue_token
from ..support.models_support import blob_files, gguf_manifest, random_bytes


def hf_manifest(name: str, files: dict[str, bytes]) -> dict:
    return {
        "name": name,
        "format": "hf-directory",
        "licence": "apache-2.0",
        "source": {"repository": "example/tiny", "revision": "abc123"},
        "files": [
            {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for path, data in files.items()
        ],
    }


async def test_register_is_idempotent_and_reports_absent_files(client, bootstrap):
    admin = bearer(bootstrap["token"])
    body = gguf_manifest("tiny", random_bytes(1000))
    first = await client.post("/api/v1/models", headers=admin, json=body)
    assert first.status_code == 201
    model = await first.get_json()
    assert model["state"] == "incomplete"
    assert model["files"][0]["state"] == "absent"
    assert model["files"][0]["verified_bytes"] == 0
    again = await client.post("/api/v1/models", headers=admin, json=body)
    assert again.status_code == 200
    assert (await again.get_json())["id"] == model["id"]


async def test_a_different_manifest_under_a_taken_name_is_409(client, bootstrap):
    admin = bearer(bootstrap["token"])
    await client.post("/api/v1/models", headers=admin, json=gguf_manifest("m", b"one"))
    response = await client.post("/api/v1/models", headers=admin, json=gguf_manifest("m", b"two"))
    assert response.status_code == 409
    assert (await response.get_json())["error"]["code"] == "model_exists"


async def test_hf_directory_manifests_need_config_json_and_safe_paths(client, bootstrap):
    admin = bearer(bootstrap["token"])
    good = hf_manifest(
        "hf", {"config.json": b"{}", "tokenizer.json": b"{}", "model.safetensors": b"w" * 10}
    )
    assert (await client.post("/api/v1/models", headers=admin, json=good)).status_code == 201
    for bad_path in ("/etc/passwd", "../escape", "a//b", "dir/../x"):
        bad = hf_manifest("bad", {"config.json": b"{}", bad_path: b"x"})
        response = await client.post("/api/v1/models", headers=admin, json=bad)
        assert response.status_code == 400, bad_path
        paths = [e["path"] for e in (await response.get_json())["error"]["details"]["errors"]]
        assert any(p.startswith("$.files[1].path") for p in paths), paths
    duplicate = hf_manifest("dup", {"config.json": b"{}"})
    duplicate["files"].append(dict(duplicate["files"][0]))
    assert (await client.post("/api/v1/models", headers=admin, json=duplicate)).status_code == 400
    plain_http = gguf_manifest("http", b"x", url="http://example.com/x.gguf")
    response = await client.post("/api/v1/models", headers=admin, json=plain_http)
    assert response.status_code == 400


async def test_models_are_project_scoped(client, service, bootstrap):
    admin = bearer(bootstrap["token"])
    mine = await (
        await client.post("/api/v1/models", headers=admin, json=gguf_manifest("mine", b"data"))
    ).get_json()
    await service.auth.create_project("other")
    theirs = bearer(
        await issue_token(service, project="other", scopes=["models:read", "models:manage"])
    )
    assert (await client.get(f"/api/v1/models/{mine['id']}", headers=theirs)).status_code == 404
    listed = await (await client.get("/api/v1/models", headers=theirs)).get_json()
    assert listed == {"models": []}
    for method, path in [
        ("POST", f"/api/v1/models/{mine['id']}/acquire"),
        ("POST", f"/api/v1/models/{mine['id']}/pause"),
        ("DELETE", f"/api/v1/models/{mine['id']}"),
    ]:
        response = await client.open(path, method=method, headers=theirs)
        assert response.status_code == 404, path
    upload = await client.post(
        f"/api/v1/models/{mine['id']}/files/0", headers=theirs, json={"offset": 0, "data": ""}
    )
    assert upload.status_code == 404
    # The same manifest in another project is another model, sharing the blob.
    other = await client.post("/api/v1/models", headers=theirs, json=gguf_manifest("mine", b"data"))
    assert other.status_code == 201
    assert (await other.get_json())["id"] != mine["id"]


async def test_a_verified_blob_makes_another_projects_manifest_verified_at_once(
    client, service, bootstrap, config
):
    admin = bearer(bootstrap["token"])
    content = random_bytes(5000, seed=3)
    model = await (
        await client.post("/api/v1/models", headers=admin, json=gguf_manifest("a", content))
    ).get_json()
    import base64

    await client.post(
        f"/api/v1/models/{model['id']}/files/0",
        headers=admin,
        json={"offset": 0, "data": base64.b64encode(content).decode()},
    )
    await service.auth.create_project("other")
    theirs = bearer(await issue_token(service, project="other", scopes=["models:manage"]))
    shared = await (
        await client.post("/api/v1/models", headers=theirs, json=gguf_manifest("b", content))
    ).get_json()
    assert shared["state"] == "verified"
    assert shared["files"][0]["verified_bytes"] == len(content)
    assert blob_files(config.data_dir)["sha256"] == [hashlib.sha256(content).hexdigest()]


async def test_delete_keeps_shared_content_and_evicts_unshared(client, bootstrap, config):
    admin = bearer(bootstrap["token"])
    import base64

    shared, own = random_bytes(300, seed=1), random_bytes(400, seed=2)
    ids = {}
    for name, files in {"one": [shared, own], "two": [shared]}.items():
        body = {
            "name": name,
            "format": "hf-directory",
            "files": [
                {
                    "path": "config.json",
                    "size": len(files[0]),
                    "sha256": hashlib.sha256(files[0]).hexdigest(),
                },
                *(
                    [
                        {
                            "path": "w.safetensors",
                            "size": len(files[1]),
                            "sha256": hashlib.sha256(files[1]).hexdigest(),
                        }
                    ]
                    if len(files) > 1
                    else []
                ),
            ],
        }
        model = await (await client.post("/api/v1/models", headers=admin, json=body)).get_json()
        ids[name] = model["id"]
        for index, data in enumerate(files):
            await client.post(
                f"/api/v1/models/{model['id']}/files/{index}",
                headers=admin,
                json={"offset": 0, "data": base64.b64encode(data).decode()},
            )
    assert len(blob_files(config.data_dir)["sha256"]) == 2
    response = await client.delete(f"/api/v1/models/{ids['one']}?evict=true", headers=admin)
    assert response.status_code == 200
    assert (await response.get_json())["evicted"] == [hashlib.sha256(own).hexdigest()]
    assert blob_files(config.data_dir)["sha256"] == [hashlib.sha256(shared).hexdigest()]
    assert (await client.get(f"/api/v1/models/{ids['one']}", headers=admin)).status_code == 404
    two = await (await client.get(f"/api/v1/models/{ids['two']}", headers=admin)).get_json()
    assert two["state"] == "verified"
    # Without evict, metadata goes and the content stays for reuse.
    await client.delete(f"/api/v1/models/{ids['two']}", headers=admin)
    assert blob_files(config.data_dir)["sha256"] == [hashlib.sha256(shared).hexdigest()]


async def test_progress_held_before_private_partials_moves_to_the_first_model_that_declared_it(
    tmp_path,
):
    """Upgrading from schema 8, where one partial per sha256 was shared by every model."""
    content = random_bytes(5000, seed=41)
    sha = hashlib.sha256(content).hexdigest()
    data = tmp_path / "data"
    (data / "blobs" / "partial").mkdir(parents=True)
    (data / "blobs" / "partial" / f"{sha}.part").write_bytes(content[:3000])
    stray = data / "blobs" / "partial" / "stray.part"
    stray.write_bytes(b"nobody's")
    # Idle past partial_tidy_after: no first write under way could own it.
    os.utime(stray, (time.time() - 3600, time.time() - 3600))
    with sqlite3.connect(data / "ficc.sqlite3") as db:
        for statements in MIGRATIONS[:8]:
            for statement in statements:
                db.execute(statement)
        db.execute("PRAGMA user_version = 8")
        db.execute("INSERT INTO projects VALUES ('p1', 'default', 0), ('p2', 'other', 0)")
        manifest = json.dumps(gguf_manifest("m", content))
        for model_id, project, created in (("first", "p1", 1.0), ("second", "p2", 2.0)):
            db.execute(
                "INSERT INTO models VALUES (?, ?, 'm', ?, 'd', ?)",
                (model_id, project, manifest, created),
            )
            db.execute(
                "INSERT INTO model_files VALUES (?, 0, 'model.gguf', ?, ?, NULL)",
                (model_id, len(content), sha),
            )
        db.execute("INSERT INTO blobs VALUES (?, ?, 'partial', 3000, NULL, 0)", (sha, len(content)))
    config = load_config(overrides={"data_dir": str(data)}, environ={})
    async with open_service(config, background=True) as service:
        first = await service.models.get("p1", "first")
        second = await service.models.get("p2", "second")
        assert first.files[0].received_bytes == 3000
        assert second.files[0].received_bytes == 0
        finished = await service.models.upload("p1", "first", 0, 3000, content[3000:])
        assert finished.state == "verified"
        assert (await service.models.get("p2", "second")).state == "verified"
    assert blob_files(data) == {"sha256": [sha], "partial": []}
