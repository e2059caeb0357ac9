"""Hub preview: turn a public hub repository's GGUF files into manifests without downloading them.

The hub is spoken to in Hugging Face's API shapes, at a configurable base URL (a
mirror works): ``GET {base}/api/models/{repository}/revision/{revision}?blobs=true``
lists the files with their sizes and LFS sha256 digests, and each GGUF header is
read from ``{base}/{repository}/resolve/{revision}/{filename}`` with HTTP Range
requests, through :func:`~ficc_core.models.fetch.open_response` so that every
redirect (hubs redirect to a CDN) is re-checked. Only the header region is read:
a server that ignores ``Range`` is read up to the same bounded prefix and closed.

Manifests name the commit the hub resolved ``revision`` to, when it reports one,
so that a later acquisition fetches exactly the bytes whose digests were listed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from contextlib import aclosing
from pathlib import PurePosixPath
from typing import Any, NoReturn
from urllib.parse import quote

import attrs
import trio

from ..base.errors import FiccError, InvalidRequest, NotFound
from ..schema import ModelFile, ModelManifest, ModelSource, unstructure
from ..schema._convert import FieldError
from ..schema.models import gguf_split_part
from .fetch import Fetcher, FetchPolicy, Response, open_response
from .gguf import DEFAULT_CAP, GgufMetadata, merge_split, read_gguf_header

#: The largest repository listing read from the hub API.
MAX_LISTING_BYTES = 16 * 1024 * 1024
#: The most GGUF files previewed from one repository when no file is named.
MAX_FILES = 64
#: How many GGUF headers are read at once.
CONCURRENCY = 4

_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILENAME_BAD = re.compile(r"[\x00-\x1f\x7f\\]")


class HubError(FiccError):
    """The hub answered with an error, or with something other than its API's shapes."""

    status = 502
    code = "hub_unavailable"


@attrs.frozen(kw_only=True)
class HubRefusal:
    """Why one file of a repository has no manifest: a stable code and a sentence."""

    code: str
    message: str


@attrs.frozen(kw_only=True)
class HubPreview:
    """One GGUF model of a hub repository: its manifest and header metadata, or a refusal.

    A model is one ``.gguf`` file, or every part of a split GGUF (one preview, its
    manifest listing every part, its metadata from every part's header).

    :ivar filename: the file's path in the repository (a split GGUF's first part).
    :ivar size: its size as the hub lists it, if it does (every part's, summed).
    :ivar parts: a split GGUF's part paths in order (None for a single file).
    :ivar manifest: a registrable single-file GGUF manifest (None when refused).
    :ivar metadata: what its GGUF header says (None when refused).
    :ivar refusal: why it was not previewed (None when it was).
    """

    filename: str
    size: int | None
    parts: tuple[str, ...] | None = None
    manifest: ModelManifest | None = None
    metadata: GgufMetadata | None = None
    refusal: HubRefusal | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the API's JSON form; absent parts are omitted."""
        result: dict[str, Any] = {"filename": self.filename}
        if self.size is not None:
            result["size"] = self.size
        if self.parts is not None:
            result["parts"] = list(self.parts)
        if self.manifest is not None:
            result["manifest"] = unstructure(self.manifest)
        if self.metadata is not None:
            result["metadata"] = self.metadata.to_json()
        if self.refusal is not None:
            result["refusal"] = attrs.asdict(self.refusal)
        return result


def _validate(repository: str, revision: str, filename: str | None) -> None:
    problems = []
    if (
        not isinstance(repository, str)
        or not _REPOSITORY.fullmatch(repository)
        or ".." in repository
    ):
        problems.append(("repository", 'must be "owner/name" (letters, digits, ".", "_", "-")'))
    if (
        not isinstance(revision, str)
        or not _REVISION.fullmatch(revision)
        or ".." in revision
        or "//" in revision
        or revision.endswith("/")
    ):
        problems.append(("revision", 'must be a branch, tag or commit (no "..", "//")'))
    if filename is not None and (problem := _filename_problem(filename)):
        problems.append(("filename", problem))
    if problems:
        raise InvalidRequest(
            "; ".join(f"{field} {reason}" for field, reason in problems),
            details={"fields": {field: reason for field, reason in problems}},
        )


