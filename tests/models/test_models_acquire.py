"""Acquisition over real HTTPS on loopback (trustme certificates), with faults injected."""

from __future__ import annotations

import hashlib

import attrs
import httpx
import pytest
import trio
import trustme

from ficc_core.api.app import create_app
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.models.fetch import FetchError, FetchPolicy, make_client, open_response

from ..conftest import bearer
from ..support.httpsd import Redirect, ScriptedResolver, ServedFile, resolving_with, write_ca_bundle
from ..support.models_support import (
    Writes,
    blob_files,
    gguf_manifest,
    partial_file,
    random_bytes,
    sha256_of,
    smollm2_path,
)
from ..support.waiting import eventually

MiB = 1 << 20


@pytest.fixture
async def controller(tmp_path, ca_bundle):
    """A controller whose acquirer runs, trusting the test CA and allowing loopback."""

    async def open_with(**settings):
        config = load_config(
            overrides={
                "data_dir": str(tmp_path / "data"),
                "ca_bundle": str(ca_bundle),
                "allow_private_addresses": True,
                "read_timeout": "2s",
                "acquisition_retries": 2,
                **settings,
            },
            environ={},
        )
        return open_service(config, background=True)

    return open_with


class Api:
    def __init__(self, service, token):
        self.client = create_app(service).test_client()
        self.headers = bearer(token)
        self.service = service

    async def register(self, body) -> dict:
        response = await self.client.post("/api/v1/models", headers=self.headers, json=body)
        assert response.status_code in (200, 201), await response.get_json()
        return await response.get_json()

    async def post(self, path: str):
        return await self.client.post(path, headers=self.headers)

    async def model(self, model_id: str) -> dict:
        return await (
            await self.client.get(f"/api/v1/models/{model_id}", headers=self.headers)
        ).get_json()

    async def acquire_and_wait(self, model_id: str, until=("verified", "failed")) -> dict:
        response = await self.post(f"/api/v1/models/{model_id}/acquire")
        assert response.status_code == 202, await response.get_json()
        # Finished means the file states are final and the acquisition task has recorded
        # its own outcome (it does so just after the last file settles).
        return await self.wait_until(
            model_id,
            lambda model: (
                model["state"] in until and (model["acquisition"] or {}).get("state") != "running"
            ),
        )

    async def wait_until(self, model_id: str, predicate) -> dict:
        """Poll the API (as a client would) until ``predicate(model)`` holds."""
        return await eventually(lambda: self.model(model_id), 60, until=predicate, every=0.05)


async def _api(service) -> Api:
    created = await service.auth.bootstrap()
    return Api(service, created["token"])


@pytest.mark.deadline(60)
async def test_acquires_the_real_smollm2_gguf_and_publishes_it_once(controller, https_server):
    path = smollm2_path()
    https_server.add("/smollm2.gguf", ServedFile(path))
    content_sha = sha256_of(path)
    async with await controller() as service:
        api = await _api(service)
        body = {
            "name": "smollm2",
            "format": "gguf",
            "files": [
                {
                    "path": "smollm2.gguf",
                    "size": path.stat().st_size,
                    "sha256": content_sha,
                    "url": https_server.url("/smollm2.gguf"),
                }
            ],
        }
        model = await api.register(body)
        done = await api.acquire_and_wait(model["id"])
        assert done["state"] == "verified", done
        assert done["files"][0]["verified_bytes"] == path.stat().st_size
        assert done["acquisition"]["state"] == "done"
        published = service.config.blobs_path / "sha256" / content_sha
        assert sha256_of(published) == content_sha
        assert blob_files(service.config.data_dir) == {"sha256": [content_sha], "partial": []}
    assert https_server.bytes_served["/smollm2.gguf"] == path.stat().st_size
    assert len(https_server.requests) == 1
    # The bytes as stored: a compressed body would not hash to the declared digest.
    assert https_server.requests[0].headers["accept-encoding"] == "identity"
    assert https_server.requests[0].headers["user-agent"].startswith("ficc/")


