"""`ficc models ...` as real subprocesses against a real `ficc serve`."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import httpx
import pytest
import trio

from ficc_core.cli.client import ApiClient
from ficc_core.cli.models_transfer import upload_file

from ..conftest import bearer
from ..support.httpsd import ServedFile
from ..support.models_support import gguf_manifest, random_bytes, tiny_gguf

MiB = 1 << 20


async def ficc(*args: str, env_extra: dict[str, str]) -> trio.CompletedProcess:
    env = {**os.environ, **env_extra}
    with trio.fail_after(120):
        return await trio.run_process(
            [sys.executable, "-m", "ficc_core", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )


@pytest.mark.deadline(60)
async def test_register_upload_show_list_delete_through_the_cli(tmp_path, serve_process):
    url, token = serve_process
    env = {"FICC_URL": url, "FICC_TOKEN": token}
    local = tmp_path / "tiny.gguf"
    content = tiny_gguf(local, size=3 * MiB + 5, seed=31)

    registered = await ficc("models", "register", "--gguf", str(local), "--json", env_extra=env)
    assert registered.returncode == 0, registered.stderr
    model = json.loads(registered.stdout)
    assert model["files"][0]["sha256"] == hashlib.sha256(content).hexdigest()

    # An earlier, interrupted upload left 1 MiB on the server.
    async with httpx.AsyncClient(base_url=url, headers=bearer(token)) as http:
        first = await http.post(
            f"/api/v1/models/{model['id']}/files/0/bytes?offset=0",
            content=content[:MiB],
            headers={"Content-Type": "application/octet-stream"},
        )
        assert first.json()["received_bytes"] == MiB
    uploaded = await ficc("models", "upload", model["id"], str(local), env_extra=env)
    assert uploaded.returncode == 0, uploaded.stderr
    assert b"tiny.gguf: verified" in uploaded.stdout
    assert b"%" in uploaded.stderr  # the progress bar

    shown = json.loads((await ficc("models", "show", model["id"], "--json", env_extra=env)).stdout)
    assert shown["state"] == "verified"
    listed = (await ficc("models", "list", env_extra=env)).stdout.decode()
    assert model["id"] in listed and "verified" in listed

    deleted = await ficc("models", "delete", model["id"], "--evict", "--json", env_extra=env)
    assert json.loads(deleted.stdout)["evicted"] == [hashlib.sha256(content).hexdigest()]
    missing = await ficc("models", "show", model["id"], env_extra=env)
    assert missing.returncode != 0
    assert b"[model_not_found]" in missing.stderr
    assert model["id"].encode() in missing.stderr


@pytest.mark.deadline(60)
async def test_acquire_wait_follows_progress_to_verified(tmp_path, serve_process, https_server):
    content = random_bytes(6 * MiB, seed=32)
    https_server.add("/m.gguf", ServedFile(content, chunk_delay=0.002))
    url, token = serve_process
    env = {"FICC_URL": url, "FICC_TOKEN": token}
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(gguf_manifest("m", content, url=https_server.url("/m.gguf"))))
    registered = await ficc("models", "register", str(manifest), "--json", env_extra=env)
    model = json.loads(registered.stdout)
    result = await ficc(
        "models", "acquire", model["id"], "--wait", "--interval", "0.1", env_extra=env
    )
    assert result.returncode == 0, result.stderr
    assert b"m: verified" in result.stdout
    assert b"MiB/s" in result.stderr


@pytest.mark.deadline(60)
async def test_upload_ends_verified_when_another_model_verifies_the_content_meanwhile(
    tmp_path, serve_process
):
    url, token = serve_process
    content = random_bytes(2 * MiB, seed=32)
    local = tmp_path / "m.gguf"
    local.write_bytes(content)
    octet = {"Content-Type": "application/octet-stream"}
    async with httpx.AsyncClient(base_url=url, headers=bearer(token)) as http:
        ids = [
            (await http.post("/api/v1/models", json=gguf_manifest(name, content))).json()["id"]
            for name in ("mine", "other")
        ]

    class OtherFinishesFirst(ApiClient):
        """Before this upload's first write, the other model uploads the same content."""

        raced = False

        def json(self, method: str, path: str, **kwargs):
            if method == "POST" and not self.raced:
                self.raced = True
                other = f"/api/v1/models/{ids[1]}/files/0/bytes?offset=0"
                assert super().json("POST", other, content=content, headers=octet)["state"] == (
                    "verified"
                )
            return super().json(method, path, **kwargs)

    client = OtherFinishesFirst(url, token)
    file = await trio.to_thread.run_sync(upload_file, client, ids[0], 0, local)
    assert client.raced and file["state"] == "verified"
