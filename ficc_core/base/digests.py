"""Content-addressed files: sha256 of files, durable renames, directory trees of blobs.

A leaf module: the controller's blob store (:mod:`~ficc_core.models.blobs`) and a
node's input staging (:mod:`~ficc_core.agent.staging`) both use it, and it imports
neither. Every function here blocks: call it from a worker thread.

A *directory tree* is a directory model as files by relative path, each with its
sha256 and size. Its name is the sha256 of its sorted listing, so the same files
make the same tree on every machine; it is assembled from hard links to the
verified blobs (read-only copies where a blob lives on another filesystem) and
renamed into place whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

from .errors import FiccError

__all__ = [
    "InvalidDigest",
    "UnsafePath",
    "assemble_tree",
    "file_digest",
    "fsync_directory",
    "hash_file",
    "hex_digest",
    "rename_durably",
    "sha256_file",
    "tree_listing",
]

_HASH_CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")


class InvalidDigest(FiccError):
    """A value that should name content is not a sha256 digest."""

    status = 502
    code = "invalid_digest"


class UnsafePath(FiccError):
    """A directory tree names a path that could leave its root (absolute, ``..``, empty)."""

    status = 502
    code = "unsafe_path"


def hex_digest(sha256: str) -> str:
    """The 64 hex digits of ``sha256:<hex>`` or ``<hex>``; raise :class:`InvalidDigest`."""
    value = sha256.removeprefix("sha256:")
    if len(value) != 64 or not set(value) <= _HEX:
        raise InvalidDigest(f"{sha256!r} is not a sha256 digest")
    return value


class _Hasher(Protocol):
    """A hashlib object, as :func:`hash_file` feeds it."""

    def update(self, data: memoryview, /) -> None: ...


_H = TypeVar("_H", bound=_Hasher)


def hash_file(
    digest: _H, path: Path, length: int, progress: Callable[[int], None] | None = None
) -> _H:
    """Feed the first ``length`` bytes of ``path`` to the hashlib object ``digest``; return it."""
    remaining = length
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(_HASH_CHUNK)
        view = memoryview(buffer)
        while remaining > 0:
            read = handle.readinto(view[: min(_HASH_CHUNK, remaining)])
            if not read:
                break
            digest.update(view[:read])
            remaining -= read
            if progress is not None:
                progress(length - remaining)
    if remaining:
        raise OSError(f"{path} is shorter than {length} bytes")
    return digest


def sha256_file(path: Path, length: int, progress: Callable[[int], None] | None = None) -> str:
    """Return the hex sha256 of the first ``length`` bytes of ``path``."""
    return hash_file(hashlib.sha256(), path, length, progress).hexdigest()


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a whole file's content."""
    return "sha256:" + sha256_file(path, os.stat(path).st_size)


def fsync_directory(path: Path) -> None:
    """fsync a directory, so a rename into it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_durably(source: Path, target: Path, *, unless_present: bool = False) -> None:
    """Rename ``source`` to ``target`` and fsync ``target``'s directory.

    With ``unless_present``, an existing ``target`` (the same content, named by its
    digest) is kept and ``source`` removed instead.
    """
    if unless_present and target.exists():
        source.unlink()
        return
    os.replace(source, target)
    fsync_directory(target.parent)


def tree_listing(
    files: Mapping[str, tuple[str, int]],
) -> tuple[list[tuple[str, str, int]], str]:
    """A tree's files, sorted as ``(path, hex digest, size)``, and the tree's name.

    Raises :class:`UnsafePath` for an absolute path or a ``.``, ``..`` or empty
    segment, and :class:`InvalidDigest` for a digest that is not sha256.
    """
    listing = sorted((path, hex_digest(digest), size) for path, (digest, size) in files.items())
    for path, _digest, _size in listing:
        parts = path.split("/")
        if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise UnsafePath(f"unsafe path in a directory input: {path!r}")
    return listing, hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def assemble_tree(root: Path, sources: Mapping[str, Path]) -> None:
    """Build ``root`` from ``relative path -> source file``, atomically.

    Hard links where the filesystem allows, else read-only copies; a half-built
    tree is never at ``root``. Builders of the same tree at once (two replicas of one
    model starting together) each build their own copy aside; the first in place wins
    and the others discard theirs (the trees are equal: the same files).
    """
    building = root.with_name(f"{root.name}.building-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        for path, source in sources.items():
            target = building / path
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
                target.chmod(0o444)
        try:
            os.replace(building, root)
        except OSError:
            if not root.is_dir():
                raise  # not another builder's tree: a real failure
    finally:
        shutil.rmtree(building, ignore_errors=True)