@pytest.mark.deadline(60)
async def test_a_dropped_connection_resumes_with_range_without_refetching(controller, https_server):
    content = random_bytes(10 * MiB + 12345, seed=1)
    https_server.add("/m.gguf", ServedFile(content, drop_after=6 * MiB + 7))
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "verified", done
    first, second = https_server.requests
    assert "range" not in first.headers
    resumed_from = int(second.headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert resumed_from == 6 * MiB + 7  # every byte received before the drop was kept
    assert https_server.bytes_served["/m.gguf"] < len(content) + MiB


async def _acquired_as_published(controller, https_server, content: bytes) -> None:
    """Acquire ``content`` as served at /m.gguf: it ends verified, published byte for byte."""
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
        published = service.config.blobs_path / "sha256" / hashlib.sha256(content).hexdigest()
        assert published.read_bytes() == content
    assert done["state"] == "verified", done


async def test_the_body_goes_past_the_page_cache_even_after_an_unaligned_resume(
    controller, https_server, monkeypatch
):
    content = random_bytes(6 * MiB + 999, seed=21)
    https_server.add("/m.gguf", ServedFile(content, drop_after=2 * MiB + 7))
    writes = Writes(monkeypatch)
    await _acquired_as_published(controller, https_server, content)
    # 1 MiB pieces go direct; the 7 bytes before the drop and the last 999 through the
    # page cache; after the resume at 2 MiB + 7 one buffered piece brings the offset
    # back onto a page (3 MiB), and the pieces after it go direct again.
    assert writes.direct() == [(at * MiB, MiB) for at in (0, 1, 3, 4, 5)]
    buffered = [(off, n) for off, n in writes.buffered() if n]
    assert buffered[0] == (2 * MiB, 7)
    assert buffered[-1] == (6 * MiB, 999)
    assert sum(n for off, n in buffered if 2 * MiB + 7 <= off < 3 * MiB) == MiB - 7


async def test_a_server_that_ignores_range_is_skipped_not_rewritten(controller, https_server):
    content = random_bytes(6 * MiB, seed=2)
    https_server.add("/m.gguf", ServedFile(content, drop_after=5 * MiB, honour_range=False))
    await _acquired_as_published(controller, https_server, content)
    assert "range" in https_server.requests[1].headers


async def test_a_chunked_body_is_acquired(controller, https_server):
    content = random_bytes(3 * MiB + 99, seed=8)
    https_server.add("/m.gguf", ServedFile(content, chunked=True))
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "verified", done


@pytest.mark.parametrize(
    ("served", "reason"),
    [
        (dict(corrupt=True), "hashes to sha256"),
        (dict(extra=b"surplus"), "longer than the declared size"),
        (dict(extra=b"surplus", chunked=True), "more than the declared size"),
        (dict(status=404), "404"),
    ],
)
async def test_bad_content_publishes_nothing_and_says_why(controller, https_server, served, reason):
    content = random_bytes(2 * MiB, seed=3)
    https_server.add("/m.gguf", ServedFile(content, **served))
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
        assert done["state"] == "failed"
        assert reason in done["files"][0]["reason"], done
        assert reason in done["acquisition"]["reason"]
        assert blob_files(service.config.data_dir)["sha256"] == []
        partial = partial_file(
            service.config.data_dir, hashlib.sha256(content).hexdigest(), model["id"]
        )
        assert not partial.exists() or partial.stat().st_size <= len(content)


async def test_plain_http_urls_are_refused_at_registration(controller):
    async with await controller() as service:
        api = await _api(service)
        response = await api.client.post(
            "/api/v1/models",
            headers=api.headers,
            json=gguf_manifest("m", b"x", url="http://127.0.0.1:1/m.gguf"),
        )
        assert response.status_code == 400
        errors = (await response.get_json())["error"]["details"]["errors"]
        assert errors[0]["path"] == "$.files[0].url"


@pytest.mark.parametrize(
    ("routes", "reason"),
    [
        ({"/m.gguf": Redirect("http://127.0.0.1:9/m.gguf")}, "only https:// URLs"),
        ({"/m.gguf": Redirect("/loop"), "/loop": Redirect("/m.gguf")}, "redirect loop"),
    ],
)
async def test_redirects_are_rechecked(controller, https_server, routes, reason):
    for path, route in routes.items():
        https_server.add(path, route)
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", b"abc", url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "failed"
    assert reason in done["files"][0]["reason"]


@pytest.mark.deadline(40)
async def test_a_refused_redirect_to_http_names_the_registered_url_and_the_target(
    serve_process, https_server
):
    https_server.add("/m.gguf", Redirect("http://127.0.0.1:9/m.gguf"))
    registered = https_server.url("/m.gguf")
    url, token = serve_process
    async with httpx.AsyncClient(base_url=url, headers=bearer(token), timeout=10) as http:
        model = (
            await http.post("/api/v1/models", json=gguf_manifest("m", b"abc", url=registered))
        ).json()
        assert (await http.post(f"/api/v1/models/{model['id']}/acquire")).status_code == 202
        with trio.fail_after(30):
            while (done := (await http.get(f"/api/v1/models/{model['id']}")).json())[  # noqa: ASYNC110
                "state"
            ] != "failed":
                await trio.sleep(0.05)
    reason = done["files"][0]["reason"]
    assert f"{registered} redirected to http://127.0.0.1:9/m.gguf, which is refused" in reason
    assert "only https:// URLs are fetched" in reason


@pytest.mark.deadline(40)
async def test_a_refused_redirect_after_several_hops_names_the_registered_url_and_the_last_hop(
    https_server, ca_bundle
):
    policy = FetchPolicy(allow_private=True, ca_bundle=ca_bundle)
    https_server.add("/a", Redirect("/b"))
    https_server.add("/b", Redirect("http://127.0.0.1:9/c"))
    first, second = https_server.url("/a"), https_server.url("/b")
    with trio.fail_after(30):
        async with make_client(policy) as client:
            with pytest.raises(FetchError) as caught:
                async with open_response(client, first, policy):
                    pass
    assert caught.value.code == "insecure_url"
    assert f"{first} redirected (via {second}) to http://127.0.0.1:9/c" in caught.value.message
    assert caught.value.details == {
        "url": "http://127.0.0.1:9/c",
        "redirected_from": second,
        "requested_url": first,
    }


def _standing_in_for_public(service, *addresses: str) -> None:
    """Count ``addresses`` (loopback ones) as public for this controller's fetches, and no other."""
    acquirer = service.models.acquirer
    acquirer.policy = attrs.evolve(
        acquirer.policy, allow_private=False, is_public=lambda address: address in addresses
    )


async def test_a_name_that_rebinds_to_loopback_after_the_check_never_reaches_it(
    controller, https_server
):
    https_server.add("/m.gguf", ServedFile(b"abc"))
    # The name first answers 127.0.0.2, standing in for a public address (nothing listens
    # there), then 127.0.0.1, where the server listens and which the check refuses.
    resolver = ScriptedResolver({"localhost": ["127.0.0.2", "127.0.0.1"]})
    url = f"https://localhost:{https_server.port}/m.gguf"
    async with await controller() as service:
        _standing_in_for_public(service, "127.0.0.2")
        api = await _api(service)
        model = await api.register(gguf_manifest("m", b"abc", url=url))
        with resolving_with(resolver):
            done = await api.acquire_and_wait(model["id"])
    assert https_server.requests == []
    assert done["state"] == "failed"
    # The connection went to the checked address and failed; the retry resolved again
    # and was refused before connecting.
    assert resolver.lookups == [("localhost", "127.0.0.2"), ("localhost", "127.0.0.1")]
    assert "non-public address (127.0.0.1)" in done["files"][0]["reason"]


@pytest.mark.deadline(60)
async def test_the_connection_goes_to_the_address_that_was_checked(controller, https_server):
    content = random_bytes(2 * MiB, seed=7)
    https_server.add("/m.gguf", ServedFile(content))
    resolver = ScriptedResolver({"localhost": ["127.0.0.1", "127.0.0.3"]})
    url = f"https://localhost:{https_server.port}/m.gguf"
    async with await controller() as service:
        _standing_in_for_public(service, "127.0.0.1")
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=url))
        with resolving_with(resolver):
            done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "verified", done
    assert resolver.lookups == [("localhost", "127.0.0.1")]


