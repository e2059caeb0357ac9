"""Input staging: nodes download verified blobs by digest, resumably, into a read-only cache."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from collections import namedtuple
from pathlib import Path

import httpx
import pytest
import trio

from ficc_core.agent import staging
from ficc_core.agent.runtimes import AgentSettings
from ficc_core.agent.staging import Stager, StagingError, stage_job_inputs, stager_from_settings
from ficc_core.base.digests import UnsafePath
from ficc_core.base.errors import ConfigError
from ficc_core.schema import EndpointContract, Job, JobInput
from ficc_core.testing.executor_kit import new_fence

from ..conftest import bearer, issue_token
from ..support.agent_support import open_controller
from ..support.models_support import fill_disk, gguf_manifest, mounted_tmpfs, random_bytes

MiB = 1 << 20
ROUTE = "/api/v1/contributors/blobs/<sha256>"


async def _verified_model(url: str, admin: str, content: bytes, name: str = "m") -> str:
    """Register a one-file model through the API, upload it, return its hex digest."""
    headers = bearer(admin)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        created = await client.post(
            "/api/v1/models", headers=headers, json=gguf_manifest(name, content)
        )
        assert created.status_code in (200, 201), created.text
        model = created.json()
        octet = {**headers, "Content-Type": "application/octet-stream"}
        for offset in range(0, len(content), 16 * MiB):
            uploaded = await client.post(
                f"/api/v1/models/{model['id']}/files/0/bytes?offset={offset}",
                headers=octet,
                content=content[offset : offset + 16 * MiB],
            )
            assert uploaded.status_code == 200, uploaded.text
        assert uploaded.json()["state"] == "verified"
    return hashlib.sha256(content).hexdigest()


async def _assigned_model(service, url: str, admin: str, content: bytes, name: str = "m") -> str:
    """As :func:`_verified_model`, its blob an input of an attempt assigned to node gpu-1."""
    digest = await _verified_model(url, admin, content, name)
    await service.contributors.assign("gpu-1", new_fence(), "process", inputs=[digest])
    return digest


def _served(service, status: str = "200") -> float:
    value = service.metrics.registry.get_sample_value(
        "ficc_http_requests_total", {"route": ROUTE, "method": "GET", "status": status}
    )
    return value or 0.0


@pytest.fixture
async def setup(tmp_path):
    """A controller with a node and an administrator credential."""
    async with open_controller(tmp_path) as (service, url):
        admin = (await service.auth.bootstrap())["token"]
        _, node = await service.contributors.add_node("gpu-1")
        yield service, url, admin, node


@pytest.mark.deadline(40)
async def test_a_node_stages_a_verified_blob_once_and_read_only(setup, tmp_path):
    service, url, admin, node = setup
    with trio.fail_after(30):
        content = random_bytes(3 * MiB + 17, seed=1)
        digest = await _assigned_model(service, url, admin, content)
        stager = Stager(tmp_path / "cache", url, node)
        path = await stager.stage(digest, len(content))
        assert path == tmp_path / "cache" / "sha256" / digest
        assert path.read_bytes() == content
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
        assert not (tmp_path / "cache" / "partial" / f"{digest}.part").exists()
        assert stager.requests == [(digest, None)]
        assert _served(service) == 1
        # Again, from this stager and from a fresh one (the index file): nothing fetched.
        assert await stager.stage(f"sha256:{digest}", len(content)) == path
        again = Stager(tmp_path / "cache", url, node)
        assert await again.stage(digest, len(content)) == path
        assert stager.requests == [(digest, None)] and again.requests == []
        assert _served(service) == 1


@pytest.mark.deadline(40)
async def test_concurrent_stages_of_one_digest_share_one_download(setup, tmp_path):
    service, url, admin, node = setup
    with trio.fail_after(30):
        content = random_bytes(2 * MiB, seed=2)
        digest = await _assigned_model(service, url, admin, content)
        stager = Stager(tmp_path / "cache", url, node, chunk_size=64 * 1024)
        paths = []

        async def one() -> None:
            paths.append(await stager.stage(digest, len(content)))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
        assert len(set(paths)) == 1 and len(paths) == 4
        assert len(stager.requests) == 1 and _served(service) == 1


@pytest.mark.deadline(40)
async def test_the_blob_route_serves_only_nodes_verified_referenced_blobs_with_ranges(setup):
    service, url, admin, node = setup
    with trio.fail_after(30):
        content = random_bytes(MiB + 5, seed=3)
        digest = await _assigned_model(service, url, admin, content)
        project = await issue_token(service, name="reader")
        route = f"/api/v1/contributors/blobs/{digest}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for headers in ({}, bearer(admin), bearer(project), bearer("ficcnode_x_y")):
                refused = await client.get(route, headers=headers)
                assert refused.status_code == 401, headers
                assert "error" in refused.json()
            whole = await client.get(route, headers=bearer(node))
            assert whole.status_code == 200
            assert whole.headers["Content-Length"] == str(len(content))
            assert whole.content == content
            part = await client.get(route, headers={**bearer(node), "Range": "bytes=1000-"})
            assert part.status_code == 206
            assert part.headers["Content-Range"] == f"bytes 1000-{len(content) - 1}/{len(content)}"
            assert part.headers["Content-Length"] == str(len(content) - 1000)
            assert part.content == content[1000:]
            for bad in (f"bytes={len(content)}-", "bytes=0-10", "items=0-"):
                out = await client.get(route, headers={**bearer(node), "Range": bad})
                assert out.status_code == 416, bad
                assert out.headers["Content-Range"] == f"bytes */{len(content)}"
            # Unknown, malformed, and recorded-but-unreferenced digests are all 404.
            unreferenced = random_bytes(10, seed=4)
            loose = hashlib.sha256(unreferenced).hexdigest()
            await service.store.write(
                lambda tx: service.blobs.ensure_row(tx, loose, 10, published=True)
            )
            service.blobs.published_path(loose).write_bytes(unreferenced)
            for missing in ("0" * 64, "XYZ", digest.upper(), loose):
                absent = await client.get(
                    f"/api/v1/contributors/blobs/{missing}", headers=bearer(node)
                )
                assert absent.status_code == 404, missing
                assert absent.json()["error"]["code"] == "blob_unknown"
            await service.contributors.revoke_node("gpu-1")
            revoked = await client.get(route, headers=bearer(node))
            assert revoked.status_code == 401


async def _interrupted(stager: Stager, digest: str, size: int, after: int) -> int:
    """Start staging and cancel it once ``after`` bytes are on disk; return the partial size."""
    with trio.CancelScope() as scope:

        def progress(_digest: str, have: int) -> None:
            if have >= after:
                scope.cancel()

        stager.on_progress = progress
        await stager.stage(digest, size)
    stager.on_progress = None
    assert scope.cancelled_caught
    return stager.partial_path(digest).stat().st_size


@pytest.mark.deadline(70)
async def test_an_interrupted_download_resumes_with_a_range(setup, tmp_path):
    service, url, admin, node = setup
    with trio.fail_after(60):
        content = random_bytes(32 * MiB, seed=5)
        digest = await _assigned_model(service, url, admin, content)
        stager = Stager(tmp_path / "cache", url, node, chunk_size=64 * 1024)
        partial = await _interrupted(stager, digest, len(content), after=4 * MiB)
        assert 4 * MiB <= partial < len(content)
        assert not stager.staged_path(digest).exists()
        path = await stager.stage(digest, len(content))
        assert stager.requests == [(digest, None), (digest, f"bytes={partial}-")]
        assert _served(service, "206") == 1
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.deadline(70)
async def test_a_corrupt_partial_fails_verification_is_discarded_and_a_retry_succeeds(
    setup, tmp_path
):
    service, url, admin, node = setup
    with trio.fail_after(60):
        content = random_bytes(8 * MiB, seed=6)
        digest = await _assigned_model(service, url, admin, content)
        stager = Stager(tmp_path / "cache", url, node, chunk_size=64 * 1024)
        await _interrupted(stager, digest, len(content), after=MiB)
        part = stager.partial_path(digest)
        _flip_byte(part, 100)
        with pytest.raises(StagingError) as failed:
            await stager.stage(digest, len(content))
        assert failed.value.code == "digest_mismatch"
        assert not part.exists() and not stager.staged_path(digest).exists()
        path = await stager.stage(digest, len(content))
        assert stager.requests[-1] == (digest, None)
        assert path.read_bytes() == content


@pytest.mark.deadline(40)
async def test_insufficient_free_disk_is_refused_before_any_download(setup, tmp_path, monkeypatch):
    service, url, admin, node = setup
    with trio.fail_after(30):
        content = random_bytes(MiB, seed=7)
        digest = await _assigned_model(service, url, admin, content)
        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(staging, "disk_usage", lambda _path: usage(10 * MiB, 0, 2 * MiB))
        stager = Stager(tmp_path / "cache", url, node, free_margin=2 * MiB)
        with pytest.raises(StagingError) as refused:
            await stager.stage(digest, len(content))
        assert refused.value.code == "insufficient_disk"
        assert refused.value.details["free"] == 2 * MiB
        assert "not enough free disk" in refused.value.message
        assert stager.requests == [] and _served(service) == 0
        assert not stager.partial_path(digest).exists()
        # With the margin met, it goes ahead.
        stager.free_margin = MiB
        assert (await stager.stage(digest, len(content))).read_bytes() == content


@pytest.mark.deadline(70)
async def test_a_disk_that_fills_during_a_staging_copy_is_refused_with_its_offset(setup, tmp_path):
    service, url, admin, node = setup
    content = random_bytes(12 * MiB, seed=8)
    digest = await _assigned_model(service, url, admin, content)
    with mounted_tmpfs(tmp_path / "cache", "16m") as cache, trio.fail_after(60):
        stager = Stager(cache, url, node, chunk_size=64 * 1024, free_margin=0)
        hog = cache / "hog"

        def progress(_digest: str, have: int) -> None:
            if have >= 2 * MiB and not hog.exists():
                fill_disk(hog)  # something else takes the rest of the disk

        stager.on_progress = progress
        with pytest.raises(StagingError) as refused:
            await stager.stage(digest, len(content))
        stager.on_progress = None
        assert refused.value.code == "insufficient_storage"
        assert refused.value.status == 507
        offset = refused.value.details["offset"]
        assert 2 * MiB <= offset < len(content)
        assert f"resumes from offset {offset}" in refused.value.message
        part = stager.partial_path(digest)
        assert part.stat().st_size == offset
        assert part.read_bytes() == content[:offset]
        # Space freed: staging again resumes from the offset and verifies.
        hog.unlink()
        path = await stager.stage(digest, len(content))
        assert stager.requests[-1] == (digest, f"bytes={offset}-")
        assert path.read_bytes() == content


@pytest.mark.deadline(40)
async def test_a_shared_directory_copy_is_used_without_any_request(tmp_path):
    with trio.fail_after(30):
        content = random_bytes(MiB, seed=8)
        digest = hashlib.sha256(content).hexdigest()
        wrong, shared = tmp_path / "wrong", tmp_path / "filer"
        wrong.mkdir()
        (shared / "sha256").mkdir(parents=True)
        (wrong / digest).write_bytes(b"not it")
        (shared / "sha256" / digest).write_bytes(content)
        # Nothing listens on the controller URL: any request would fail.
        stager = Stager(
            tmp_path / "cache",
            "http://127.0.0.1:9",
            "ficcnode_x_y",
            shared_dirs=[wrong, shared],
        )
        assert await stager.stage(digest, len(content)) == shared / "sha256" / digest
        assert stager.requests == []
        # A copy that does not verify does not count.
        lone = Stager(
            tmp_path / "cache2", "http://127.0.0.1:9", "ficcnode_x_y", shared_dirs=[wrong]
        )
        with pytest.raises(StagingError) as failed:
            await lone.stage(digest, len(content))
        assert failed.value.code == "download_failed"


@pytest.mark.deadline(40)
async def test_stage_job_inputs_rewrites_blob_inputs_to_staged_files(setup, tmp_path):
    service, url, admin, node = setup
    with trio.fail_after(30):
        content = random_bytes(MiB, seed=9)
        digest = await _assigned_model(service, url, admin, content)
        there = "/controller/blobs/sha256/" + digest
        job = Job(
            argv=("engine", "--model", there, f"--draft={there}"),
            env={"MODEL": there, "OTHER": "/opt/templates"},
            endpoint=EndpointContract.unix(["/health"]),
            inputs=[
                JobInput(id="model", path=there, digest=f"sha256:{digest}"),
                JobInput(id="templates", path="/opt/templates"),
            ],
        )
        stager = stager_from_settings(
            tmp_path / "agent",
            url,
            node,
            AgentSettings(staging_shared_dirs=(tmp_path / "none",)),
        )
        staged = await stage_job_inputs(stager, job, {f"sha256:{digest}": len(content)})
        model, templates = staged.inputs
        assert Path(model.path) == tmp_path / "agent" / "blobs" / "sha256" / digest
        assert await trio.Path(model.path).read_bytes() == content
        assert model.digest == f"sha256:{digest}"
        assert templates == job.inputs[1]
        assert staged.argv == ("engine", "--model", model.path, f"--draft={model.path}")
        assert staged.env == {"MODEL": model.path, "OTHER": "/opt/templates"}


def test_agent_settings_read_staging_shared_dirs(tmp_path):
    settings = AgentSettings.from_document({"staging": {"shared_dirs": ["/mnt/filer"]}}, "t")
    assert settings.staging_shared_dirs == (Path("/mnt/filer"),)
    assert AgentSettings.from_document({}, "t").staging_shared_dirs == ()
    for bad in ({"staging": {"shared_dirs": ["relative"]}}, {"staging": {"cache": "/x"}}):
        with pytest.raises(ConfigError):
            AgentSettings.from_document(bad, "t")


def test_the_cache_survives_a_removed_index(tmp_path):
    # A missing or unreadable index only costs a re-hash.
    stager = Stager(tmp_path, "http://127.0.0.1:9", "ficcnode_x_y")
    assert stager._load_index() == {}
    (tmp_path / "verified.json").write_text("{not json")
    assert stager._load_index() == {}
    shutil.rmtree(tmp_path)


@pytest.mark.deadline(70)
async def test_a_remote_launch_stages_the_blob_input_and_the_engine_reads_it(setup, tmp_path):
    from ficc_executor_process.testing import running_process_provider, short_state_dir

    from ficc_core.agent.remote import RemoteAgent
    from ficc_core.executor import BodyChunk, EndOfStream, ResponseHead
    from ficc_core.testing.executor_kit import standin_job

    service, url, admin, node = setup
    with trio.fail_after(60):
        content = random_bytes(2 * MiB + 3, seed=9)
        digest = await _verified_model(url, admin, content)
        with short_state_dir("fs-") as agent_dir:
            async with running_process_provider(agent_dir / "p") as provider:
                make = staging_agents(provider, agent_dir, url, node)
                async with trio.open_nursery() as nursery:
                    await nursery.start(RemoteAgent(url, node, make).run)
                    while (await service.contributors.get("gpu-1")).state != "connected":  # noqa: ASYNC110
                        await trio.sleep(0.05)
                    # The controller names the blob by digest; the path is the
                    # controller's own and does not exist on the node.
                    job = standin_job(
                        inputs=(
                            JobInput(
                                id="model",
                                path="/nonexistent/on/this/node.gguf",
                                digest=f"sha256:{digest}",
                            ),
                        )
                    )
                    fence = new_fence()
                    await service.contributors.launch(
                        "gpu-1", "process", job, fence, blobs={f"sha256:{digest}": len(content)}
                    )
                    staged = agent_dir / "blobs" / "sha256" / digest
                    assert staged.read_bytes() == content
                    assert stat.S_IMODE(staged.stat().st_mode) == 0o444
                    endpoint = service.contributors.endpoint("gpu-1")
                    await provider.wait_ready(fence)
                    await endpoint.open(fence, "up", "POST", "/echo", {}, b"", input_id="model")
                    echoed = bytearray()
                    while not isinstance(event := await endpoint.read(fence, "up"), EndOfStream):
                        if isinstance(event, BodyChunk):
                            echoed.extend(event.data)
                        else:
                            assert isinstance(event, ResponseHead) and event.status == 200
                    answer = json.loads(bytes(echoed))
                    assert answer["body_length"] == len(content)
                    assert answer["body_sha256"] == digest
                    await service.contributors.stop("gpu-1", fence, grace=1.0)
                    nursery.cancel_scope.cancel()


@pytest.mark.deadline(70)
async def test_a_directory_model_is_assembled_from_staged_blobs_read_only(setup, tmp_path):
    from ficc_core.agent.staging import stage_directory

    service, url, admin, node = setup
    with trio.fail_after(60):
        config = b'{"architectures": ["LlamaForCausalLM"]}'
        weights = random_bytes(3 * MiB, seed=12)
        files = {}
        for name, content in {"config.json": config, "model.safetensors": weights}.items():
            model = name.replace(".", "-")
            digest = await _assigned_model(service, url, admin, content, name=model)
            files[name] = (f"sha256:{digest}", len(content))
        stager = Stager(tmp_path / "cache", url, node)
        root = await stage_directory(stager, files)
        assert (root / "config.json").read_bytes() == config
        assert (root / "model.safetensors").read_bytes() == weights
        assert stat.S_IMODE((root / "model.safetensors").stat().st_mode) == 0o444
        # Hard links to the staged blobs: the tree costs no second copy.
        assert (root / "model.safetensors").stat().st_nlink == 2
        assert await stage_directory(stager, files) == root
        assert len(stager.requests) == 2
        # A tree whose file changed (the staged blob it links to with it) is not reused:
        # the blob is downloaded again and the tree assembled again from it.
        damaged = root / "model.safetensors"
        damaged.chmod(0o644)
        damaged.write_bytes(b"x" * len(weights))
        assert await stage_directory(stager, files) == root
        assert (root / "model.safetensors").read_bytes() == weights
        assert stat.S_IMODE((root / "model.safetensors").stat().st_mode) == 0o444
        assert len(stager.requests) == 3
        job = Job(
            argv=(
                "vllm", "serve", "/controller/models/m",
                # A file inside the directory (a split GGUF's first part), bare or after "=".
                "/controller/models/m/config.json", "--x=/controller/models/m/config.json",
                "/controller/models/mx",  # only the same prefix, not inside: left alone
            ),
            endpoint=EndpointContract.unix(["/health"]),
            inputs=(JobInput(id="model", path="/controller/models/m"),),
        )  # fmt: skip
        staged = await stage_job_inputs(stager, job, {}, {"model": files})
        assert staged.inputs[0].path == str(root)
        assert staged.argv[2:] == (
            str(root),
            f"{root}/config.json",
            f"--x={root}/config.json",
            "/controller/models/mx",
        )
        with pytest.raises(UnsafePath) as unsafe:
            await stage_directory(stager, {"../escape": files["config.json"]})
        assert (unsafe.value.code, unsafe.value.status) == ("unsafe_path", 502)


def staging_agents(provider, agent_dir: Path, url: str, token: str):
    """A ``RemoteAgent`` factory: agents on ``provider`` that stage inputs from ``url``."""
    from ficc_core.agent import Agent

    def make(node_id: str) -> Agent:
        agent = Agent(node_id=node_id, providers={"process": provider}, state_dir=agent_dir)
        agent.stager = Stager(agent_dir / "blobs", url, token)
        return agent

    return make
