"""Where the first run's administrator password and token go.

A service started by systemd or in a container has its standard output captured
into a journal or a log driver that other people and programs read, so by default
the secrets go to a file in the data directory that only the service's user can
read, and the log gets only the file's path (setting ``first_run_secrets``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from typing import Any

FIRST_RUN_FILE = "first-run-secrets"


def write_owner_only(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only.

    The file is created under a temporary name with mode 0600 (``O_EXCL``, never
    following a link), so it is never readable by others, not even while it is
    written, and is renamed into place whole: a reader sees all of it or nothing.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        # The umask can only narrow the mode; this makes it exactly owner read/write.
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            fd = -1
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def render(created: dict[str, Any]) -> str:
    """The secrets file's text: one ``key: value`` line each, after a comment."""
    expires_at = created.get("expires_at")
    expires = (
        "never"
        if expires_at is None
        else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires_at))
    )
    return (
        "# FICC first run: the administrator's credentials. Store them elsewhere, then\n"
        "# delete this file; they are not shown again.\n"
        f"project: {created['project']}\n"
        f"admin username: {created['username']}\n"
        f"admin password: {created['password']}\n"
        f"admin token: {created['token']}\n"
        f"admin token expires: {expires}\n"
    )


def write_first_run_secrets(data_dir: Path, created: dict[str, Any]) -> Path:
    """Write the first run's secrets to ``data_dir/first-run-secrets``; return its path."""
    path = Path(data_dir) / FIRST_RUN_FILE
    write_owner_only(path, render(created))
    return path