def _filename_problem(filename: Any) -> str | None:
    if not isinstance(filename, str) or not filename or len(filename) > 1024:
        return "must be a non-empty relative path"
    if _FILENAME_BAD.search(filename) or filename.startswith("/"):
        return "must be a relative POSIX path without control characters or backslashes"
    if any(segment in ("", ".", "..") for segment in filename.split("/")):
        return 'must not contain empty, "." or ".." segments'
    if not filename.lower().endswith(".gguf"):
        return 'must name a ".gguf" file'
    return None


async def _read_body(response: Response, skip: int, length: int) -> bytes:
    """Return ``length`` body bytes after the first ``skip`` (fewer at the end of the body)."""
    encoding = response.headers.get("content-encoding", "identity").lower()
    if encoding not in ("", "identity"):
        raise HubError(
            f"{response.url} answered with content-encoding {encoding!r}; identity was asked",
            details={"url": str(response.url)},
        )
    kept = bytearray()
    # A body that runs on (Range ignored, or more than asked) is left as soon as it
    # has given more than enough, and closed with the response. Read failures are
    # FetchErrors (fetch_timeout, connection_dropped, body_truncated) from the fetch
    # layer.
    # aiter_raw is an async generator, which httpx annotates as only an AsyncIterator.
    async with aclosing(response.aiter_raw()) as pieces:  # type: ignore[type-var]
        async for piece in pieces:
            if skip >= len(piece):
                skip -= len(piece)
                continue
            kept += piece[skip:]
            skip = 0
            if len(kept) > length:
                break
    return bytes(kept[:length])


def _refuse_status(response: Response, what: str, not_found_code: str) -> NoReturn:
    if response.status_code in (401, 403, 404):
        raise NotFound(
            f"{what} was not found on the hub, or is not public (HTTP {response.status_code})",
            code=not_found_code,
            details={"url": str(response.url), "status": response.status_code},
        )
    raise HubError(
        f"the hub answered HTTP {response.status_code} for {what}",
        details={"url": str(response.url), "status": response.status_code},
    )


class _RangeReader:
    """``read_range`` for the GGUF reader over HTTP Range requests to one URL."""

    def __init__(self, client, policy, url: str, size: int, filename: str) -> None:
        self.client, self.policy, self.url, self.size = client, policy, url, size
        self.filename = filename

    async def __call__(self, offset: int, length: int) -> bytes:
        headers = {"Range": f"bytes={offset}-{offset + length - 1}", "Accept-Encoding": "identity"}
        async with open_response(self.client, self.url, self.policy, headers=headers) as response:
            if response.status_code == 416:
                return b""
            if response.status_code == 206:
                self._check_content_range(response.headers.get("content-range", ""), offset)
                return await _read_body(response, 0, length)
            if response.status_code == 200:
                # Range ignored: the body is the whole file from byte 0; read the prefix
                # that ends where the request would have, then hang up.
                return await _read_body(response, offset, length)
            _refuse_status(response, f"{self.filename!r}", "hub_file_not_found")

    def _check_content_range(self, header: str, offset: int) -> None:
        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", header.strip())
        if match is None or int(match[1]) != offset:
            raise HubError(
                f"the hub answered a range request for {self.filename!r} with "
                f"Content-Range {header!r}, not one starting at byte {offset}",
                details={"url": self.url, "content_range": header},
            )
        if match[3] != "*" and int(match[3]) != self.size:
            raise HubError(
                f"{self.filename!r} is {int(match[3]):,} bytes on the hub's file server but "
                f"{self.size:,} in its listing",
                code="hub_inconsistent",
                details={"url": self.url, "listed": self.size, "served": int(match[3])},
            )


async def _listing(client, policy, base: str, repository: str, revision: str) -> dict[str, Any]:
    url = f"{base}/api/models/{repository}/revision/{quote(revision, safe='')}?blobs=true"
    async with open_response(
        client, url, policy, headers={"Accept-Encoding": "identity"}
    ) as response:
        if response.status_code != 200:
            _refuse_status(
                response, f"repository {repository!r} at {revision!r}", "hub_repository_not_found"
            )
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_LISTING_BYTES:
            raise HubError(
                f"the hub's listing of {repository!r} is larger than {MAX_LISTING_BYTES:,} bytes",
                details={"url": url},
            )
        body = await _read_body(response, 0, MAX_LISTING_BYTES + 1)
    if len(body) > MAX_LISTING_BYTES:
        raise HubError(
            f"the hub's listing of {repository!r} is larger than {MAX_LISTING_BYTES:,} bytes",
            details={"url": url},
        )
    try:
        info = json.loads(body)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("siblings"), list):
        raise HubError(
            f"the hub's answer for {repository!r} is not a model listing with siblings",
            code="hub_invalid_response",
            details={"url": url},
        )
    return info


