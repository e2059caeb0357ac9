"""Settings on the command line: a flag per setting, loading, ``ficc config``.

Settings come from embedded defaults, then the TOML file named by ``--config`` (or
``FICC_CONFIG``), then ``FICC_*`` environment variables, then flags.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import click
import trio

from ..base.errors import FiccError
from ..config import Config, env_name, load_config, render_reference
from ..store import redact_url
from .options import settings_sources
from .output import echo_table, emit, json_option

_FLAG_TYPES = {
    "int": int,
    "float": float,
    "bool": bool,
    "path": click.Path(path_type=Path),
    "str": str,
}


def config_options(exclude: tuple[str, ...] = ()):
    """Decorate a command with one flag per :class:`Config` setting, help from its metadata."""

    def decorate(command):
        for field in reversed(attrs.fields(Config)):
            if field.name in exclude:
                continue
            flag = "--" + field.name.replace("_", "-")
            help_text = f"{field.metadata['help']} [env: {env_name(field)}]"
            if field.metadata["kind"] == "bool":
                command = click.option(
                    f"{flag}/--no-{flag[2:]}", field.name, default=None, help=help_text
                )(command)
            else:
                command = click.option(
                    flag,
                    field.name,
                    type=_FLAG_TYPES.get(field.metadata["kind"], str),
                    default=None,
                    help=help_text,
                )(command)
        return command

    return decorate


def load_settings(ctx: click.Context, overrides: dict[str, Any]) -> Config:
    """The settings of this invocation: the global ``--config`` and ``--data-dir``, then
    ``overrides`` (a command's own setting flags)."""
    path, given = settings_sources(ctx)
    try:
        return load_config(path, overrides={**given, **overrides})
    except FiccError as exc:
        raise click.ClickException(exc.message) from None


def run_trio(fn, *args: Any) -> Any:
    """``trio.run(fn, *args)``, a :class:`FiccError` shown as the command's error (also
    one a nursery wrapped in an exception group on its way out)."""
    try:
        return trio.run(fn, *args)
    except FiccError as exc:
        raise click.ClickException(f"{exc.message} [{exc.code}]") from None
    except BaseExceptionGroup as group:
        error = _only_error(group)
        if error is None:
            raise
        raise click.ClickException(f"{error.message} [{error.code}]") from None


def _only_error(group: BaseExceptionGroup) -> FiccError | None:
    """The one :class:`FiccError` nested groups of one exception each hold, or None."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    return found if isinstance(found, FiccError) else None


def _plain(value: Any) -> Any:
    """A setting's value as JSON shows it (a path as text, bands and prices as objects,
    pricing as an object of prices by model)."""
    if isinstance(value, Path):
        return str(value)
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if isinstance(value, tuple):
        if value and isinstance(value[0], tuple):
            return {model: attrs.asdict(price) for model, price in value}
        return [attrs.asdict(item) for item in value]
    return value


@click.command("config")
@click.option("--reference", is_flag=True, help="Print the table of every setting instead.")
@json_option
@click.pass_context
def config_command(ctx: click.Context, reference: bool, as_json: bool) -> None:
    """Print the effective configuration (after file, environment and flags)."""
    if reference:
        click.echo(render_reference(), nl=False)
        return
    config = load_settings(ctx, {})
    document = {field.name: _plain(getattr(config, field.name)) for field in attrs.fields(Config)}
    document["database_url"] = redact_url(config.database_url)  # never print its password

    def human(settings: dict[str, Any]) -> None:
        rows = [("SETTING", "VALUE")]
        rows += [(name, json.dumps(value)) for name, value in sorted(settings.items())]
        echo_table(rows)

    emit(document, as_json, human)


# -- administration ----------------------------------------------------------------