async def test_every_redirect_hop_is_resolved_and_checked_again(controller, https_server):
    https_server.add("/m.gguf", Redirect("/cdn/m.gguf"))
    https_server.add("/cdn/m.gguf", ServedFile(b"abc"))
    resolver = ScriptedResolver({"localhost": ["127.0.0.1", "127.0.0.3"]})
    url = f"https://localhost:{https_server.port}/m.gguf"
    async with await controller() as service:
        _standing_in_for_public(service, "127.0.0.1")
        api = await _api(service)
        model = await api.register(gguf_manifest("m", b"abc", url=url))
        with resolving_with(resolver):
            done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "failed"
    assert [request.path for request in https_server.requests] == ["/m.gguf"]
    reason = done["files"][0]["reason"]
    assert f"{url} redirected to https://localhost:{https_server.port}/cdn/m.gguf" in reason
    assert "non-public address (127.0.0.3)" in reason


async def test_a_redirect_to_https_is_followed(controller, https_server):
    content = random_bytes(1000, seed=4)
    https_server.add("/m.gguf", Redirect("/cdn/m.gguf"))
    https_server.add("/cdn/m.gguf", ServedFile(content))
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        assert (await api.acquire_and_wait(model["id"]))["state"] == "verified"


async def test_loopback_is_refused_unless_the_operator_allows_it(controller, https_server):
    https_server.add("/m.gguf", ServedFile(b"abc"))
    async with await controller(allow_private_addresses=False) as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", b"abc", url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "failed"
    assert "non-public address" in done["files"][0]["reason"]
    assert https_server.requests == []