def _sibling_refusal(sibling: Mapping[str, Any]) -> HubRefusal | None:
    name = sibling["rfilename"]
    problem = _filename_problem(name)
    if problem:
        return HubRefusal(code="hub_invalid_filename", message=f"the hub's file name {problem}")
    lfs = sibling.get("lfs")
    sha256 = lfs.get("sha256") if isinstance(lfs, Mapping) else None
    size = _size(sibling)
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256) or size is None:
        return HubRefusal(
            code="hub_unverifiable",
            message=f"the hub lists no LFS sha256 and size for {name!r}, so a download of it "
            "could not be verified",
        )
    return None


def _size(sibling: Mapping[str, Any]) -> int | None:
    lfs = sibling.get("lfs")
    size = lfs.get("size") if isinstance(lfs, Mapping) else None
    size = sibling.get("size") if size is None else size
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    return None


def _card_licence(info: Mapping[str, Any]) -> str | None:
    card = info.get("cardData")
    value = card.get("license") if isinstance(card, Mapping) else None
    return value if isinstance(value, str) and value else None


def _models(siblings: list[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The GGUF files grouped into models: a file alone, or a split GGUF's parts in order.

    A split GGUF missing a part is a group too; :func:`_preview_model` refuses it.
    """
    groups: list[list[Mapping[str, Any]]] = []
    splits: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for sibling in siblings:
        part = gguf_split_part(sibling["rfilename"])
        if part is None:
            groups.append([sibling])
            continue
        prefix, _number, count = part
        if (prefix, count) not in splits:
            splits[prefix, count] = []
            groups.append(splits[prefix, count])
        splits[prefix, count].append(sibling)
    for parts in splits.values():
        parts.sort(key=_split_part)
    return groups


def _split_part(sibling: Mapping[str, Any]) -> tuple[str, int, int]:
    """The split GGUF part a sibling grouped with its parts is."""
    part = gguf_split_part(sibling["rfilename"])
    assert part is not None
    return part


def _split_refusal(parts: list[Mapping[str, Any]]) -> HubRefusal | None:
    found = [_split_part(part) for part in parts]
    prefix, _number, count = found[0]
    missing = sorted(set(range(1, count + 1)) - {part[1] for part in found})
    if not missing:
        return None
    shown = ", ".join(f"{prefix}-{number:05d}-of-{count:05d}.gguf" for number in missing[:5])
    return HubRefusal(
        code="gguf_split_incomplete",
        message=f"this split GGUF has {count} parts, but the repository lacks "
        f"{len(missing)} of them ({shown}{', ...' if len(missing) > 5 else ''})",
    )


async def _preview_model(
    client, policy, *, base, repository, pinned, parts, licence, cap
) -> HubPreview:
    filename = parts[0]["rfilename"]
    split = gguf_split_part(filename)
    refusal = _split_refusal(parts) if split is not None else None
    for part in parts:
        refusal = refusal or _sibling_refusal(part)
    if refusal is not None:
        return _listed(parts, refusal)
    files, headers = [], []
    for part in parts:
        name, size = part["rfilename"], _size(part)
        assert size is not None  # _sibling_refusal refused a part without one
        path = "/".join(quote(segment, safe="") for segment in name.split("/"))
        url = f"{base}/{repository}/resolve/{quote(pinned, safe='')}/{path}"
        reader = _RangeReader(client, policy, url, size, name)
        headers.append(await read_gguf_header(reader, size=size, cap=cap))
        files.append(ModelFile(path=name, size=size, sha256=part["lfs"]["sha256"], url=url))
    metadata = merge_split(headers)
    stem = PurePosixPath(split[0] if split is not None else filename).name
    name = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    try:
        manifest = ModelManifest(
            name=name,
            format="gguf",
            files=files,
            licence=licence or metadata.licence,
            source=ModelSource(repository=repository, revision=pinned),
        )
    except (FieldError, TypeError, ValueError) as exc:
        raise HubError(
            f"the hub's metadata for {filename!r} does not make a valid manifest: {exc}",
            code="hub_invalid_response",
        ) from None
    preview = _listed(parts, None)
    return attrs.evolve(preview, manifest=manifest, metadata=metadata)


async def hub_preview(
    client: Fetcher,
    policy: FetchPolicy,
    base_url: str,
    repository: str,
    revision: str,
    *,
    filename: str | None = None,
    licence: str | None = None,
    cap: int = DEFAULT_CAP,
) -> list[HubPreview]:
    """Preview a hub repository's GGUF models (or only ``filename``'s) as manifests.

    A model is one ``.gguf`` file, or every part of a split GGUF
    (``<name>-00001-of-0000N.gguf`` ...; any part's name given as ``filename``
    previews the whole model). Each preview holds a GGUF manifest (sizes and sha256
    from the hub's LFS metadata, the resolve URLs at the commit the hub reported,
    the licence given, else the model card's, else the header's) and the headers'
    metadata, or a :class:`HubRefusal` saying why not: split GGUFs missing a part,
    files without an LFS sha256, malformed headers. Only the header region of each
    file is read (at most ``cap`` bytes).

    :param client: from :func:`~ficc_core.models.fetch.make_client` with ``policy``.
    :param base_url: the hub, such as ``https://huggingface.co``.
    :raises InvalidRequest: ``repository``, ``revision`` or ``filename`` is malformed
        (nothing is requested).
    :raises NotFound: ``hub_repository_not_found``, or ``hub_file_not_found`` for a
        ``filename`` the repository does not hold.
    :raises FiccError: for a named ``filename``, whatever refuses it
        (``hub_unverifiable``, ``gguf_split_incomplete``, ``invalid_gguf``); the
        hub's or the fetch's own errors (:class:`HubError`, ``FetchError``).
    """
    _validate(repository, revision, filename)
    base = base_url.rstrip("/")
    info = await _listing(client, policy, base, repository, revision)
    sha = info.get("sha")
    pinned = sha if isinstance(sha, str) and _COMMIT.fullmatch(sha) else revision
    licence = licence or _card_licence(info)
    siblings = [
        s
        for s in info["siblings"]
        if isinstance(s, Mapping) and isinstance(s.get("rfilename"), str)
    ]
    arguments: dict[str, Any] = {
        "base": base,
        "repository": repository,
        "pinned": pinned,
        "licence": licence,
    }
    arguments["cap"] = cap

    ggufs = [s for s in siblings if s["rfilename"].lower().endswith(".gguf")]
    if filename is not None:
        if not any(s["rfilename"] == filename for s in siblings):
            raise NotFound(
                f"{repository!r} at {revision!r} has no file {filename!r}",
                code="hub_file_not_found",
                details={"repository": repository, "revision": revision, "filename": filename},
            )
        # Any part of a split GGUF names the whole model.
        [parts] = [group for group in _models(ggufs) if filename in _names(group)]
        preview = await _preview_model(client, policy, parts=parts, **arguments)
        if preview.refusal is not None:
            raise FiccError(
                preview.refusal.message,
                code=preview.refusal.code,
                status=422,
                details={"filename": filename},
            )
        return [preview]

    if not ggufs:
        raise NotFound(
            f"{repository!r} at {revision!r} holds no .gguf file",
            code="hub_no_gguf",
            details={"repository": repository, "revision": revision},
        )
    candidates = _models(ggufs)
    results: list[HubPreview | None] = [None] * len(candidates)
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async def one(index: int, parts: list[Mapping[str, Any]]) -> None:
        async with limiter:
            try:
                results[index] = await _preview_model(client, policy, parts=parts, **arguments)
            except FiccError as exc:
                # One bad model does not hide the others: it is listed with its reason.
                refusal = HubRefusal(code=exc.code, message=exc.message)
                results[index] = _listed(parts, refusal)

    async with trio.open_nursery() as nursery:
        for index, parts in enumerate(candidates):
            if index >= MAX_FILES:
                message = f"more than {MAX_FILES} GGUF models; name this one with filename"
                results[index] = _listed(
                    parts, HubRefusal(code="hub_too_many_files", message=message)
                )
                continue
            nursery.start_soon(one, index, parts)
    return [result for result in results if result is not None]


def _names(parts: list[Mapping[str, Any]]) -> list[str]:
    return [part["rfilename"] for part in parts]


def _listed(parts: list[Mapping[str, Any]], refusal: HubRefusal | None) -> HubPreview:
    """A model as the listing shows it (name, summed size, parts), with its refusal."""
    sizes = [size for part in parts if (size := _size(part)) is not None]
    split = gguf_split_part(parts[0]["rfilename"]) is not None
    return HubPreview(
        filename=parts[0]["rfilename"],
        size=sum(sizes) if len(sizes) == len(parts) else None,
        parts=tuple(_names(parts)) if split else None,
        refusal=refusal,
    )
