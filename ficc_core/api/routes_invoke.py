"""The invoke routes (``/api/v1/inference/{id}/v1/...``): OpenAI-compatible, via the gateway.

Each route only reads the (bounded) body and calls the one seam,
``service.inference.gateway.invoke``; authority, routing and relaying are the
gateway's. The response streams chunk by chunk; when the client goes away, the
body iterator is closed, which cancels the engine request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio
from quart import Response, g

from .bodies import read_body

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..service import Service

PREFIX = "/api/v1/inference/<service_id>/v1"
#: Seconds a response may take to send after the request deadline (the client reading
#: the final error event); without a deadline, sending is not bounded.
SEND_GRACE = 5.0


def register(app: QuartTrio, service: Service) -> None:
    """Add the invoke routes to ``app``."""

    async def relay(service_id: str, path: str, body: Any) -> Response:
        status, chunks = await service.inference.gateway.invoke(service_id, path, body, g.principal)
        response = Response(chunks, status=status, content_type=chunks.content_type)
        if chunks.deadline is None:
            response.timeout = None
        else:
            response.timeout = max(chunks.deadline - trio.current_time(), 0.0) + SEND_GRACE
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
