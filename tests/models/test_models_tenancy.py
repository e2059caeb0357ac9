"""Uploads against a real `ficc serve`: private partials, stalled bodies, refusals, error codes."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from ..conftest import bearer
from ..support.httpsd import ServedFile
from ..support.models_support import (
    blob_files,
    gguf_manifest,
    poll_model,
    project_token,
    random_bytes,
    start_serve,
)
from ..support.waiting import eventually

MiB = 1 << 20
OCTET = {"Content-Type": "application/octet-stream"}


@asynccontextmanager
async def _two_projects(tmp_path, ca_bundle, extra: str = ""):
    """A real `ficc serve` and a client for each of two projects: (url, token, ours, theirs)."""
    server, url = await start_serve(tmp_path, ca_bundle, extra)
    try:
        token = await server.admin_token()
        other = await project_token(tmp_path / "data", "team-b")
        async with (
            httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=30) as ours,
            httpx.AsyncClient(base_url=url, headers=bearer(other), timeout=30) as theirs,
        ):
            yield url, token, ours, theirs
    finally:
        server.kill()


def _chunk(offset: int, data: bytes) -> dict:
    return {"offset": offset, "data": base64.b64encode(data).decode()}


@pytest.mark.deadline(60)
async def test_another_projects_writes_never_touch_an_upload_in_progress(tmp_path, ca_bundle):
    content = random_bytes(3 * MiB, seed=31)
    sha = hashlib.sha256(content).hexdigest()
    async with _two_projects(tmp_path, ca_bundle) as (_url, _token, a, b):
        mine = (await a.post("/api/v1/models", json=gguf_manifest("m", content))).json()
        route_a = f"/api/v1/models/{mine['id']}/files/0"
        assert (await a.post(route_a, json=_chunk(0, content[:MiB]))).status_code == 200

        theirs = await b.post("/api/v1/models", json=gguf_manifest("m", content))
        assert theirs.status_code == 201
        theirs = theirs.json()
        # B does not learn of A's upload in progress.
        assert theirs["received_bytes"] == 0
        assert theirs["files"][0]["state"] == "absent"
        route_b = f"/api/v1/models/{theirs['id']}/files/0"
        # B's writes land in B's own partial: at A's offset they are refused...
        at_a = await b.post(route_b, json=_chunk(MiB, b"junk" * (MiB // 4)))
        assert at_a.status_code == 409
        assert at_a.json()["error"]["details"]["offset"] == 0
        # ...and wrong bytes from B's own start only ever fail B's file.
        wrong = random_bytes(3 * MiB, seed=32)
        for offset in range(0, 3 * MiB, MiB):
            spoil = await b.post(route_b, json=_chunk(offset, wrong[offset : offset + MiB]))
        assert spoil.status_code == 422
        assert spoil.json()["error"]["code"] == "digest_mismatch"

        mine = (await a.get(f"/api/v1/models/{mine['id']}")).json()
        assert mine["received_bytes"] == MiB
        assert mine["files"][0]["state"] == "paused"
        for offset in (MiB, 2 * MiB):
            done = await a.post(route_a, json=_chunk(offset, content[offset : offset + MiB]))
            assert done.status_code == 200, done.json()
        assert done.json()["state"] == "verified"
        # Verified content is shared: B's model is verified now, with nothing left over.
        theirs = (await b.get(f"/api/v1/models/{theirs['id']}")).json()
        assert theirs["state"] == "verified"
        assert (await b.post(route_b, json=_chunk(0, b"x"))).json()["error"]["code"] == (
            "file_verified"
        )
    assert blob_files(tmp_path / "data") == {"sha256": [sha], "partial": []}
    published = tmp_path / "data" / "blobs" / "sha256" / sha
    assert published.read_bytes() == content


async def _stalled_upload(url: str, token: str, model_id: str) -> trio.SocketStream:
    """Send a byte upload's headers and 10 of its 1 MiB, then nothing more."""
    parts = urlsplit(url)
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    await stream.send_all(
        f"POST /api/v1/models/{model_id}/files/0/bytes?offset=0 HTTP/1.1\r\n"
        f"Host: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {MiB}\r\n\r\n".encode()
        + b"0123456789"
    )
    return stream


async def _response_head(stream: trio.SocketStream) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = await stream.receive_some()
        if not chunk:
            break
        received += chunk
    return received


