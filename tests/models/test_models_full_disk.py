"""A full disk under a real `ficc serve`: refused 507 with the offset, never left full.

The data directory (the SQLite store and the blobs) is a 40 MiB tmpfs the test
mounts, as an operator's small volume; uploads come in 16 MiB pieces.
"""

from __future__ import annotations

import hashlib
import os

import httpx
import pytest
import trio

from ..conftest import bearer
from ..support.httpsd import ServedFile
from ..support.models_support import (
    fill_disk,
    gguf_manifest,
    mounted_tmpfs,
    partial_file,
    poll_model,
    start_serve,
)

MiB = 1 << 20
OCTET = {"Content-Type": "application/octet-stream"}

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MiB tmpfs mounted at ``tmp_path/data``; unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "data", "40m") as mount:
        yield mount


@pytest.mark.deadline(600)
async def test_an_upload_that_fills_the_disk_is_refused_with_its_offset_and_frees_the_disk(
    tmp_path, ca_bundle, small_disk, monkeypatch
):
    monkeypatch.setenv("FICC_STORAGE_RESERVE", str(4 * MiB))
    data_dir = small_disk
    filler = os.urandom(12 * MiB)
    big = os.urandom(32 * MiB)
    server, url = await start_serve(tmp_path, ca_bundle, "embedded_agent = false\n")
    try:
        token = await server.admin_token()
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=30) as http:

            async def upload(model_id: str, offset: int, data: bytes) -> httpx.Response:
                return await http.post(
                    f"/api/v1/models/{model_id}/files/0/bytes",
                    params={"offset": offset},
                    content=data,
                    headers=OCTET,
                )

            first = (await http.post("/api/v1/models", json=gguf_manifest("f", filler))).json()
            assert (await upload(first["id"], 0, filler)).json()["state"] == "verified"
            model = (await http.post("/api/v1/models", json=gguf_manifest("big", big))).json()
            assert (await upload(model["id"], 0, big[: 16 * MiB])).status_code == 200

            # 12 + 16 MiB of blobs, the 4 MiB reserve and the store: 16 more do not fit.
            refused = await upload(model["id"], 16 * MiB, big[16 * MiB :])
            assert refused.status_code == 507, refused.text
            error = refused.json()["error"]
            assert error["code"] == "insufficient_storage"
            assert error["details"]["offset"] == 16 * MiB
            assert error["details"]["size"] == 32 * MiB
            assert "resume from offset 16777216" in error["message"]
            # Truncated back to its durable offset at once, and the reserve given back.
            partial = partial_file(data_dir, hashlib.sha256(big).hexdigest(), model["id"])
            assert partial.stat().st_size == 16 * MiB
            assert not (data_dir / "blobs" / "reserve").exists()
            assert os.statvfs(data_dir).f_bavail * os.statvfs(data_dir).f_frsize > 4 * MiB

            # The controller keeps serving and the store keeps writing.
            listed = (await http.get(f"/api/v1/models/{model['id']}")).json()
            assert listed["files"][0]["received_bytes"] == 16 * MiB
            other = await http.post("/api/v1/models", json=gguf_manifest("o", b"x" * 10))
            assert other.status_code == 201, other.text
            # While the disk is still too full, a retry is refused the same way.
            again = await upload(model["id"], 16 * MiB, big[16 * MiB :])
            assert again.status_code == 507, again.text
            assert again.json()["error"]["details"]["offset"] == 16 * MiB
            assert partial.stat().st_size == 16 * MiB

            # Freeing space works: delete the filler and its blob.
            deleted = await http.delete(f"/api/v1/models/{first['id']}", params={"evict": "true"})
            assert deleted.status_code == 200, deleted.text

            # The upload resumes from its offset, completes and verifies.
            done = await upload(model["id"], 16 * MiB, big[16 * MiB :])
            assert done.status_code == 200, done.text
            assert done.json()["state"] == "verified"
            published = data_dir / "blobs" / "sha256" / hashlib.sha256(big).hexdigest()
            assert (
                hashlib.sha256(published.read_bytes()).hexdigest()
                == hashlib.sha256(big).hexdigest()
            )
            assert (data_dir / "blobs" / "reserve").stat().st_size == 4 * MiB

            # Something else fills the disk to the last block: deleting still works
            # (the reserve is given back first), and frees the space.
            hog = data_dir / "hog"
            await trio.to_thread.run_sync(fill_disk, hog)
            deleted = await http.delete(f"/api/v1/models/{model['id']}", params={"evict": "true"})
            assert deleted.status_code == 200, deleted.text
            assert not published.exists()
    finally:
        server.proc.terminate()
        server.kill()


@pytest.mark.deadline(600)
async def test_an_acquisition_that_fills_the_disk_fails_with_its_offset(
    tmp_path, ca_bundle, small_disk, https_server, monkeypatch
):
    monkeypatch.setenv("FICC_STORAGE_RESERVE", str(4 * MiB))
    data_dir = small_disk
    content = os.urandom(48 * MiB)
    sha = hashlib.sha256(content).hexdigest()
    https_server.add("/m.gguf", ServedFile(content))
    server, url = await start_serve(tmp_path, ca_bundle, "embedded_agent = false\n")
    try:
        token = await server.admin_token()
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=30) as http:
            manifest = gguf_manifest("m", content, url=https_server.url("/m.gguf"))
            model = (await http.post("/api/v1/models", json=manifest)).json()
            assert (await http.post(f"/api/v1/models/{model['id']}/acquire")).status_code == 202
            failed = await poll_model(
                http, model["id"], lambda m: m["acquisition"]["state"] != "running"
            )
            file = failed["files"][0]
            assert file["error"]["code"] == "insufficient_storage", failed
            offset = file["error"]["details"]["offset"]
            assert 0 < offset < len(content)
            assert file["received_bytes"] == offset
            assert failed["acquisition"]["error"]["code"] == "insufficient_storage", failed
            partial = partial_file(data_dir, sha, model["id"])
            assert partial.stat().st_size == offset
            assert partial.read_bytes() == content[:offset]
            assert not (data_dir / "blobs" / "reserve").exists()
            # The store still writes: another model registers.
            other = await http.post("/api/v1/models", json=gguf_manifest("o", b"x" * 10))
            assert other.status_code == 201, other.text
    finally:
        server.proc.terminate()
        server.kill()
