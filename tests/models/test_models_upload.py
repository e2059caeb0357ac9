"""Uploads: canonical base64 chunks, octet-stream bodies, offsets, limits, the empty-upload rule."""

from __future__ import annotations

import base64
import hashlib

import httpx
import pytest
import trio

from ficc_core.base.errors import NotFound
from ficc_core.models.blob_records import FileRef

from ..conftest import bearer
from ..support.models_support import blob_files, gguf_manifest, random_bytes

MiB = 1 << 20


async def _model(client, headers, content: bytes, name: str = "up") -> dict:
    response = await client.post(
        "/api/v1/models", headers=headers, json=gguf_manifest(name, content)
    )
    return await response.get_json()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_chunked_json_upload_verifies_and_publishes_once(client, bootstrap, config):
    admin = bearer(bootstrap["token"])
    content = random_bytes(2 * MiB + 123)
    model = await _model(client, admin, content)
    offset = 0
    for start in range(0, len(content), MiB):
        chunk = content[start : start + MiB]
        response = await client.post(
            f"/api/v1/models/{model['id']}/files/0",
            headers=admin,
            json={"offset": offset, "data": _b64(chunk)},
        )
        assert response.status_code == 200, await response.get_json()
        offset += len(chunk)
        assert (await response.get_json())["received_bytes"] == offset
    final = await (await client.get(f"/api/v1/models/{model['id']}", headers=admin)).get_json()
    assert final["state"] == "verified"
    assert final["files"][0]["verified_bytes"] == len(content)
    stored = blob_files(config.data_dir)
    assert stored == {"sha256": [hashlib.sha256(content).hexdigest()], "partial": []}
    published = config.data_dir / "blobs" / "sha256" / stored["sha256"][0]
    assert published.read_bytes() == content


@pytest.mark.parametrize(
    "spelling",
    [
        "QUJD\n",  # trailing newline
        "QU JD",  # whitespace inside
        "QUI",  # missing padding
        "QUI==",  # too much padding
        "QR==",  # non-zero padding bits (decodes like "QQ==")
        "-_8=",  # URL-safe alphabet
        "QUJD====",  # extra padding
        "Q",  # truncated
        "QUJD!",  # not base64
    ],
)
async def test_non_canonical_base64_is_refused(client, bootstrap, spelling):
    admin = bearer(bootstrap["token"])
    model = await _model(client, admin, b"ABCDEFGH")
    response = await client.post(
        f"/api/v1/models/{model['id']}/files/0", headers=admin, json={"offset": 0, "data": spelling}
    )
    assert response.status_code == 400
    assert (await response.get_json())["error"]["code"] == "invalid_base64"
    after = await (await client.get(f"/api/v1/models/{model['id']}", headers=admin)).get_json()
    assert after["files"][0]["received_bytes"] == 0


async def test_a_json_chunk_over_one_mib_is_413(client, bootstrap):
    admin = bearer(bootstrap["token"])
    model = await _model(client, admin, random_bytes(MiB + 1))
    response = await client.post(
        f"/api/v1/models/{model['id']}/files/0",
        headers=admin,
        json={"offset": 0, "data": _b64(random_bytes(MiB + 1))},
    )
    assert response.status_code == 413
    exactly = await client.post(
        f"/api/v1/models/{model['id']}/files/0",
        headers=admin,
        json={"offset": 0, "data": _b64(random_bytes(MiB))},
    )
    assert exactly.status_code == 200