@pytest.mark.deadline(30)
async def test_stalled_byte_uploads_free_their_slots_and_never_block_another_project(
    tmp_path, ca_bundle
):
    contents = [random_bytes(MiB, seed=33 + i) for i in range(4)]
    async with _two_projects(tmp_path, ca_bundle, 'upload_idle_timeout = "5s"\n') as (
        url,
        token,
        http,
        theirs,
    ):
        manifests = [gguf_manifest(f"m{i}", contents[i]) for i in range(3)]
        ids = [(await http.post("/api/v1/models", json=m)).json()["id"] for m in manifests]
        # Three stalled bodies: two hold this project's slots, whichever comes third
        # is refused at once.
        stalled = [await _stalled_upload(url, token, model_id) for model_id in ids]
        # Another project's uploads still run meanwhile.
        model = await theirs.post("/api/v1/models", json=gguf_manifest("m", contents[3]))
        done = await theirs.post(
            f"/api/v1/models/{model.json()['id']}/files/0/bytes?offset=0",
            content=contents[3],
            headers=OCTET,
        )
        assert done.json()["state"] == "verified"
        # The idle bound answers each stalled upload and frees its slot.
        heads: dict[int, bytes] = {}

        async def head(i: int) -> None:
            heads[i] = await _response_head(stalled[i])

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(head, i)
        statuses = sorted(heads[i].split(b" ", 2)[1] for i in range(3))
        assert statuses == [b"408", b"408", b"429"], heads
        body = next(h for h in heads.values() if b" 408 " in h).partition(b"\r\n\r\n")[2]
        if body:
            assert json.loads(body)["error"]["code"] == "upload_stalled"
        for stream in stalled:
            await stream.aclose()
        for model_id in ids:
            state = (await http.get(f"/api/v1/models/{model_id}")).json()
            assert state["received_bytes"] == 0  # nothing of a stalled body is written
        again = await http.post(
            f"/api/v1/models/{ids[0]}/files/0/bytes?offset=0",
            content=contents[0],
            headers=OCTET,
        )
        assert again.status_code == 200 and again.json()["state"] == "verified"


@pytest.mark.deadline(30)
async def test_an_upload_is_refused_at_once_while_its_content_is_acquired(
    tmp_path, ca_bundle, https_server
):
    content = random_bytes(2 * MiB, seed=34)
    https_server.add("/m.gguf", ServedFile(content, stall=True))
    async with _two_projects(tmp_path, ca_bundle) as (_url, _token, http, theirs):
        source = gguf_manifest("a", content, url=https_server.url("/m.gguf"))
        acquiring = (await http.post("/api/v1/models", json=source)).json()
        assert (await http.post(f"/api/v1/models/{acquiring['id']}/acquire")).status_code == 202
        with trio.fail_after(10):
            await eventually(lambda: https_server.requests_for("/m.gguf"), None, every=0.05)
        same = (await http.post("/api/v1/models", json=gguf_manifest("b", content))).json()
        route = f"/api/v1/models/{same['id']}/files/0"
        with trio.fail_after(5):
            chunk = await http.post(route, json={"offset": 0, "data": "QUJD"})
            # More refusals than the project has slots: none of them holds one.
            raw = [
                await http.post(f"{route}/bytes?offset=0", content=b"ABC", headers=OCTET)
                for _ in range(3)
            ]
            own = await http.post(
                f"/api/v1/models/{acquiring['id']}/files/0", json={"offset": 0, "data": "QUJD"}
            )
        for refused in (chunk, *raw, own):
            assert refused.status_code == 409
            error = refused.json()["error"]
            assert error["code"] == "acquisition_running"
            assert error["details"]["models"] == [acquiring["id"]]
        # Another project's acquisition is invisible: its upload goes ahead, on its own.
        model = (await theirs.post("/api/v1/models", json=gguf_manifest("c", content))).json()
        with trio.fail_after(5):
            written = await theirs.post(
                f"/api/v1/models/{model['id']}/files/0", json={"offset": 0, "data": "QUJD"}
            )
        assert written.status_code == 200 and written.json()["received_bytes"] == 3
        await http.post(f"/api/v1/models/{acquiring['id']}/pause")


@pytest.mark.deadline(60)
async def test_two_projects_acquiring_the_same_content_both_end_verified(
    tmp_path, ca_bundle, https_server
):
    content = random_bytes(24 * MiB, seed=39)
    sha = hashlib.sha256(content).hexdigest()
    # At least 7.7 s to serve whole (384 pieces of 64 KiB, 20 ms apart).
    https_server.add("/slow.gguf", ServedFile(content, chunk_delay=0.02))
    https_server.add("/fast.gguf", ServedFile(content))
    async with _two_projects(tmp_path, ca_bundle) as (_url, _token, ours, theirs):
        # Ours starts first but downloads slowly; theirs overtakes it and publishes.
        models = []
        for http, path in ((ours, "/slow.gguf"), (theirs, "/fast.gguf")):
            manifest = gguf_manifest("m", content, url=https_server.url(path))
            model = (await http.post("/api/v1/models", json=manifest)).json()
            assert (await http.post(f"/api/v1/models/{model['id']}/acquire")).status_code == 202
            models.append((http, model["id"]))
        for http, model_id in models:
            done = await poll_model(
                http, model_id, lambda m: m["acquisition"]["state"] in ("done", "failed")
            )
            assert done["state"] == "verified" and done["acquisition"]["error"] is None, done
    # Overtaken, ours stopped receiving at its next durable point instead of finishing.
    assert https_server.bytes_served["/slow.gguf"] < len(content)
    assert blob_files(tmp_path / "data") == {"sha256": [sha], "partial": []}
    assert (
        hashlib.sha256((tmp_path / "data" / "blobs" / "sha256" / sha).read_bytes()).hexdigest()
        == sha
    )