async def test_a_stalled_server_times_out_after_bounded_retries(controller, https_server):
    https_server.add("/m.gguf", ServedFile(random_bytes(1000), stall=True))
    async with await controller(read_timeout="300ms", acquisition_retries=1) as service:
        api = await _api(service)
        model = await api.register(
            gguf_manifest("m", random_bytes(1000), url=https_server.url("/m.gguf"))
        )
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "failed"
    assert "timeout" in done["files"][0]["reason"]
    assert len(https_server.requests) == 2


async def test_an_untrusted_certificate_fails_at_once_and_says_so(
    controller, https_server, tmp_path
):
    # Trying again cannot make a certificate trusted: no retries, a code of its own.
    other = tmp_path / "other"
    other.mkdir()
    https_server.add("/m.gguf", ServedFile(random_bytes(1000)))
    bundle = write_ca_bundle(other, trustme.CA())
    async with await controller(ca_bundle=str(bundle), acquisition_retries=3) as service:
        api = await _api(service)
        model = await api.register(
            gguf_manifest("m", random_bytes(1000), url=https_server.url("/m.gguf"))
        )
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "failed"
    error = done["files"][0]["error"]
    assert error["code"] == "certificate_refused", error
    assert error["details"]["host"] == "127.0.0.1"
    assert "certificate of 127.0.0.1 was refused" in error["message"]
    assert https_server.requests == []  # the handshake failed: nothing was asked, once


