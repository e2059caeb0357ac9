"""The invoke routes (``/api/v1/inference/{id}/v1/...``): OpenAI-compatible, via the gateway.

Each route only reads the (bounded) body and calls the one seam,
``service.gateway.invoke``; authority, routing and relaying are the
gateway's. The response streams chunk by chunk; when the client goes away, the
body iterator is closed, which cancels the engine request.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio
from quart import Response, g

from .bodies import read_body

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service

PREFIX = "/api/v1/inference/<service_id>/v1"


def register(app: QuartTrio, service: Service) -> None:
    """Add the invoke routes to ``app``."""

    async def relay(service_id: str, path: str, body: Any) -> Response:
        status, chunks = await service.gateway.invoke(service_id, path, body, g.principal)
        response = Response(chunks, status=status, content_type=chunks.content_type)
        # Sending stops at the gateway's send deadline (a client that stopped reading).
        if math.isinf(chunks.send_deadline):
            response.timeout = None
        else:
            response.timeout = max(chunks.send_deadline - trio.current_time(), 0.0)
        if chunks.streaming:
            response.headers["Cache-Control"] = "no-cache"
            response.headers["X-Accel-Buffering"] = "no"
        return response

    @app.get(f"{PREFIX}/models", endpoint="invoke_models")
    async def invoke_models(service_id: str) -> Response:
        return await relay(service_id, "/v1/models", b"")

    @app.post(f"{PREFIX}/chat/completions", endpoint="invoke_chat_completions")
    async def invoke_chat_completions(service_id: str) -> Response:
        body = await read_body(service.config.max_body_bytes)
        return await relay(service_id, "/v1/chat/completions", body)

    @app.post(f"{PREFIX}/embeddings", endpoint="invoke_embeddings")
    async def invoke_embeddings(service_id: str) -> Response:
        body = await read_body(service.config.max_body_bytes)
        return await relay(service_id, "/v1/embeddings", body)