@pytest.mark.deadline(60)
async def test_every_failure_state_carries_the_envelopes_code_and_details(
    tmp_path, ca_bundle, https_server
):
    content = random_bytes(MiB, seed=35)
    sha = hashlib.sha256(content).hexdigest()
    https_server.add("/bad.gguf", ServedFile(content, corrupt=True))
    https_server.add("/gone.gguf", ServedFile(content, status=404))
    server, url = await start_serve(tmp_path, ca_bundle)
    try:
        token = await server.admin_token()
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=30) as http:
            gone = random_bytes(100, seed=36)
            files = [
                (content, "model.safetensors", "/bad.gguf"),
                (gone, "config.json", "/gone.gguf"),
            ]
            manifest = {
                "name": "a",
                "format": "hf-directory",
                "files": [
                    {
                        "path": path,
                        "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "url": https_server.url(route),
                    }
                    for data, path, route in files
                ],
            }
            created = await http.post("/api/v1/models", json=manifest)
            assert created.status_code == 201, created.json()
            model = created.json()
            await http.post(f"/api/v1/models/{model['id']}/acquire")
            failed = await poll_model(
                http, model["id"], lambda m: m["acquisition"]["state"] == "failed"
            )
            weights, config = failed["files"]
            assert weights["state"] == "failed"
            assert weights["error"]["code"] == "digest_mismatch"
            assert weights["error"]["details"]["expected"] == sha
            actual = weights["error"]["details"]["actual"]
            assert len(actual) == 64 and actual != sha
            assert weights["reason"] == weights["error"]["message"]
            assert config["error"]["code"] == "http_error"
            assert config["error"]["details"] == {"status": 404}
            error = failed["acquisition"]["error"]
            assert error["code"] == "digest_mismatch"
            assert error["message"] == failed["acquisition"]["reason"]
            assert error["details"]["expected"] == sha and error["details"]["actual"] == actual
            assert (error["details"]["index"], error["details"]["path"]) == (0, "model.safetensors")
            assert [f["code"] for f in error["details"]["files"]] == [
                "digest_mismatch",
                "http_error",
            ]

            # The upload route's refusal and the file's failure state are the same error.
            wrong = random_bytes(100, seed=37)
            refused = await http.post(
                f"/api/v1/models/{model['id']}/files/1", json=_chunk(0, wrong)
            )
            assert refused.status_code == 422
            after = (await http.get(f"/api/v1/models/{model['id']}")).json()
            assert after["files"][1]["error"] == refused.json()["error"]
    finally:
        server.kill()


@pytest.mark.deadline(60)
async def test_a_verification_cut_by_a_crash_finishes_on_start(tmp_path, ca_bundle):
    content = random_bytes(2 * MiB + 5, seed=38)
    sha = hashlib.sha256(content).hexdigest()
    server, url = await start_serve(tmp_path, ca_bundle)
    try:
        token = await server.admin_token()
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=30) as http:
            model = (await http.post("/api/v1/models", json=gguf_manifest("m", content))).json()
            route = f"/api/v1/models/{model['id']}/files/0"
            first = await http.post(f"{route}/bytes?offset=0", content=content[:MiB], headers=OCTET)
            assert first.status_code == 200
            # An empty write at the declared size on an incomplete file says what is wrong.
            empty = await http.post(route, json={"offset": len(content), "data": ""})
            assert empty.status_code == 400
            error = empty.json()["error"]
            assert error["code"] == "empty_upload"
            assert "incomplete" in error["message"] and f"offset {MiB}" in error["message"]
            assert error["details"] == {"offset": MiB, "size": len(content)}
        server.proc.kill()
        server.proc.wait()
    finally:
        server.kill()
    # What a crash during verification leaves: every byte durable, the file `verifying`.
    data = tmp_path / "data"
    (partial,) = (data / "blobs" / "partial").iterdir()
    with partial.open("ab") as handle:
        handle.write(content[MiB:])
    with sqlite3.connect(data / "ficc.sqlite3") as db:
        db.execute(
            "UPDATE partials SET state = 'verifying', durable_offset = ? WHERE model_id = ?",
            (len(content), model["id"]),
        )

    # The leader's tidying verifies it once it has been idle past partial_tidy_after
    # (another controller could still be verifying it until then).
    restarted, url = await start_serve(tmp_path, ca_bundle, "partial_tidy_after = 2\n")
    try:
        async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=30) as http:
            done = await poll_model(http, model["id"], lambda m: m["state"] != "incomplete")
            assert done["state"] == "verified", done
    finally:
        restarted.kill()
    assert blob_files(data) == {"sha256": [sha], "partial": []}
