"""Property: two projects uploading the same content, interleaved, never affect each other.

Random interleavings of right chunks, junk chunks, writes at wrong offsets, empty
writes and controller restarts, over both upload routes, are checked step by step
against a model of what each upload alone should see. Whatever the order, every
upload that sends the right bytes ends verified, neither project ever sees the
other's progress, and nothing is ever published under a digest it does not have.
"""

from __future__ import annotations

import base64
import hashlib
import tempfile
from pathlib import Path

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ficc_core.api.app import create_app
from ficc_core.config import load_config
from ficc_core.controller.service import open_service

from ..conftest import bearer, issue_token
from ..support.models_support import blob_files, gguf_manifest, random_bytes

_write = st.tuples(
    st.just("write"),
    st.sampled_from([0, 1]),  # which upload
    st.sampled_from(["right", "right", "junk", "wrong_offset", "empty"]),
    st.integers(1, 1500),  # how many bytes
    st.sampled_from(["json", "bytes"]),
)
_steps = st.lists(st.one_of(_write, _write, _write, st.just(("restart",))), max_size=24)


@attrs.define
class Upload:
    """What one project's upload should see: its own durable bytes, and whether they are right."""

    headers: dict[str, str]
    model_id: str = ""
    durable: int = 0
    clean: bool = True
    failed: bool = False


class Controller:
    """An in-process controller (real SQLite, real blob store) that can be restarted."""

    def __init__(self, data_dir: Path) -> None:
        self.config = load_config(overrides={"data_dir": str(data_dir)}, environ={})
        self._stop = trio.Event()
        self._stopped = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with open_service(self.config, background=True) as service:
                self.service = service
                self.client = create_app(service).test_client()
                task_status.started()
                await self._stop.wait()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        self._stop.set()
        await self._stopped.wait()


async def _post(controller: Controller, upload: Upload, offset: int, data: bytes, route: str):
    path = f"/api/v1/models/{upload.model_id}/files/0"
    if route == "json" or not data:
        body = {"offset": offset, "data": base64.b64encode(data).decode()}
        response = await controller.client.post(path, headers=upload.headers, json=body)
    else:
        headers = {**upload.headers, "Content-Type": "application/octet-stream"}
        response = await controller.client.post(
            f"{path}/bytes?offset={offset}", headers=headers, data=data
        )
    return response.status_code, await response.get_json()


def _check_published(data_dir: Path) -> None:
    for name in blob_files(data_dir)["sha256"]:
        published = data_dir / "blobs" / "sha256" / name
        assert hashlib.sha256(published.read_bytes()).hexdigest() == name


async def _scenario(data_dir: Path, content: bytes, steps: list[tuple]) -> None:
    size = len(content)
    sha = hashlib.sha256(content).hexdigest()
    verified = False

    async with trio.open_nursery() as nursery:
        controller = Controller(data_dir)
        await nursery.start(controller.run)
        service = controller.service
        admin = (await service.auth.bootstrap())["token"]
        await service.auth.create_project("other")
        other = await issue_token(service, project="other", scopes=["models:read", "models:manage"])
        uploads = [Upload(bearer(admin)), Upload(bearer(other))]
        for upload in uploads:
            response = await controller.client.post(
                "/api/v1/models", headers=upload.headers, json=gguf_manifest("m", content)
            )
            assert response.status_code == 201
            upload.model_id = (await response.get_json())["id"]

        async def send(upload: Upload, kind: str, length: int, route: str) -> None:
            nonlocal verified
            length = min(length, size - upload.durable)  # at least 1: see the end of a write
            if kind == "empty":
                status, body = await _post(controller, upload, size, b"", route)
                if verified:
                    assert status == 200 and body["state"] == "verified"
                else:
                    assert status == 400 and body["error"]["code"] == "empty_upload"
                    assert body["error"]["details"]["offset"] == upload.durable
                return
            if kind == "wrong_offset":
                offset = (upload.durable + length) % (size + 1)
                offset = offset if offset != upload.durable else upload.durable + 1
                status, body = await _post(controller, upload, offset, b"x", route)
                if verified:
                    assert (status, body["error"]["code"]) == (409, "file_verified")
                else:
                    assert (status, body["error"]["code"]) == (409, "offset_mismatch")
                    assert body["error"]["details"]["offset"] == upload.durable
                return
            right = content[upload.durable : upload.durable + length]
            data = right if kind == "right" else bytes(b ^ 0xA5 for b in right)
            status, body = await _post(controller, upload, upload.durable, data, route)
            if verified:
                assert (status, body["error"]["code"]) == (409, "file_verified")
                return
            end = upload.durable + len(data)
            upload.clean = upload.clean and kind == "right"
            if end < size:
                assert status == 200, body
                assert body["received_bytes"] == end
                upload.durable, upload.failed = end, False
            elif upload.clean:
                assert status == 200 and body["state"] == "verified", body
                verified = True
            else:
                assert (status, body["error"]["code"]) == (422, "digest_mismatch")
                assert body["error"]["details"]["expected"] == sha
                assert body["error"]["details"]["actual"] != sha
                # A complete write is verified at once: it publishes, or it starts over.
                upload.durable, upload.clean, upload.failed = 0, True, True

        async def check_views() -> None:
            for upload in uploads:
                response = await controller.client.get(
                    f"/api/v1/models/{upload.model_id}", headers=upload.headers
                )
                file = (await response.get_json())["files"][0]
                if verified:
                    assert file["state"] == "verified" and file["received_bytes"] == size
                    continue
                # Only this upload's own bytes, never the other project's.
                assert file["received_bytes"] == upload.durable, (file, upload)
                if upload.failed:
                    assert file["state"] == "failed"
                    assert file["error"]["code"] == "digest_mismatch"
                else:
                    assert file["state"] == ("paused" if upload.durable else "absent")
                    assert file["error"] is None
            _check_published(data_dir)

        for step in steps:
            if step[0] == "restart":
                await controller.stop()
                controller = Controller(data_dir)
                await nursery.start(controller.run)
            else:
                _, who, kind, length, route = step
                await send(uploads[who], kind, length, route)
            await check_views()

        # Each upload now sends the right bytes to the end (from 0 if its partial holds junk).
        for upload in uploads:
            while not verified:
                await send(upload, "right", size, "bytes")
        await check_views()
        await controller.stop()

    assert blob_files(data_dir) == {"sha256": [sha], "partial": []}
    assert (data_dir / "blobs" / "sha256" / sha).read_bytes() == content


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(size=st.integers(1, 3000), seed=st.integers(0, 2**16), steps=_steps)
def test_interleaved_uploads_from_two_projects_never_affect_each_other(size, seed, steps):
    content = random_bytes(size, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:

        async def main() -> None:
            with trio.fail_after(120):
                await _scenario(Path(tmp) / "data", content, steps)

        trio.run(main)