@pytest.mark.deadline(60)
async def test_pause_keeps_the_offset_and_acquire_resumes_from_it(controller, https_server):
    content = random_bytes(12 * MiB, seed=5)
    https_server.add("/m.gguf", ServedFile(content, chunk_delay=0.002))
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        assert (await api.post(f"/api/v1/models/{model['id']}/acquire")).status_code == 202
        await api.wait_until(model["id"], lambda m: m["received_bytes"] >= 4 * MiB)
        paused = await api.post(f"/api/v1/models/{model['id']}/pause")
        assert paused.status_code == 200
        body = await paused.get_json()
        assert body["state"] == "paused" and body["files"][0]["state"] == "paused"
        kept = body["received_bytes"]
        assert 0 < kept < len(content)
        await trio.sleep(0.3)
        assert (await api.model(model["id"]))["received_bytes"] == kept
        again = await api.post(f"/api/v1/models/{model['id']}/pause")
        assert again.status_code == 409
        https_server.routes["/m.gguf"] = ServedFile(content)
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "verified"
    assert https_server.requests[-1].headers["range"] == f"bytes={kept}-"


async def _never_answers(request):
    await trio.sleep_forever()


@pytest.mark.parametrize("waiting_for", ["head", "body"])
@pytest.mark.deadline(50)
async def test_pause_interrupts_a_read_that_is_waiting_for_bytes(
    controller, https_server, waiting_for
):
    content = random_bytes(1000, seed=9)
    route = _never_answers if waiting_for == "head" else ServedFile(content, stall=True)
    https_server.add("/m.gguf", route)
    async with await controller(read_timeout="60s") as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        assert (await api.post(f"/api/v1/models/{model['id']}/acquire")).status_code == 202
        with trio.fail_after(30):
            await eventually(lambda: https_server.requests, None, every=0.01)
        # The worker thread is blocked reading; the pause aborts the connection, and
        # that is a pause, not a failure.
        with trio.fail_after(10):
            paused = await api.post(f"/api/v1/models/{model['id']}/pause")
        body = await paused.get_json()
    assert paused.status_code == 200
    assert body["state"] == "paused", body
    assert body["files"][0]["state"] == "absent" and body["files"][0]["reason"] is None, body


@pytest.mark.deadline(40)
async def test_receiving_goes_on_during_an_fsync_but_only_so_far(
    controller, https_server, monkeypatch
):
    import threading

    from ficc_core.models import download, partials

    content = random_bytes(40 * MiB, seed=11)
    https_server.add("/m.gguf", ServedFile(content))
    release, began = threading.Event(), []
    original = partials.PartialWriter.sync

    def first_fsync_hangs(writer):
        began.append(writer.written)
        if len(began) == 1:
            release.wait(30)
        return original(writer)

    monkeypatch.setattr(partials.PartialWriter, "sync", first_fsync_hangs)
    bound = download.MAX_UNSYNCED
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        partial = partial_file(
            service.config.data_dir, hashlib.sha256(content).hexdigest(), model["id"]
        )
        assert (await api.post(f"/api/v1/models/{model['id']}/acquire")).status_code == 202
        try:
            with trio.fail_after(30):
                await eventually(
                    lambda: partial.exists() and partial.stat().st_size >= bound, None, every=0.005
                )
            # Written on during the fsync, never past the bound, and nothing recorded
            # as durable before the fsync ends.
            assert partial.stat().st_size == bound
            assert (await api.model(model["id"]))["received_bytes"] == 0
        finally:
            release.set()
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "verified", done
    # The first fsync starts once SYNC_BYTES are written (a little later when the
    # receiving thread wrote on before the event loop ran it), well before the bound.
    assert download.SYNC_BYTES <= began[0] < bound
    assert began[1] >= bound  # the next fsync covered everything written meanwhile


