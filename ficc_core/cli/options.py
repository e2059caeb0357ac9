"""The global options: ``--data-dir``, ``--config``, ``--url`` and ``--token``, anywhere.

Every command of the tree gets the same four options (:func:`install_global_options`,
run once on the ``ficc`` group), so ``ficc --data-dir D serve`` and ``ficc serve
--data-dir D`` mean the same, and so do ``ficc inference --url U list`` and ``ficc
inference list --url U``. A value given on the command line is remembered in the
context's ``meta`` (shared by the whole chain of contexts); a later, deeper one
wins. Environment variables and the stored login come after, when the value is read:
:func:`data_settings` for the data directory and file, :func:`connection` for the
controller's URL and credential.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import attrs
import click

from ..config import Config, default_data_dir
from . import credentials

_KEY = "ficc.globals"

#: Where a client command connects when nothing names a controller.
DEFAULT_URL = "http://127.0.0.1:8484"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        ctx.meta.setdefault(_KEY, {})[param.name] = value
    return value


_SETTINGS, _CONNECTION = ("config_path", "data_dir"), ("url", "token")


def _global_options(hidden: tuple[str, ...]) -> list[click.Option]:
    def option(*decls: str, **kwargs: Any) -> click.Option:
        name = decls[1]
        return click.Option(
            decls, callback=_remember, expose_value=False, hidden=name in hidden, **kwargs
        )

    return [
        option(
            "--config",
            "config_path",
            type=click.Path(path_type=Path, dir_okay=False),
            help="TOML configuration file (keys are the setting names). [env: FICC_CONFIG]",
        ),
        option(
            "--data-dir",
            "data_dir",
            type=click.Path(path_type=Path, file_okay=False),
            help="Directory for the database and blobs. [env: FICC_DATA_DIR]",
        ),
        option(
            "--url",
            "url",
            help=f"Base URL of the controller (default: the one `ficc login` stored, else "
            f"{DEFAULT_URL}). [env: FICC_URL]",
        ),
        option(
            "--token",
            "token",
            help="Bearer credential (default: the one `ficc login` stored). [env: FICC_TOKEN]",
        ),
    ]


def install_global_options(
    command: click.Command, clients: frozenset[str], *, hidden: tuple[str, ...] = ()
) -> None:
    """Give ``command`` and every command under it the global options (once each).

    Every command accepts all four; help shows ``--url``/``--token`` only on the
    ``clients`` (the top-level commands that talk to a controller's API) and
    ``--data-dir``/``--config`` only on the others.
    """
    taken = {param.name for param in command.params}
    options = _global_options(hidden)
    command.params.extend(option for option in options if option.name not in taken)
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            below = hidden or (_SETTINGS if name in clients else _CONNECTION)
            install_global_options(sub, clients, hidden=below)


def given(ctx: click.Context, name: str) -> Any:
    """The value of global option ``name`` given on the command line, or ``None``."""
    return ctx.meta.get(_KEY, {}).get(name)


# -- what the options mean ---------------------------------------------------------------


def settings_sources(ctx: click.Context) -> tuple[Path | None, dict[str, Any]]:
    """The configuration file and the overrides the global options give ``load_config``."""
    return given(ctx, "config_path"), {"data_dir": given(ctx, "data_dir")}


def data_dir_flag(config: Config) -> str:
    """``--data-dir D`` when ``config`` is not the default data directory, else ``""``.

    What a printed hint adds so that, run as printed, it opens this data directory.
    """
    if Path(config.data_dir).resolve() == default_data_dir().resolve():
        return ""
    return f" --data-dir {_quote(str(config.data_dir))}"


def url_flag(url: str) -> str:
    """``--url U`` when ``url`` is not where a bare client command connects, else ``""``.

    What a printed hint adds so that, run as printed, it talks to this controller.
    """
    try:
        stored = credentials.load().current
    except click.ClickException:
        stored = None
    bare = os.environ.get("FICC_URL") or stored or DEFAULT_URL
    return "" if url.rstrip("/") == bare.rstrip("/") else f" --url {_quote(url)}"


def _quote(text: str) -> str:
    return shlex.quote(text)


@attrs.frozen
class Connection:
    """Where a client command talks to, with what, and where the credential came from."""

    url: str
    token: str | None
    source: str


def connection(ctx: click.Context) -> Connection:
    """The controller and credential of this invocation.

    The URL is ``--url``, else ``FICC_URL``, else the one ``ficc login`` stored last,
    else :data:`DEFAULT_URL`. The credential is ``--token``, else ``FICC_TOKEN``, else
    the one ``ficc login`` stored for that URL.
    """
    url = given(ctx, "url") or os.environ.get("FICC_URL")
    token = given(ctx, "token") or os.environ.get("FICC_TOKEN")
    source = "--token" if given(ctx, "token") else "FICC_TOKEN"
    if url and token:  # the stored logins are not even read
        return Connection(url.rstrip("/"), token, source)
    stored = credentials.load()
    url = (url or stored.current or DEFAULT_URL).rstrip("/")
    if token:
        return Connection(url, token, source)
    login = stored.servers.get(url)
    if login is not None:
        return Connection(url, login.token, str(credentials.path()))
    return Connection(url, None, "none")
