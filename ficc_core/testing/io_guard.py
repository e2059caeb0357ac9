"""Blocking I/O, forbidden for a while: what the adapter kit checks adapters' purity with.

:func:`io_forbidden` replaces every call that opens a file, a socket or a process,
or resolves a name, with one that records the call and raises; the kit then fails
a check naming the call, even when the adapter swallowed the exception.
"""

from __future__ import annotations

import builtins
import io
import os
import pathlib
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .adapter_cases import AdapterConformanceError

_OS_CALLS = (
    "open",
    "openpty",
    "stat",
    "lstat",
    "listdir",
    "scandir",
    "access",
    "readlink",
    "mkdir",
    "makedirs",
    "remove",
    "unlink",
    "rmdir",
    "rename",
    "replace",
    "symlink",
    "link",
    "chmod",
    "chown",
    "truncate",
    "system",
    "popen",
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "kill",
    "killpg",
)
_OS_PREFIXES = ("exec", "spawn")
_PATH_CALLS = (
    "open",
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "stat",
    "lstat",
    "exists",
    "is_file",
    "is_dir",
    "is_symlink",
    "iterdir",
    "glob",
    "rglob",
    "resolve",
    "samefile",
    "touch",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "replace",
    "readlink",
    "chmod",
    "owner",
    "group",
)
_OS_PATH_CALLS = (
    "exists",
    "lexists",
    "isfile",
    "isdir",
    "islink",
    "getsize",
    "getmtime",
    "realpath",
    "samefile",
)
_SOCKET_CALLS = (
    "socket",
    "socketpair",
    "fromfd",
    "create_connection",
    "create_server",
    "getaddrinfo",
    "gethostbyname",
    "gethostbyname_ex",
    "gethostbyaddr",
    "getnameinfo",
    "getfqdn",
)
_SUBPROCESS_CALLS = ("Popen", "run", "call", "check_call", "check_output", "getoutput")


def _blocked_targets() -> Iterator[tuple[object, str, str]]:
    """(owner, attribute, the name shown in messages) for every call the kit blocks."""
    yield builtins, "open", "open"
    yield io, "open", "io.open"
    if hasattr(io, "open_code"):
        yield io, "open_code", "io.open_code"
    for name in _OS_CALLS:
        if hasattr(os, name):
            yield os, name, f"os.{name}"
    for name in sorted(dir(os)):
        if name.startswith(_OS_PREFIXES) and callable(getattr(os, name)):
            yield os, name, f"os.{name}"
    for name in _OS_PATH_CALLS:
        yield os.path, name, f"os.path.{name}"
    for name in _PATH_CALLS:
        if hasattr(pathlib.Path, name):
            yield pathlib.Path, name, f"pathlib.Path.{name}"
    for name in _SOCKET_CALLS:
        if hasattr(socket, name):
            yield socket, name, f"socket.{name}"
    for name in _SUBPROCESS_CALLS:
        yield subprocess, name, f"subprocess.{name}"


_ABSENT: Any = object()


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def blocker(self, shown: str) -> Callable[..., Any]:
        def blocked(*_args: Any, **_kwargs: Any) -> Any:
            self.calls.append(shown)
            raise AdapterConformanceError(
                f"{shown}() was called while I/O is forbidden: an adapter's job() must do "
                "no I/O (files, sockets, name resolution) and start no processes"
            )

        blocked.__name__ = shown.rsplit(".", 1)[-1]
        return blocked


@contextmanager
def io_forbidden() -> Iterator[list[str]]:
    """Block file access, sockets, name resolution and process creation; restore them after.

    Yields the list of blocked calls attempted inside the block (an adapter that
    catches the :class:`AdapterConformanceError` a blocked call raises is still
    caught). Python's import system keeps working: it uses its own private
    references, so an adapter may still import modules lazily.
    """
    recorder = _Recorder()
    saved: list[tuple[object, str, Any]] = []
    try:
        for owner, name, shown in _blocked_targets():
            saved.append((owner, name, owner.__dict__.get(name, _ABSENT)))
            setattr(owner, name, recorder.blocker(shown))
        yield recorder.calls
    finally:
        for owner, name, original in reversed(saved):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
