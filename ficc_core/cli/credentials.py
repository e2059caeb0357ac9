"""The user's stored logins: ``credentials.toml`` in the user's configuration directory.

``ficc login`` writes it, every client command reads it when neither ``--token`` nor
``FICC_TOKEN`` is given, ``ficc logout`` removes an entry. It lives at
``$XDG_CONFIG_HOME/ficc/credentials.toml`` (``~/.config/ficc/...`` by default), in a
directory created with mode 0700, and is written with mode 0600 under a temporary
name and renamed into place, so it is never readable by anyone else, even half written.
"""

from __future__ import annotations

import contextlib
import json
import os
import tomllib
from pathlib import Path
from typing import Any

import attrs
import click

_FIELDS = (
    "token",
    "credential_id",
    "minted",
    "project",
    "username",
    "expires_at",
    "session",
    "csrf",
)


@attrs.frozen
class Login:
    """One controller's stored credential and what ``ficc logout`` needs to end it."""

    token: str = attrs.field(repr=False)
    #: The credential's ID (``whoami``'s ``id``).
    credential_id: str
    #: Whether ``ficc login`` minted it (then ``ficc logout`` revokes it).
    minted: bool = False
    project: str | None = None
    username: str | None = None
    expires_at: float | None = None
    #: The browser-style session a password login opened and minted the credential
    #: with (its cookie and CSRF token): ``ficc logout`` ends it too.
    session: str | None = attrs.field(default=None, repr=False)
    csrf: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class Logins:
    """Every stored login by URL, and the URL used when none is named."""

    current: str | None = None
    servers: dict[str, Login] = attrs.Factory(dict)


def path() -> Path:
    """Where the logins are stored."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ficc" / "credentials.toml"


def load() -> Logins:
    """The stored logins (none when the file does not exist)."""
    where = path()
    try:
        document = tomllib.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Logins()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise click.ClickException(
            f"cannot read the stored logins in {where}: {exc}; fix or delete the file"
        ) from None
    servers = {}
    for url, entry in (document.get("servers") or {}).items():
        try:
            servers[url] = Login(**{key: entry[key] for key in _FIELDS if key in entry})
        except TypeError:
            raise click.ClickException(
                f"{where}: the entry for {url} is incomplete; run 'ficc login {url}' again"
            ) from None
    return Logins(current=document.get("current"), servers=servers)


def _toml(value: Any) -> str:
    # JSON's string escapes are TOML's basic-string escapes.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def render(logins: Logins) -> str:
    """The file's text for ``logins``."""
    lines = ["# Written by `ficc login`; readable only by its owner. `ficc logout` ends one."]
    if logins.current is not None:
        lines.append(f"current = {_toml(logins.current)}")
    for url, login in sorted(logins.servers.items()):
        lines += ["", f"[servers.{_toml(url)}]"]
        for key in _FIELDS:
            value = getattr(login, key)
            if value is not None:
                lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def save(logins: Logins) -> Path:
    """Write ``logins`` atomically with mode 0600 (delete the file when there are none)."""
    where = path()
    if not logins.servers:
        with contextlib.suppress(FileNotFoundError):
            where.unlink()
        return where
    where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = where.with_name(f".{where.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(render(logins))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, where)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return where


def store(url: str, login: Login) -> Path:
    """Store ``login`` for ``url`` and make ``url`` the current one."""
    logins = load()
    return save(Logins(current=url, servers={**logins.servers, url: login}))


def forget(url: str) -> Path:
    """Remove ``url``'s login; another stored one (if any) becomes current."""
    logins = load()
    servers = {key: value for key, value in logins.servers.items() if key != url}
    current = logins.current if logins.current in servers else next(iter(sorted(servers)), None)
    return save(Logins(current=current, servers=servers))
