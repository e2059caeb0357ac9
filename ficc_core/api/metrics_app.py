"""The application of the separate metrics listener (``metrics_listen``): ``GET /metrics``
and nothing else, without a credential, for a scraper that must not reach the API.

A plain ASGI callable: no sessions, no routing table, no authentication to bypass.
Every other request gets the one error envelope (404, or 405 for another method).
"""

from __future__ import annotations

from typing import Any

from ..base.errors import FiccError
from .app import error_response_bytes
from .metrics import Exposition

_ALLOWED = ("GET", "HEAD")


class MetricsApp:
    """Serve ``metrics`` at ``/metrics``; refuse everything else in the envelope."""

    def __init__(self, metrics: Exposition) -> None:
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})  # refused before accept
            return
        method, path = scope["method"], scope["path"]
        if path == "/metrics" and method in _ALLOWED:
            body, content_type = self.metrics.render()
            await _respond(send, 200, content_type, body, head=method == "HEAD")
            return
        if path == "/metrics":
            error = FiccError(
                f"/metrics does not accept {method}; use {', '.join(_ALLOWED)}",
                code="method_not_allowed",
                status=405,
                details={"allowed": list(_ALLOWED)},
                headers={"Allow": ", ".join(_ALLOWED)},
            )
        else:
            error = FiccError(
                f"no route matches {method} {path}; this listener serves only GET /metrics",
                code="not_found",
                status=404,
            )
        await _respond(
            send, error.status, "application/json", error_response_bytes(error), error.headers
        )


async def _respond(
    send: Any,
    status: int,
    content_type: str,
    body: bytes,
    extra: dict[str, str] | None = None,
    *,
    head: bool = False,
) -> None:
    headers = {
        "content-type": content_type,
        "content-length": str(len(body)),
        "cache-control": "no-store",
        **{name.lower(): value for name, value in (extra or {}).items()},
    }
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else body})