async def test_octet_stream_upload_limits_type_and_offsets(client, bootstrap):
    admin = bearer(bootstrap["token"])
    content = random_bytes(16 * MiB + 1, seed=5)
    model = await _model(client, admin, content)
    url = f"/api/v1/models/{model['id']}/files/0/bytes"
    octet = {**admin, "Content-Type": "application/octet-stream"}
    too_big = await client.post(f"{url}?offset=0", headers=octet, data=content)
    assert too_big.status_code == 413
    wrong_type = await client.post(
        f"{url}?offset=0", headers={**admin, "Content-Type": "text/plain"}, data=b"x"
    )
    assert wrong_type.status_code == 415
    for bad in ("", "?offset=-1", "?offset=abc", "?offset=01"):
        assert (await client.post(f"{url}{bad}", headers=octet, data=b"x")).status_code == 400
    first = await client.post(f"{url}?offset=0", headers=octet, data=content[: 16 * MiB])
    assert first.status_code == 200
    wrong = await client.post(f"{url}?offset=5", headers=octet, data=content[16 * MiB :])
    assert wrong.status_code == 409
    error = (await wrong.get_json())["error"]
    assert error["code"] == "offset_mismatch" and error["details"]["offset"] == 16 * MiB
    beyond = await client.post(f"{url}?offset={16 * MiB}", headers=octet, data=b"xy")
    assert beyond.status_code == 400
    assert (await beyond.get_json())["error"]["code"] == "beyond_declared_size"
    done = await client.post(f"{url}?offset={16 * MiB}", headers=octet, data=content[16 * MiB :])
    assert (await done.get_json())["state"] == "verified"


async def test_wrong_bytes_publish_nothing_and_explain_why(client, bootstrap, config):
    admin = bearer(bootstrap["token"])
    model = await _model(client, admin, b"the right bytes")
    response = await client.post(
        f"/api/v1/models/{model['id']}/files/0",
        headers=admin,
        json={"offset": 0, "data": _b64(b"the wrong bytes")},
    )
    assert response.status_code == 422
    assert (await response.get_json())["error"]["code"] == "digest_mismatch"
    after = await (await client.get(f"/api/v1/models/{model['id']}", headers=admin)).get_json()
    file = after["files"][0]
    assert file["state"] == "failed" and "hashes to sha256" in file["reason"]
    assert file["received_bytes"] == 0
    assert blob_files(config.data_dir) == {"sha256": [], "partial": []}


async def test_empty_upload_at_the_declared_size_publishes_a_retained_full_partial(
    client, service, bootstrap, config
):
    admin = bearer(bootstrap["token"])
    content = random_bytes(4096, seed=9)
    model = await _model(client, admin, content)
    sha = hashlib.sha256(content).hexdigest()
    url = f"/api/v1/models/{model['id']}/files/0"
    # Empty writes anywhere else are refused.
    for offset in (0, 100, len(content)):
        refused = await client.post(url, headers=admin, json={"offset": offset, "data": ""})
        assert refused.status_code == 400
        assert (await refused.get_json())["error"]["code"] == "empty_upload"
    # An interruption after the last durable write but before verification:
    ref = FileRef(model["id"], 0, sha, len(content))
    async with service.blobs.lock(ref):
        await service.blobs.write(ref, 0, content)
    below = await client.post(url, headers=admin, json={"offset": 10, "data": ""})
    assert below.status_code == 400
    assert blob_files(config.data_dir)["sha256"] == []
    response = await client.post(url, headers=admin, json={"offset": len(content), "data": ""})
    assert response.status_code == 200
    assert (await response.get_json())["state"] == "verified"
    assert blob_files(config.data_dir)["sha256"] == [sha]


def test_at_most_two_byte_uploads_run_at_once(live_server):
    token = live_server.bootstrap["token"]
    headers = bearer(token)
    contents = [random_bytes(3 * 64 * 1024, seed=11 + i) for i in range(3)]
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=30) as http:
        ids = [
            http.post("/api/v1/models", json=gguf_manifest(f"slow{i}", contents[i])).json()["id"]
            for i in range(3)
        ]

    async def scenario() -> list[int]:
        release = trio.Event()
        statuses: dict[int, int] = {}

        async def slow_body(content: bytes):
            yield content[: 64 * 1024]
            await release.wait()
            yield content[64 * 1024 :]

        async def upload(i: int) -> None:
            async with httpx.AsyncClient(base_url=live_server.url, headers=headers) as http:
                response = await http.post(
                    f"/api/v1/models/{ids[i]}/files/0/bytes?offset=0",
                    content=slow_body(contents[i]) if i < 2 else contents[i],
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=30,
                )
                statuses[i] = response.status_code
                if i == 2:
                    assert response.json()["error"]["code"] == "too_many_uploads"
                    assert response.headers["Retry-After"]
                    release.set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(upload, 0)
                nursery.start_soon(upload, 1)
                await trio.sleep(0.5)
                nursery.start_soon(upload, 2)
        return [statuses[i] for i in range(3)]

    assert trio.run(scenario) == [200, 200, 429]


