"""``/api/v1/inference/{id}/pin`` and ``/unpin``: pin a scaled service (never scaled to
zero) or unpin it, extensions beside the contract's routes (docs/inference.md,
"Scaling").

Both need the scopes of a start (pinning an idle service wakes it); see
:mod:`ficc_core.api.access`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from quart import Response, g, jsonify

from ..schema._convert import MAX_SAFE_INTEGER, integer
from .access import add_route
from .bodies import read_json
from .views_inference import service_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service


@attrs.frozen(kw_only=True)
class PinBody:
    """``POST /inference/{id}/pin`` and ``/unpin``: the revision it was read at, if any."""

    revision: int | None = integer(0, MAX_SAFE_INTEGER, default=None)


def register(app: QuartTrio, service: Service) -> None:
    """Add the pin routes to ``app``."""
    inference = service.inference
    limit = service.config.max_body_bytes

    def pin_route(pinned: bool) -> None:
        word = "pin" if pinned else "unpin"

        async def pin(service_id: str) -> Response:
            body = await read_json(PinBody, limit)
            # In process with the autoscaler, which runs on the leader alone; another
            # project's service is a 404 first.
            await inference.get(g.principal.project_id, service_id)
            async with service.lease.while_leading(word):
                detail = await inference.pin(g.principal, service_id, pinned, body.revision)
            return jsonify(
                service_view(
                    detail,
                    service.config.replica_give_up_after,
                    trouble=service.contributors.attempt_trouble,
                )
            )

        add_route(app, f"inference_{word}", pin)

    pin_route(True)
    pin_route(False)
