"""How a setting is declared, and the values settings share: durations, default directories."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import attrs

from ..base.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str | float | int) -> float:
    """Return seconds for ``"90"``, ``"250ms"``, ``"15m"``, ``"12h"``, ``"30d"`` or a number."""
    if isinstance(text, bool):
        raise ConfigError(f"expected a duration, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _DURATION.match(text)
        if not match:
            raise ConfigError(
                f"{text!r} is not a duration; write seconds or e.g. 250ms, 15m, 12h, 30d"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ConfigError(f"a duration cannot be negative: {text!r}")
    return seconds


def default_data_dir() -> Path:
    """Return the default data directory: ``$XDG_DATA_HOME/ficc`` or ``~/.local/share/ficc``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ficc"


def default_runtime_dir() -> Path:
    """Return the default runtime directory, ``/tmp/ficc-<uid>`` (engine sockets)."""
    return Path(f"/tmp/ficc-{os.getuid()}")


def setting(default: Any, help: str, *, kind: str, **kwargs: Any) -> Any:
    """Declare a setting: its default, its one description (``help``) and its ``kind``.

    The kind says how a string from a file, a variable or a flag is read (see
    :mod:`.loading`) and is the Type column of the reference.
    """
    return attrs.field(default=default, metadata={"help": help, "kind": kind}, **kwargs)
