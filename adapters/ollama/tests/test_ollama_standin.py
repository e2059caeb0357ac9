"""The Ollama stand-in itself follows Ollama's documented blob and create answers.

These run the stand-in as a plain subprocess on a free loopback port (no executor)
and use only the routes that load no model.
"""

from __future__ import annotations

import hashlib
import socket
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

STANDIN = Path(__file__).with_name("ollama_standin.py")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
async def ollama(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Path]]:
    port = _free_port()
    models = tmp_path / "models"
    env = {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_MODELS": str(models)}
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(trio.run_process, [sys.executable, str(STANDIN), "serve"], env=env, check=False)
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            with trio.fail_after(20):
                while True:
                    try:
                        if (await client.get("/api/version")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await trio.sleep(0.05)
            try:
                yield client, models
            finally:
                process.terminate()


async def test_a_pushed_blob_is_verified_stored_and_then_found(ollama):
    client, models = ollama
    data = b"GGUF" + b"\x00" * 1000
    digest = hashlib.sha256(data).hexdigest()
    with trio.fail_after(20):
        assert (await client.head(f"/api/blobs/sha256:{digest}")).status_code == 404
        assert (await client.post(f"/api/blobs/sha256:{digest}", content=data)).status_code == 201
        assert (await client.head(f"/api/blobs/sha256:{digest}")).status_code == 200
        # Pushing it again is fine: Ollama answers 200 for a blob it has.
        assert (await client.post(f"/api/blobs/sha256:{digest}", content=data)).status_code == 200
    assert (models / "blobs" / f"sha256-{digest}").read_bytes() == data


async def test_a_blob_whose_bytes_do_not_match_its_digest_is_refused(ollama):
    client, models = ollama
    wrong = "0" * 64
    with trio.fail_after(20):
        answer = await client.post(f"/api/blobs/sha256:{wrong}", content=b"other bytes")
    assert answer.status_code == 400
    assert "digest mismatch" in answer.json()["error"]
    assert not (models / "blobs" / f"sha256-{wrong}").exists()


async def test_create_refuses_missing_blobs_and_files_that_are_not_gguf(ollama):
    client, _ = ollama
    text = b"not a model"
    digest = hashlib.sha256(text).hexdigest()
    with trio.fail_after(20):
        missing = await client.post(
            "/api/create", json={"model": "m", "files": {"m.gguf": "sha256:" + "1" * 64}}
        )
        await client.post(f"/api/blobs/sha256:{digest}", content=text)
        not_gguf = await client.post(
            "/api/create", json={"model": "m", "files": {"m.gguf": f"sha256:{digest}"}}
        )
        nothing = await client.post("/api/create", json={"model": "m"})
    assert missing.status_code == 400 and "not found" in missing.json()["error"]
    assert not_gguf.status_code == 400 and "magic" in not_gguf.json()["error"]
    assert nothing.status_code == 400


async def test_openai_routes_refuse_a_model_that_was_never_created(ollama):
    client, _ = ollama
    with trio.fail_after(20):
        answer = await client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
        models = await client.get("/v1/models")
        root = await client.get("/")
    assert answer.status_code == 404
    assert answer.json()["error"]["message"].startswith('model "nope" not found')
    assert models.json() == {"object": "list", "data": []}
    assert root.text == "Ollama is running"
