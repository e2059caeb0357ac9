"""The listener: where the service binds, what it accepts, where its data lives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs

from .fields import default_data_dir, setting

_LISTEN = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):(\d{1,5})")


def _listen_address(_config: Any, setting: attrs.Attribute, address: str) -> None:
    """Refuse an address that is not ``host:port`` (an IPv6 host in brackets)."""
    match = _LISTEN.fullmatch(address)
    if match is None or int(match.group(2)) > 65535:
        raise ValueError(
            f"{setting.name}: {address!r} is not host:port (an IPv6 host in brackets: [::1]:9484)"
        )


@attrs.frozen(slots=False)
class ServerSettings:
    """The listener and the data directory (a section of Config)."""

    data_dir: Path = setting(
        attrs.Factory(default_data_dir),
        "Directory for the SQLite database and the blob store.",
        kind="path",
        converter=Path,
    )
    host: str = setting("127.0.0.1", "Address the HTTP service binds to.", kind="str")
    port: int = setting(8484, "TCP port of the HTTP service; 0 lets the OS choose.", kind="int")
    metrics_listen: str | None = setting(
        None,
        "host:port of a separate listener serving only GET /metrics (Prometheus text, no "
        "credential; port 0 lets the OS choose), for a scraper that must not reach the API. "
        "When set, the main listener no longer serves /metrics. Unset, the main listener "
        "serves it to anyone who reaches it: every project's service and attempt IDs, with "
        "request, error and token counts.",
        kind="str",
        converter=lambda value: value or None,
        validator=attrs.validators.optional(_listen_address),
    )
    max_body_bytes: int = setting(
        1 << 20, "Largest JSON request body accepted, in bytes.", kind="int"
    )
    session_lifetime: float = setting(
        12 * 3600.0, "How long a browser session lasts after login (duration).", kind="duration"
    )
