"""Installation administration: projects and users (scope ``admin``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from quart import Response, jsonify

from .access import route
from .bodies import band_validator, name_validator, read_json
from .views_auth import project_view, user_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service


@attrs.frozen
class ProjectBody:
    """``POST /api/v1/projects``."""

    name: str = attrs.field(validator=name_validator)


@attrs.frozen
class ProjectBandBody:
    """``PUT /api/v1/projects/{project}/band``: a band name, or null to clear it."""

    band: str | None = attrs.field(validator=band_validator)


@attrs.frozen
class UserBody:
    """``POST /api/v1/users``: ``projects`` maps a project name or id to the user's scopes."""

    username: str = attrs.field(validator=name_validator)
    password: str
    admin: bool = False
    projects: dict[str, list[str]] = attrs.Factory(dict)


@attrs.frozen
class MembershipBody:
    """``PUT /api/v1/users/{id}/projects/{project}``: the user's scopes there (empty removes)."""

    scopes: list[str]


def register(app: QuartTrio, service: Service) -> None:
    """Add the administration routes to ``app``."""
    limit = service.config.max_body_bytes

    @route(app, "projects_list")
    async def projects_list() -> Response:
        projects = await service.auth.list_projects()
        return jsonify({"projects": [project_view(project) for project in projects]})

    @route(app, "projects_create")
    async def projects_create() -> tuple[Response, int]:
        body = await read_json(ProjectBody, limit)
        return jsonify(project_view(await service.auth.create_project(body.name))), 201

    @route(app, "projects_set_band")
    async def projects_set_band(project: str) -> Response:
        body = await read_json(ProjectBandBody, limit)
        return jsonify(project_view(await service.auth.set_project_band(project, body.band)))

    @route(app, "users_list")
    async def users_list() -> Response:
        return jsonify({"users": [user_view(user) for user in await service.auth.list_users()]})

    @route(app, "users_create")
    async def users_create() -> tuple[Response, int]:
        body = await read_json(UserBody, limit)
        user = await service.auth.create_user(
            body.username,
            body.password,
            admin=body.admin,
            projects={ref: frozenset(scopes) for ref, scopes in body.projects.items()},
        )
        return jsonify(user_view(user)), 201

    @route(app, "users_set_membership")
    async def users_set_membership(user_id: str, project: str) -> Response:
        body = await read_json(MembershipBody, limit)
        user = await service.auth.set_membership(user_id, project, frozenset(body.scopes))
        return jsonify(user_view(user))
