"""Input staging: a remote node's copy of the model blobs its engines read.

A node stages a blob by digest into its cache (``<cache_dir>/sha256/<hex>``,
read-only) before launching an engine that reads it. In order, :meth:`Stager.stage`

1. uses the cached copy if it is there and verifies (a small index file records
   files already verified, by size and modification time, so they are not hashed
   again at every launch);
2. uses a copy in one of the operator's shared directories (a shared filer, an
   earlier copy), named ``<dir>/<hex>`` or ``<dir>/sha256/<hex>``, if it verifies,
   and fetches nothing;
3. otherwise checks free disk, downloads the blob from the controller's
   ``GET /api/v1/contributors/blobs/<hex>`` with the node credential, resuming a
   ``<cache_dir>/partial/<hex>.part`` left by an interrupted download with
   ``Range: bytes=<size>-``, hashes it in a worker thread, and renames it into
   place with mode 0444. A file that does not hash to its digest is discarded.

With several controllers (they share one blob store), the download is asked of
the controller that sent the launch first, then of the others in the configured
order while a controller is unreachable or answers 5xx; the partial file carries
over, so the next one resumes where the last stopped. A 4xx or a digest mismatch
is an answer, not an outage, and is not asked again elsewhere.

Concurrent stages of one digest share one download. Nothing blocking runs on the
event loop: file writes, hashing, renames and disk checks run in worker threads.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import ssl
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import httpx
import trio

from ..base.digests import assemble_tree, rename_durably, sha256_file, tree_listing
from ..base.digests import hex_digest as _hex
from ..base.errors import FiccError
from ..schema import Job
from .runtimes import AgentSettings

log = logging.getLogger(__name__)

#: ``shutil.disk_usage``, looked up at each check (tests replace it).
disk_usage = shutil.disk_usage

#: Free space kept beyond a blob's remaining bytes, unless the stager is told otherwise.
DEFAULT_FREE_MARGIN = 1 << 30

_INDEX = "verified.json"


class StagingError(FiccError):
    """A blob could not be staged: no space, a refused download, a digest mismatch."""

    status = 502
    code = "staging_failed"


@attrs.frozen
class _Seen:
    size: int
    mtime_ns: int


class Stager:
    """Stages blobs by digest into ``cache_dir`` for one node.

    :param cache_dir: the node-local cache (``sha256/``, ``partial/`` and the index).
    :param controller_url: the controller's base URL (``https://ficc.example``).
    :param other_controllers: the base URLs of more controllers of the installation,
        asked in order when the one before is unreachable.
    :param credential: the node credential (``ficcnode_...``), sent as a Bearer token.
    :param ssl_context: trust for an https controller, the same as the agent's
        connection (default: the system's trust store; verification is always on).
    :param shared_dirs: read-only directories that may already hold blobs.
    :param free_margin: bytes that must stay free after a download.
    :param chunk_size: bytes per read from the response and per write to disk.
    :param transport: an httpx transport (tests); default: the network.
    """

    def __init__(
        self,
        cache_dir: Path,
        controller_url: str,
        credential: str,
        *,
        other_controllers: Sequence[str] = (),
        ssl_context: ssl.SSLContext | None = None,
        shared_dirs: Sequence[Path] = (),
        free_margin: int = DEFAULT_FREE_MARGIN,
        chunk_size: int = 1 << 20,
        timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.controller_url = controller_url.rstrip("/")
        #: Every controller blobs may come from, in the order they are asked.
        self.controller_urls = tuple(
            dict.fromkeys(url.rstrip("/") for url in (controller_url, *other_controllers))
        )
        self.shared_dirs = tuple(Path(d) for d in shared_dirs)
        self.free_margin = free_margin
        self.chunk_size = chunk_size
        self._credential = credential
        self._ssl_context = ssl_context
        self._timeout = timeout
        self._transport = transport
        self._locks: dict[str, trio.Lock] = {}
        self._index: dict[str, _Seen] | None = None
        self._io_limiter = trio.CapacityLimiter(2)
        #: Each download request made, as (hex digest, Range header or None).
        self.requests: list[tuple[str, str | None]] = []
        #: The controller each download request went to, in order.
        self.asked: list[str] = []
        #: Called with (hex digest, bytes on disk) after each chunk written (tests, progress).
        self.on_progress: Callable[[str, int], None] | None = None

    # -- paths -------------------------------------------------------------------------------

    def staged_path(self, sha256: str) -> Path:
        """Where a staged blob lives in the cache."""
        return self.cache_dir / "sha256" / _hex(sha256)

    def partial_path(self, sha256: str) -> Path:
        """Where an interrupted download of a blob waits to be resumed."""
        return self.cache_dir / "partial" / f"{_hex(sha256)}.part"

    def blob_url(self, sha256: str, controller_url: str | None = None) -> str:
        """The route of ``controller_url`` (default: the first) that serves ``sha256``."""
        base = (controller_url or self.controller_url).rstrip("/")
        return f"{base}/api/v1/contributors/blobs/{_hex(sha256)}"

    def sources(self, first: str | None = None) -> tuple[str, ...]:
        """The controllers to ask, in order: ``first`` (when given), then the others."""
        if first is None:
            return self.controller_urls
        return tuple(dict.fromkeys((first.rstrip("/"), *self.controller_urls)))

    # -- the index of verified files ---------------------------------------------------------

    def _load_index(self) -> dict[str, _Seen]:
        try:
            document = json.loads((self.cache_dir / _INDEX).read_text(encoding="utf-8"))
            return {path: _Seen(int(s), int(m)) for path, (s, m) in document.items()}
        except (OSError, ValueError, TypeError):
            return {}

    def _save_index(self, index: dict[str, _Seen]) -> None:
        # Best effort: without the index, a file is only hashed again.
        target = self.cache_dir / _INDEX
        temporary = target.with_suffix(".tmp")
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            temporary.write_text(
                json.dumps({path: [seen.size, seen.mtime_ns] for path, seen in index.items()}),
                encoding="utf-8",
            )
            os.replace(temporary, target)
        except OSError as exc:
            log.warning("could not write the staging index %s: %s", target, exc)

    async def _verified(self, path: Path, hex_digest: str, size: int | None) -> bool:
        """Whether ``path`` is a regular file holding ``hex_digest`` (hashing only if unseen)."""
        try:
            info = await trio.to_thread.run_sync(path.stat)
        except OSError:
            return False
        if not stat.S_ISREG(info.st_mode) or (size is not None and info.st_size != size):
            return False
        if self._index is None:
            self._index = await trio.to_thread.run_sync(self._load_index)
        key = str(path)
        seen = _Seen(info.st_size, info.st_mtime_ns)
        if self._index.get(key) == seen:
            return True
        try:
            actual = await trio.to_thread.run_sync(
                sha256_file, path, info.st_size, limiter=self._io_limiter
            )
        except OSError:
            return False
        if actual != hex_digest:
            return False
        await self._record(path, seen)
        return True

    async def _record(self, path: Path, seen: _Seen) -> None:
        if self._index is None:
            self._index = await trio.to_thread.run_sync(self._load_index)
        self._index[str(path)] = seen
        snapshot = dict(self._index)
        await trio.to_thread.run_sync(self._save_index, snapshot)

    # -- staging -----------------------------------------------------------------------------

    async def stage(self, sha256: str, size: int, *, source: str | None = None) -> Path:
        """Return a verified, read-only local path for blob ``sha256`` of ``size`` bytes.

        Fetches nothing when the cache or a shared directory already holds it;
        otherwise downloads it from ``source`` (the controller that sent the launch)
        or, while that one cannot serve it, from the other controllers in order.
        Raises :class:`StagingError` when it cannot be had (no space, a refused
        download, content that does not match the digest).
        """
        hex_digest = _hex(sha256)
        lock = self._locks.setdefault(hex_digest, trio.Lock())
        async with lock:
            staged = self.staged_path(hex_digest)
            if await self._verified(staged, hex_digest, size):
                return staged
            for directory in self.shared_dirs:
                for candidate in (directory / hex_digest, directory / "sha256" / hex_digest):
                    if await self._verified(candidate, hex_digest, size):
                        return candidate
            await trio.to_thread.run_sync(self._prepare, staged)
            *earlier, last = self.sources(source)
            for controller in earlier:
                try:
                    await self._download(hex_digest, size, controller)
                    return staged
                except StagingError as exc:
                    if not _outage(exc):
                        raise
                    log.warning("blob %s: %s; asking the next controller", hex_digest, exc.message)
            await self._download(hex_digest, size, last)
            return staged

    def _prepare(self, staged: Path) -> None:
        (self.cache_dir / "partial").mkdir(parents=True, exist_ok=True)
        (self.cache_dir / "sha256").mkdir(parents=True, exist_ok=True)
        if staged.exists():
            # Present but not matching (a damaged copy): replace it.
            staged.chmod(0o644)
            staged.unlink()

    def _client(self) -> httpx.AsyncClient:
        verify: ssl.SSLContext | bool = self._ssl_context or True
        return httpx.AsyncClient(
            verify=verify,
            transport=self._transport,
            headers={"Authorization": f"Bearer {self._credential}"},
            timeout=httpx.Timeout(self._timeout, connect=15.0),
            follow_redirects=False,
            trust_env=False,
        )

    async def _check_space(self, needed: int) -> None:
        usage = await trio.to_thread.run_sync(disk_usage, self.cache_dir)
        if needed + self.free_margin > usage.free:
            raise StagingError(
                f"not enough free disk in {self.cache_dir} to stage this blob: "
                f"{needed} bytes to download plus a margin of {self.free_margin}, "
                f"but {usage.free} bytes are free",
                code="insufficient_disk",
                status=507,
                details={"needed": needed, "margin": self.free_margin, "free": usage.free},
            )

    async def _disk_full(self, hex_digest: str, have: int, size: int) -> StagingError:
        """A staging copy met a full disk: its ``have`` bytes are kept, nothing past them."""
        part = self.partial_path(hex_digest)
        await trio.to_thread.run_sync(lambda: os.truncate(part, have))
        free = (await trio.to_thread.run_sync(disk_usage, self.cache_dir)).free
        return StagingError(
            f"the disk of {self.cache_dir} is full ({free} bytes free): staging blob "
            f"{hex_digest} stopped at byte {have} of {size}, which is kept. Free space on "
            f"the node (or grow the disk); staging again resumes from offset {have}.",
            code="insufficient_storage",
            status=507,
            details={"offset": have, "size": size, "free": free},
        )

    async def _download(self, hex_digest: str, size: int, controller: str) -> None:
        part = self.partial_path(hex_digest)
        have = await trio.to_thread.run_sync(lambda: part.stat().st_size if part.exists() else 0)
        if have > size:
            await trio.to_thread.run_sync(lambda: part.unlink(missing_ok=True))
            have = 0
        await self._check_space(size - have)
        if have < size:
            async with self._client() as client:
                have = await self._fetch(client, hex_digest, size, have, controller)
                if have < 0:  # the controller refused the range: start again, once
                    have = await self._fetch(client, hex_digest, size, 0, controller)
        if have != size:
            raise StagingError(
                f"the controller sent {have} of the {size} bytes of blob {hex_digest}",
                code="short_download",
            )
        await self._publish(hex_digest, size)

    async def _fetch(
        self, client: httpx.AsyncClient, hex_digest: str, size: int, have: int, controller: str
    ) -> int:
        """Download from byte ``have``; return the bytes on disk, or -1 when 416 answered."""
        part = self.partial_path(hex_digest)
        headers = {"Range": f"bytes={have}-"} if have else {}
        self.requests.append((hex_digest, headers.get("Range")))
        self.asked.append(controller)
        try:
            url = self.blob_url(hex_digest, controller)
            async with client.stream("GET", url, headers=headers) as reply:
                if reply.status_code == 416 and have:
                    await trio.to_thread.run_sync(lambda: part.unlink(missing_ok=True))
                    return -1
                if reply.status_code == 200:
                    have = 0  # the whole blob, from the start
                elif reply.status_code != 206 or not reply.headers.get(
                    "Content-Range", ""
                ).startswith(f"bytes {have}-"):
                    body = (await reply.aread())[:500].decode("utf-8", "replace")
                    raise StagingError(
                        f"the controller answered {reply.status_code} to a download of blob "
                        f"{hex_digest}: {body}",
                        code="download_refused",
                        details={"status": reply.status_code},
                    )
                # Unbuffered: what ``have`` counts is on the file, so a full disk
                # leaves exactly those bytes (the next staging resumes from them).
                handle = await trio.open_file(part, "r+b" if have else "wb", buffering=0)
                try:
                    await handle.truncate(have)
                    await handle.seek(have)
                    async for chunk in reply.aiter_bytes(self.chunk_size):
                        if have + len(chunk) > size:
                            raise StagingError(
                                f"the controller sent more than the {size} bytes of blob "
                                f"{hex_digest}",
                                code="long_download",
                            )
                        view = memoryview(chunk)
                        while view:
                            try:
                                count = await handle.write(view)
                            except OSError as exc:
                                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                                    raise
                                raise await self._disk_full(hex_digest, have, size) from None
                            view = view[count:]
                            have += count
                        if self.on_progress is not None:
                            self.on_progress(hex_digest, have)
                finally:
                    with trio.CancelScope(shield=True):
                        await handle.aclose()
        except httpx.HTTPError as exc:
            raise StagingError(
                f"downloading blob {hex_digest} from {controller} failed: {exc}; "
                "staging again resumes where it stopped",
                code="download_failed",
            ) from None
        return have

    async def _publish(self, hex_digest: str, size: int) -> None:
        part = self.partial_path(hex_digest)
        staged = self.staged_path(hex_digest)
        with trio.CancelScope(shield=True):
            actual = await trio.to_thread.run_sync(
                sha256_file, part, size, limiter=self._io_limiter
            )
            if actual != hex_digest:
                await trio.to_thread.run_sync(lambda: part.unlink(missing_ok=True))
                raise StagingError(
                    f"the downloaded blob hashes to sha256 {actual}, not {hex_digest}; "
                    "it was discarded, and staging again downloads it afresh",
                    code="digest_mismatch",
                    details={"expected": hex_digest, "actual": actual},
                )

            def publish() -> os.stat_result:
                with open(part, "rb") as handle:
                    os.fsync(handle.fileno())
                part.chmod(0o444)
                rename_durably(part, staged)
                return staged.stat()

            info = await trio.to_thread.run_sync(publish)
            await self._record(staged, _Seen(info.st_size, info.st_mtime_ns))


def _outage(exc: StagingError) -> bool:
    """Whether another controller may serve what this one could not (it was not an answer)."""
    if exc.code in ("download_failed", "short_download"):
        return True
    return exc.code == "download_refused" and int(exc.details.get("status", 0)) >= 500


async def stage_directory(
    stager: Stager, files: Mapping[str, tuple[str, int]], *, source: str | None = None
) -> Path:
    """Stage a directory model (``relative path -> (digest, size)``); return its local root.

    Every blob is staged (concurrently, each verified as :meth:`Stager.stage` does),
    then the tree is assembled under ``<cache>/trees/<listing digest>/`` from hard
    links to the staged blobs (copies when a blob lives on another filesystem, a
    shared directory), read-only. The same listing is assembled once and reused
    while each of its files is still the verified blob (the same file, or one that
    hashes to its digest); a tree that no longer is is assembled again.
    """
    listing, name = tree_listing(files)
    root = stager.cache_dir / "trees" / name
    staged: dict[str, Path] = {}

    async def one(path: str, digest: str, size: int) -> None:
        staged[path] = await stager.stage(digest, size, source=source)

    async with trio.open_nursery() as nursery:
        for path, digest, size in listing:
            nursery.start_soon(one, path, digest, size)

    async with stager._locks.setdefault(f"tree:{name}", trio.Lock()):
        if await trio.to_thread.run_sync(root.is_dir):
            if await _tree_holds(stager, root, listing, staged):
                return root
            log.warning("the staged tree %s does not hold its verified files; rebuilding", root)
            await trio.to_thread.run_sync(_remove_tree, root)
        await trio.to_thread.run_sync(assemble_tree, root, staged)
    return root


async def _tree_holds(
    stager: Stager, root: Path, listing: Sequence[tuple[str, str, int]], staged: Mapping[str, Path]
) -> bool:
    """Whether every file of the tree at ``root`` is its verified blob (or hashes to it)."""
    for path, hex_digest, size in listing:
        target = root / path
        if await trio.to_thread.run_sync(_same_file, target, staged[path]):
            continue
        if not await stager._verified(target, hex_digest, size):
            return False
    return True


def _same_file(one: Path, other: Path) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def _remove_tree(root: Path) -> None:
    # The files are read-only, their directories are not: they unlink as they are.
    shutil.rmtree(root)


async def stage_job_inputs(
    stager: Stager,
    job: Job,
    digests: Mapping[str, int],
    directories: Mapping[str, Mapping[str, tuple[str, int]]] | None = None,
    *,
    source: str | None = None,
) -> Job:
    """Stage the job's blob inputs; return the job with their paths on this node.

    ``digests`` maps each blob's digest (``sha256:<hex>`` or ``<hex>``) to its size,
    as the model's manifest lists them. Every input whose ``digest`` is there is
    staged (concurrently) and its ``path`` rewritten to the staged, read-only file;
    so is every argv item or environment value that is the old path or a path
    inside it (or ends in ``=`` and one of those), since adapters pass an input's
    path, or a file in a directory input, on the command line.
    ``directories`` maps a directory input's id to its files (see
    :func:`stage_directory`); those inputs are assembled and rewritten the same way.
    Other inputs are left as they are. Raises :class:`StagingError` if any fails.
    ``source`` is the controller asked first (see :meth:`Stager.stage`).
    """
    sizes = {_hex(digest): size for digest, size in digests.items()}
    trees = directories or {}
    wanted = {
        item.id: _hex(item.digest)
        for item in job.inputs
        if item.digest is not None and _hex(item.digest) in sizes
    }
    staged: dict[str, Path] = {}

    async def one(input_id: str, hex_digest: str) -> None:
        staged[input_id] = await stager.stage(hex_digest, sizes[hex_digest], source=source)

    async def tree(input_id: str) -> None:
        staged[input_id] = await stage_directory(stager, trees[input_id], source=source)

    async with trio.open_nursery() as nursery:
        for input_id, hex_digest in wanted.items():
            nursery.start_soon(one, input_id, hex_digest)
        for item in job.inputs:
            if item.id in trees:
                nursery.start_soon(tree, item.id)
    moved = {item.path: str(staged[item.id]) for item in job.inputs if item.id in staged}

    def path(value: str) -> str | None:
        # The input's path, or a path inside a directory input (a split GGUF's first part).
        if value in moved:
            return moved[value]
        for old, new in moved.items():
            if value.startswith(old + "/"):
                return new + value[len(old) :]
        return None

    def rewrite(value: str) -> str:
        head, equals, tail = value.rpartition("=")
        if (moved_value := path(value)) is not None:
            return moved_value
        if equals and (moved_tail := path(tail)) is not None:
            return f"{head}={moved_tail}"
        return value

    inputs = tuple(
        attrs.evolve(item, path=str(staged[item.id])) if item.id in staged else item
        for item in job.inputs
    )
    return attrs.evolve(
        job,
        inputs=inputs,
        argv=tuple(rewrite(arg) for arg in job.argv),
        env={name: rewrite(value) for name, value in job.env.items()},
    )


def stager_from_settings(
    agent_dir: Path,
    controller_url: str | Sequence[str],
    credential: str,
    settings: AgentSettings,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> Stager:
    """The stager a remote agent uses: ``<agent_dir>/blobs``, ``[staging]`` shared dirs.

    ``controller_url`` is one controller's base URL or every controller's, in order.
    """
    urls = [controller_url] if isinstance(controller_url, str) else list(controller_url)
    return Stager(
        Path(agent_dir) / "blobs",
        urls[0],
        credential,
        other_controllers=urls[1:],
        ssl_context=ssl_context,
        shared_dirs=settings.staging_shared_dirs,
    )
