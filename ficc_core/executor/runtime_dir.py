"""Where engine sockets live: a short per-user directory whose length no data path sets.

A Unix socket's path must fit in 107 bytes (``sun_path``). Under the agent's state
directory it did not once HOME was longer than about 27 characters, so each attempt's
socket directory lives in the **runtime directory** instead (setting ``runtime_dir``,
default ``/tmp/ficc-<uid>``), named by a short hash of the provider's state directory
and the attempt key: ``/tmp/ficc-1000/s0123456789abcdef/engine.sock`` is 44 bytes,
whatever the data directory is.

The default is under ``/tmp``, not ``$XDG_RUNTIME_DIR``: that one is removed when the
user's last login session ends (which would strand every engine of a ``ficc serve``
that outlives its shell) and differs between a service and a shell, while a restarted
agent must find the socket directories an earlier run left. ``systemd-tmpfiles`` never
ages out a socket that is listening. The directory is the user's own: created 0700,
and refused when it is a symbolic link or another user owns it. Every function here
blocks (call it from a worker thread).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import socket
import stat
from pathlib import Path

from .errors import RuntimeDirUnusable

__all__ = [
    "MAX_RUNTIME_DIR",
    "MAX_SOCKET_PATH",
    "default_runtime_dir",
    "ensure_runtime_dir",
    "probe_socket",
    "remove_socket_dir",
    "runtime_dir_problem",
    "socket_dir",
]

#: The longest Unix socket path Linux accepts (sun_path is 108 bytes with the NUL).
MAX_SOCKET_PATH = 107
#: The length of a socket directory's name (``s`` and 16 hex digits).
SOCKET_DIR_NAME = 17
#: The socket file names every runtime directory leaves room for (``engine.sock`` is 11).
SOCKET_NAME_ROOM = 32
#: The longest runtime directory, in bytes: room for ``/<socket dir>/<32-byte name>``.
MAX_RUNTIME_DIR = MAX_SOCKET_PATH - 1 - SOCKET_DIR_NAME - 1 - SOCKET_NAME_ROOM

#: What an operator changes to move the runtime directory (named in every refusal).
FIX = "set runtime_dir (--runtime-dir, FICC_RUNTIME_DIR) to a shorter directory"


def default_runtime_dir() -> Path:
    """``/tmp/ficc-<uid>``: short whatever HOME or the data directory is."""
    return Path(f"/tmp/ficc-{os.getuid()}")  # as ficc_core.config says (it imports no executor)


def runtime_dir_problem(runtime_dir: Path) -> str | None:
    """Why ``runtime_dir`` is too long for engine sockets (with the setting that fixes
    it), or None when it fits."""
    length = len(os.fsencode(runtime_dir))
    if length <= MAX_RUNTIME_DIR:
        return None
    return (
        f"the runtime directory {runtime_dir} is {length} bytes long; engine sockets in it "
        f"would pass the kernel's {MAX_SOCKET_PATH}-byte limit on a Unix socket path "
        f"(a runtime directory may be at most {MAX_RUNTIME_DIR} bytes): {FIX}"
    )


def probe_socket(runtime_dir: Path) -> None:
    """Bind a Unix socket in ``runtime_dir`` as deep and as long as an engine's may be
    (a socket directory, then a name of :data:`SOCKET_NAME_ROOM` bytes), and remove it.

    Raises :class:`RuntimeDirUnusable` (or ``OSError``) where an engine could not bind.
    """
    ensure_runtime_dir(runtime_dir)
    directory = runtime_dir / ("d" + secrets.token_hex(SOCKET_DIR_NAME // 2))
    directory.mkdir(mode=0o700)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.bind(str(directory / ("p" * SOCKET_NAME_ROOM)))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _refuse(message: str, runtime_dir: Path) -> RuntimeDirUnusable:
    return RuntimeDirUnusable(
        message,
        details={
            "runtime_dir": str(runtime_dir),
            "setting": "runtime_dir",
            "environment": "FICC_RUNTIME_DIR",
        },
    )


def ensure_runtime_dir(runtime_dir: Path) -> Path:
    """Create ``runtime_dir`` (0700) if needed and check that it is usable: short enough,
    a real directory (not a symbolic link), owned by this user and private to it.

    A directory of ours that others may read is made private. Raises
    :class:`RuntimeDirUnusable` naming the setting that fixes it.
    """
    problem = runtime_dir_problem(runtime_dir)
    if problem is not None:
        raise _refuse(problem, runtime_dir)
    try:
        runtime_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            runtime_dir.mkdir(mode=0o700)
        except FileExistsError:
            pass
        found = os.lstat(runtime_dir)
    except OSError as exc:
        raise _refuse(
            f"cannot create the runtime directory {runtime_dir}: {exc.strerror or exc}; "
            f"{FIX.replace('shorter', 'writable')}",
            runtime_dir,
        ) from None
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise _refuse(
            f"the runtime directory {runtime_dir} is not a directory but a link or a file; "
            f"remove it, or {FIX.replace('shorter', 'private')}",
            runtime_dir,
        )
    if found.st_uid != os.getuid():
        raise _refuse(
            f"the runtime directory {runtime_dir} belongs to user {found.st_uid}, not to "
            f"this user ({os.getuid()}); {FIX.replace('shorter', 'private')}",
            runtime_dir,
        )
    if stat.S_IMODE(found.st_mode) & 0o077:
        os.chmod(runtime_dir, 0o700)
    return runtime_dir


def socket_dir(runtime_dir: Path, state_dir: Path, key: str) -> Path:
    """The socket directory of attempt ``key`` of the provider in ``state_dir``: the same
    on every run (a restarted provider finds its leftovers), another for every provider."""
    digest = hashlib.sha256(f"{state_dir}\0{key}".encode()).hexdigest()
    return runtime_dir / ("s" + digest[: SOCKET_DIR_NAME - 1])


def remove_socket_dir(directory: Path) -> None:
    """Remove an attempt's socket directory and what is in it (gone already is fine)."""
    shutil.rmtree(directory, ignore_errors=True)
