"""The access log: one structured line per HTTP request, at INFO on ``ficc.access``.

Each line carries the method, path, status, duration and who asked (a bearer
credential's name, or a person's session); an invoke request adds the service's
alias, the replica (its index) and node that served it and the tokens the engine
reported. The message is readable text; the same facts travel as the record's
``fields``, which ``--log-format json`` prints as JSON keys (ficc_core/cli/logs.py).
Prompts and completions are never logged.
"""

from __future__ import annotations

import logging
from typing import Any

from ..auth import Principal

log = logging.getLogger("ficc.access")


def who(principal: Principal | None) -> dict[str, str]:
    """The credential's name (or the session's person), as the log shows who asked."""
    if principal is None:
        return {}
    if principal.kind == "session":
        return {"user": principal.username or principal.user_id or principal.id}
    return {"credential": principal.name or principal.id}


def log_request(
    method: str,
    path: str,
    status: int,
    duration: float,
    principal: Principal | None,
    **served: Any,
) -> None:
    """Log one request; ``served`` adds ``service``, ``replica``, ``node``,
    ``prompt_tokens`` and ``completion_tokens`` where known (None values are left out)."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields: dict[str, Any] = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(duration * 1000, 2),
        **who(principal),
        **{k: v for k, v in served.items() if v is not None},
    }
    text = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("method", "path", "status"))
    log.info("%s %s %s %s", method, path, status, text, extra={"fields": fields})