@pytest.mark.deadline(60)
async def test_acquisitions_are_bounded_in_concurrency(controller, https_server):
    contents = [random_bytes(4 * MiB, seed=10 + i) for i in range(2)]
    for i, content in enumerate(contents):
        https_server.add(f"/{i}.bin", ServedFile(content, chunk_delay=0.01))
    body = {
        "name": "two",
        "format": "hf-directory",
        "files": [
            {
                "path": "config.json",
                "size": len(contents[0]),
                "sha256": hashlib.sha256(contents[0]).hexdigest(),
                "url": https_server.url("/0.bin"),
            },
            {
                "path": "w.safetensors",
                "size": len(contents[1]),
                "sha256": hashlib.sha256(contents[1]).hexdigest(),
                "url": https_server.url("/1.bin"),
            },
        ],
    }
    async with await controller(acquisition_concurrency=1) as service:
        api = await _api(service)
        model = await api.register(body)
        await api.post(f"/api/v1/models/{model['id']}/acquire")
        await trio.sleep(0.3)
        assert len(https_server.requests) == 1
        await api.wait_until(model["id"], lambda m: m["state"] == "verified")
    assert len(https_server.requests) == 2


async def test_the_body_is_hashed_as_it_arrives_off_the_event_loop(
    controller, https_server, monkeypatch
):
    import threading

    from ficc_core.models import blobs

    updates, second_passes = [], []

    class Recording:
        def __init__(self, digest):
            self.digest = digest

        def update(self, data):
            updates.append((threading.get_ident(), len(data)))
            self.digest.update(data)

        def hexdigest(self):
            return self.digest.hexdigest()

    original = blobs.BlobStore.partial_digest

    async def recording(self, ref, length):
        return Recording(await original(self, ref, length))

    monkeypatch.setattr(blobs.BlobStore, "partial_digest", recording)
    monkeypatch.setattr(blobs, "sha256_file", lambda *a, **k: second_passes.append(a))
    content = random_bytes(3 * MiB + 5, seed=6)
    https_server.add("/m.gguf", ServedFile(content))
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        assert (await api.acquire_and_wait(model["id"]))["state"] == "verified"
    assert sum(length for _thread, length in updates) == len(content)
    assert threading.get_ident() not in {thread for thread, _length in updates}
    assert second_passes == []  # published on the digest taken while receiving


async def test_a_body_cut_short_of_its_content_length_resumes_then_says_what_happened(
    controller, https_server
):
    content = random_bytes(10_000, seed=31)

    def short(request):
        """1000 bytes of what was asked, under a Content-Length of all of it, then close."""
        header = request.headers.get("range")
        start = int(header.removeprefix("bytes=").removesuffix("-")) if header else 0
        headers = {"content-length": str(len(content) - start)}
        if header:
            headers["content-range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        piece = content[start : start + 1000]
        return ServedFile(piece, headers=headers, status=206 if header else 200)

    https_server.add("/m.gguf", short)
    async with await controller(acquisition_retries=2) as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "failed"
    # Each retry resumed from the bytes already held; three attempts in all, no more.
    ranges = [request.headers.get("range") for request in https_server.requests]
    assert ranges == [None, "bytes=1000-", "bytes=2000-"]
    [file] = done["files"]
    assert file["received_bytes"] == 3000
    error = file["error"]
    assert error["code"] == "body_truncated"
    assert error["details"] == {
        "host": "127.0.0.1",
        "received": 1000,
        "declared": 8000,
        "missing": 7000,
        "attempts": 3,
    }
    assert error["message"] == (
        "127.0.0.1 closed the connection after 1,000 of the 8,000 body bytes its"
        " Content-Length declared (7,000 missing); gave up after 3 attempts"
    )
    assert done["acquisition"]["error"]["code"] == "body_truncated"


async def test_a_body_cut_short_once_is_resumed_and_verified(controller, https_server):
    content = random_bytes(10_000, seed=32)
    cut = []

    def short_once(request):
        if cut:
            return ServedFile(content)
        cut.append(request)
        return ServedFile(content[:4000], headers={"content-length": str(len(content))})

    https_server.add("/m.gguf", short_once)
    async with await controller() as service:
        api = await _api(service)
        model = await api.register(gguf_manifest("m", content, url=https_server.url("/m.gguf")))
        done = await api.acquire_and_wait(model["id"])
    assert done["state"] == "verified", done
    assert [request.headers.get("range") for request in https_server.requests] == [
        None,
        "bytes=4000-",
    ]
