"""``GET /api/v1/inference/{id}/events``: what happened to a service, its replicas,
attempts and nodes.

Without ``after``, the newest ``limit`` events; with it, the first ``limit`` after
that event ID (``next_after`` of the previous page), so a client follows a service
by asking again with the cursor. ``before`` (an event ID, the oldest one a client
holds) pages back instead: the newest ``limit`` older than it. Oldest first always.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response, g, jsonify, request

from ..base.errors import InvalidRequest
from ..inference.history import MAX_LIMIT
from .access import route
from .bodies import query_integer
from .views_events import events_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service

#: Events in one answer unless ``limit`` says otherwise.
DEFAULT_LIMIT = 100


def _limit() -> int:
    if "limit" not in request.args:
        return DEFAULT_LIMIT
    limit = query_integer("limit")
    if not 1 <= limit <= MAX_LIMIT:
        message = f"must be from 1 to {MAX_LIMIT}"
        raise InvalidRequest(
            f"the query parameter limit is invalid: {message}",
            details={"errors": [{"path": "limit", "message": message}], "max": MAX_LIMIT},
        )
    return limit


def register(app: QuartTrio, service: Service) -> None:
    """Add the events route to ``app``."""

    @route(app, "inference_events")
    async def inference_events(service_id: str) -> Response:
        after = query_integer("after") if "after" in request.args else None
        before = query_integer("before") if "before" in request.args else None
        if after is not None and before is not None:
            message = "give after (to read on) or before (to page back), not both"
            raise InvalidRequest(
                f"the query parameters after and before are invalid together: {message}",
                details={"errors": [{"path": "before", "message": message}]},
            )
        limit = _limit()
        found = await service.inference.events(
            g.principal.project_id, service_id, after=after, limit=limit, before=before
        )
        return jsonify(events_view(found, after, limit))
