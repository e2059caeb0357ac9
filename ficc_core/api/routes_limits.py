"""Rate limits and budgets of a project, a person or a credential (docs/limits.md).

``PUT`` takes ``{rpm?, tpm?, budget?, period?}``: a field absent stays, null clears
it; counts are non-negative integers (0: no limit), a budget is whole units per
``period`` (``day`` or ``month``). Every view shows the limits set and what the
scope used: requests and tokens in the sliding minute, spend this period.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response, g, jsonify

from ..auth.scopes import ADMIN
from .access import route
from .bodies import read_json_object
from .views_limits import limits_view, subject

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service


def register(app: QuartTrio, service: Service) -> None:
    """Add the limit routes to ``app``."""
    limit = service.config.max_body_bytes

    async def find(scope: str, ref: str, project_id: str | None) -> tuple[str, str]:
        installation = ADMIN in g.principal.scopes
        return await subject(service, scope, ref, project_id, installation=installation)

    async def show(scope: str, ref: str, project_id: str | None = None) -> Response:
        key, name = await find(scope, ref, project_id)
        return jsonify(limits_view(service, scope, key, name))

    async def change(scope: str, ref: str, project_id: str | None = None) -> Response:
        body = await read_json_object(limit)
        key, name = await find(scope, ref, project_id)
        await service.quotas.set_limits(scope, key, body)
        return jsonify(limits_view(service, scope, key, name))

    @route(app, "projects_limits")
    async def projects_limits(project: str) -> Response:
        return await show("project", project)

    @route(app, "projects_set_limits")
    async def projects_set_limits(project: str) -> Response:
        return await change("project", project)

    @route(app, "users_limits")
    async def users_limits(user_id: str) -> Response:
        return await show("user", user_id)

    @route(app, "users_set_limits")
    async def users_set_limits(user_id: str) -> Response:
        return await change("user", user_id)

    @route(app, "tokens_limits")
    async def tokens_limits(token_id: str) -> Response:
        return await show("credential", token_id, g.principal.project_id)

    @route(app, "tokens_set_limits")
    async def tokens_set_limits(token_id: str) -> Response:
        return await change("credential", token_id, g.principal.project_id)
