"""SIGKILL `ficc serve` mid-acquisition and mid-upload: nothing corrupt, resume from offsets."""

from __future__ import annotations

import hashlib

import httpx
import pytest
import trio

from ..conftest import bearer
from ..support.httpsd import ServedFile
from ..support.models_support import (
    blob_files,
    gguf_manifest,
    partial_file,
    poll_model,
    random_bytes,
    start_serve,
)

MiB = 1 << 20


@pytest.mark.deadline(60)
async def test_sigkill_mid_acquisition_then_restart_resumes_from_the_durable_offset(
    tmp_path, ca_bundle, https_server
):
    content = random_bytes(24 * MiB, seed=21)
    sha = hashlib.sha256(content).hexdigest()
    https_server.add("/m.gguf", ServedFile(content, chunk_delay=0.004))
    server, url = await start_serve(tmp_path, ca_bundle)
    try:
        token = await server.admin_token()
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=10) as http:
            model = (
                await http.post(
                    "/api/v1/models",
                    json=gguf_manifest("m", content, url=https_server.url("/m.gguf")),
                )
            ).json()
            assert (await http.post(f"/api/v1/models/{model['id']}/acquire")).status_code == 202
            seen = await poll_model(http, model["id"], lambda m: m["received_bytes"] >= 8 * MiB)
        server.proc.kill()
        server.proc.wait()
    finally:
        server.kill()
    assert seen["received_bytes"] < len(content)
    on_disk = blob_files(tmp_path / "data")
    assert on_disk["sha256"] == []  # nothing published unverified
    partial = partial_file(tmp_path / "data", sha, model["id"])
    kept = partial.stat().st_size
    assert seen["received_bytes"] <= kept < len(content)
    assert partial.read_bytes() == content[:kept]  # no corrupt bytes

    restarted, url = await start_serve(tmp_path, ca_bundle)
    try:
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=10) as http:
            # The acquisition was running: it resumes by itself.
            done = await poll_model(
                http, model["id"], lambda m: m["state"] in ("verified", "failed")
            )
        assert done["state"] == "verified", done
    finally:
        restarted.proc.terminate()
        restarted.kill()
    resumed = https_server.requests[-1]
    start = int(resumed.headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert seen["received_bytes"] <= start <= kept
    published = tmp_path / "data" / "blobs" / "sha256" / sha
    assert hashlib.sha256(published.read_bytes()).hexdigest() == sha


@pytest.mark.deadline(60)
async def test_sigkill_mid_upload_then_restart_resumes_from_the_servers_offset(tmp_path, ca_bundle):
    content = random_bytes(5 * MiB + 17, seed=22)
    sha = hashlib.sha256(content).hexdigest()
    server, url = await start_serve(tmp_path, ca_bundle)
    token = await server.admin_token()
    octet = {"Content-Type": "application/octet-stream"}
    try:
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=10) as http:
            model = (await http.post("/api/v1/models", json=gguf_manifest("m", content))).json()
            upload = f"/api/v1/models/{model['id']}/files/0/bytes"
            for offset in (0, 2 * MiB):
                response = await http.post(
                    f"{upload}?offset={offset}",
                    content=content[offset : offset + 2 * MiB],
                    headers=octet,
                )
                assert response.status_code == 200

            sent_part = trio.Event()

            async def never_finishes():
                yield content[4 * MiB : 4 * MiB + 256 * 1024]
                sent_part.set()
                await trio.sleep_forever()

            async with trio.open_nursery() as nursery:

                async def hanging_upload():
                    try:
                        await http.post(
                            f"{upload}?offset={4 * MiB}", content=never_finishes(), headers=octet
                        )
                    except httpx.HTTPError:
                        pass

                nursery.start_soon(hanging_upload)
                with trio.fail_after(10):
                    await sent_part.wait()
                await trio.sleep(0.2)
                server.proc.kill()
                server.proc.wait()
                nursery.cancel_scope.cancel()
    finally:
        server.kill()
    partial = partial_file(tmp_path / "data", sha, model["id"])
    assert partial.read_bytes() == content[: 4 * MiB]
    assert blob_files(tmp_path / "data")["sha256"] == []

    restarted, url = await start_serve(tmp_path, ca_bundle)
    try:
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=10) as http:
            state = (await http.get(f"/api/v1/models/{model['id']}")).json()
            offset = state["files"][0]["received_bytes"]
            assert offset == 4 * MiB
            done = await http.post(
                f"{upload}?offset={offset}", content=content[offset:], headers=octet
            )
            assert done.json()["state"] == "verified"
    finally:
        restarted.proc.terminate()
        restarted.kill()
    published = tmp_path / "data" / "blobs" / "sha256" / sha
    assert published.read_bytes() == content