async def test_a_write_for_a_model_deleted_meanwhile_is_404_and_leaves_no_file(
    client, service, bootstrap, config
):
    admin = bearer(bootstrap["token"])
    content = random_bytes(1000, seed=12)
    model = await _model(client, admin, content)
    ref = FileRef(model["id"], 0, hashlib.sha256(content).hexdigest(), len(content))
    # The upload passed its checks, then the model was deleted before its write landed.
    deleted = await client.delete(f"/api/v1/models/{model['id']}", headers=admin)
    assert deleted.status_code == 200
    async with service.blobs.lock(ref):
        with pytest.raises(NotFound) as refused:
            await service.blobs.write(ref, 0, content[:10])
    assert refused.value.code == "model_not_found"
    assert blob_files(config.data_dir) == {"sha256": [], "partial": []}


def _refused_mid_body(url: str, path: str, headers: dict[str, str], declared: int) -> bytes:
    """Send a request declaring ``declared`` body bytes but only the first 16 KiB of them
    (within the server's first read, so it closes with nothing unread and no reset can
    cut its reply short), then read until it closes the connection: its whole reply."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    head = [f"POST {path} HTTP/1.1", f"Host: {where.netloc}", f"Content-Length: {declared}"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"x" * min(declared, 1 << 14))
        reply = b""
        while chunk := sock.recv(1 << 16):  # the server closes it: no read ever hangs here
            reply += chunk
    return reply


def test_a_refusal_before_the_body_is_read_closes_the_connection(live_server):
    # Refused before its body was read (415, 400, 404, 413): the rest of the body would
    # stay in the kept-alive connection, and the client's next request behind it waited
    # for ever (the CLI's retry after a 429 hung so for two minutes). The body is sent
    # only in part, so it has certainly not all arrived when the refusal goes out (a
    # whole 2 MiB body could, on a busy machine, and then keeping the connection is right).
    headers = bearer(live_server.bootstrap["token"])
    content = random_bytes(64 * 1024, seed=5)
    octets = {"Content-Type": "application/octet-stream"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=10) as http:
        model_id = http.post("/api/v1/models", json=gguf_manifest("early", content)).json()["id"]
        url = f"/api/v1/models/{model_id}/files/0/bytes"
        refusals = [
            (f"{url}?offset=0", {}, 2 << 20, 415),
            (f"{url}?offset=x", octets, 2 << 20, 400),
            (f"{url.replace(model_id, 'nope')}?offset=0", octets, 2 << 20, 404),
            (f"{url}?offset=0", octets, 17 << 20, 413),
        ]
        for path, more, declared, status in refusals:
            reply = _refused_mid_body(live_server.url, path, {**headers, **more}, declared)
            head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower().split("\r\n")
            assert head[0].split()[1] == str(status), reply[:500]
            assert "connection: close" in head, head
            # The same client's next request is answered.
            assert http.get("/api/v1/models").status_code == 200
        # A missing offset says it is missing (it said "invalid").
        missing = http.post(url, content=content, headers=octets)
        assert missing.status_code == 400
        assert "the query parameter offset is missing" in missing.json()["error"]["message"]
        # A body read whole keeps the connection.
        answered = http.post(url, params={"offset": 0}, content=content, headers=octets)
        assert answered.status_code == 200, answered.text
        assert answered.headers.get("connection") != "close"
