"""The configuration reference table, rendered from the settings' own descriptions."""

from __future__ import annotations

import attrs

from ..routing.bands import render_bands
from .loading import env_name
from .prices import render_pricing
from .settings import Config


def render_reference() -> str:
    """Render the configuration reference table (kept in ``docs/configuration.md``)."""
    lines = [
        "| Setting | Environment | Type | Default | Meaning |",
        "|---|---|---|---|---|",
    ]
    for field in attrs.fields(Config):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            default = "`$XDG_DATA_HOME/ficc` or `~/.local/share/ficc`"
        elif field.default is None:
            default = "unset"
        elif field.default == "":
            default = "empty"
        elif field.metadata["kind"] == "bands":
            default = f"`{render_bands(field.default)}`"
        elif field.metadata["kind"] == "pricing":
            default = f"`{render_pricing(field.default)}`" if field.default else "none"
        else:
            default = f"`{field.default}`"
        lines.append(
            f"| `{field.name}` | `{env_name(field)}` | {field.metadata['kind']} | {default} "
            f"| {field.metadata['help']} |"
        )
    return "\n".join(lines) + "\n"
