"""Loading settings: embedded defaults, a TOML file, ``FICC_*`` variables, then flags.

Each later source overrides the earlier ones; each value is read by its setting's kind
and the whole is validated by :class:`~.settings.Config`, whose errors become one
:class:`ConfigError` naming the setting and the source.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..base.errors import ConfigError
from ..routing.bands import parse_bands
from .fields import parse_duration
from .prices import parse_price, parse_pricing
from .settings import Config


def env_name(field: attrs.Attribute) -> str:
    """Return the environment variable that sets ``field``."""
    return "FICC_" + field.name.upper()


def _coerce(field: attrs.Attribute, value: Any, source: str) -> Any:
    kind = field.metadata["kind"]
    parser = {"bands": parse_bands, "pricing": parse_pricing, "price": parse_price}.get(kind)
    if parser is not None:
        try:
            return parser(value, f"{source}: {field.name}")
        except ConfigError as exc:
            raise ConfigError(
                exc.message, details={"setting": field.name, "source": source}
            ) from None
    try:
        if kind == "duration":
            return parse_duration(value)
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError
            number = float(value)
            if number != number or number in (float("inf"), float("-inf")):
                raise ValueError
            return number
        if kind == "bool":
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off", ""}:
                return False
            raise ValueError
        if kind == "path" and isinstance(value, str | os.PathLike):
            return Path(os.path.expanduser(value))
        if kind == "str":
            if not isinstance(value, str):
                raise ValueError
            return value
    except (ValueError, ConfigError):
        pass
    raise ConfigError(
        f"{source}: {field.name} must be a {kind}, got {value!r}",
        details={"setting": field.name, "source": source},
    )


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build a :class:`Config` from defaults, ``path`` (TOML), ``environ``, then ``overrides``.

    ``overrides`` holds values from command-line flags; ``None`` values are ignored.
    Unknown keys in the file are refused, naming the key.
    """
    environ = os.environ if environ is None else environ
    fields = {field.name: field for field in attrs.fields(Config)}
    values: dict[str, Any] = {}
    if path is None and environ.get("FICC_CONFIG"):
        path = Path(environ["FICC_CONFIG"])
    if path is not None:
        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"configuration file {path} does not exist") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
        unknown = sorted(set(document) - set(fields))
        if unknown:
            raise ConfigError(
                f"{path}: unknown setting(s) {', '.join(unknown)}; see docs/configuration.md",
                details={"unknown": unknown},
            )
        for name, value in document.items():
            values[name] = _coerce(fields[name], value, str(path))
    for name, field in fields.items():
        variable = env_name(field)
        if variable in environ:
            values[name] = _coerce(field, environ[variable], variable)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = _coerce(fields[name], value, f"--{name.replace('_', '-')}")
    try:
        return Config(**values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
