"""Stopping and logging (docs/operations.md): the shutdown grace, the log lines."""

from __future__ import annotations

import attrs

from .fields import setting


@attrs.frozen(slots=False)
class LogSettings:
    """How the controller stops and what it logs (a section of Config)."""

    shutdown_grace: float = setting(
        10.0,
        "On SIGINT/SIGTERM, how long in-flight requests may finish before they are cut "
        "(duration); a stream still open then gets a last server_shutting_down SSE event.",
        kind="duration",
    )
    log_level: str = setting(
        "info",
        "Logging level: debug, info, warning or error.",
        kind="str",
        validator=attrs.validators.in_(("debug", "info", "warning", "error")),
    )
    access_log: bool = setting(
        True,
        "Log one line per HTTP request at INFO on the logger ficc.access: method, path, "
        "status, duration, credential name, and for invoke requests the service alias, "
        "replica, node and tokens (never a prompt).",
        kind="bool",
    )
    log_format: str = setting(
        "text",
        "Log lines as text, or 'json': one JSON object per line (time, level, logger, "
        "message, and the access log's fields), for a log collector to parse.",
        kind="str",
        validator=attrs.validators.in_(("text", "json")),
    )
