"""Contributor nodes: state, last heartbeat, snapshot and attempts (scope ``contributors:read``),
and the WebSocket remote agents dial out to (authenticated by a node credential only).

Nodes belong to the installation, not to a project: every project's readers see them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response, jsonify, websocket

from ..contributors.connection import serve_node_connection
from ..errors import FiccError

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..service import Service


def register(app: QuartTrio, service: Service) -> None:
    """Add the contributor routes to ``app``."""

    @app.get("/api/v1/contributors", endpoint="contributors_list")
    async def contributors_list() -> Response:
        return jsonify({"contributors": await service.contributors.list()})

    @app.get("/api/v1/contributors/<node_id>", endpoint="contributors_get")
    async def contributors_get(node_id: str) -> Response:
        return jsonify(await service.contributors.get(node_id))

    @app.websocket("/api/v1/contributors/connect", endpoint="contributors_connect")
    async def contributors_connect() -> Response | None:
        # Authenticated here, by the node credential alone: the node ID comes from
        # the credential, never from what the agent says.
        from .app import error_response

        scheme, _, token = websocket.headers.get("Authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer" or not token.strip():
                raise FiccError(
                    "connect with 'Authorization: Bearer <node credential>'",
                    code="unauthenticated",
                    status=401,
                )
            node_id = await service.contributors.authenticate(token.strip())
        except FiccError as exc:
            return error_response(exc)
        await websocket.accept()
        # The object itself, not the context-local proxy: other tasks (commands
        # sent by the controller) use it outside this handler's context.
        channel = websocket._get_current_object()  # type: ignore[attr-defined]
        await serve_node_connection(
            service.contributors,
            node_id,
            channel,
            heartbeat_interval=service.config.heartbeat_interval,
            lease_duration=service.config.lease_duration,
        )
        return None
