"""Health, metrics, whoami and browser sessions."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import attrs
from quart import Response, g, jsonify, request

from .._version import __version__
from ..auth import PrincipalKind
from .access import route
from .authn import CSRF_COOKIE, SESSION_COOKIE
from .bodies import read_json
from .views_auth import principal_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service


@attrs.frozen
class LoginBody:
    """``POST /api/v1/session``: a user's password and the project the session works in
    (none: a personal session, docs/people.md)."""

    username: str
    password: str
    project: str | None = None


def register(app: QuartTrio, service: Service) -> None:
    """Add the system routes to ``app``."""
    secure = service.config.secure_cookies or service.config.tls

    @route(app, "health")
    async def health() -> Response:
        # ``time``: the controller's clock, which ``ficc doctor`` compares a node's with.
        return jsonify({"status": "ok", "version": __version__, "time": time.time()})

    if service.config.metrics_listen is None:
        # Otherwise the metrics listener serves it (server.serve_metrics), not the API.
        @route(app, "metrics")
        async def metrics() -> Response:
            body, content_type = service.metrics.render()
            return Response(body, content_type=content_type)

    @route(app, "system_controllers")
    async def controllers() -> Response:
        lease = service.lease
        leader, seen = await lease.status()
        return jsonify(
            {
                "this": {"id": lease.controller_id, "role": str(lease.role), "term": lease.term},
                "leader": None if leader is None else leader.to_json(),
                "term": 0 if leader is None else leader.term,
                "lease_expires_at": None if leader is None else leader.expires_at,
                "controllers": [row.to_json() for row in seen],
            }
        )

    @route(app, "whoami")
    async def whoami() -> Response:
        return jsonify(principal_view(g.principal))

    @route(app, "session_login")
    async def login() -> tuple[Response, int]:
        body = await read_json(LoginBody, service.config.max_body_bytes)
        principal, cookie, csrf = await service.auth.login(
            body.username, body.password, body.project, address=request.remote_addr or ""
        )
        response = jsonify({"principal": principal_view(principal), "csrf_token": csrf})
        lifetime = int(service.config.session_lifetime)
        response.set_cookie(
            SESSION_COOKIE,
            cookie,
            max_age=lifetime,
            httponly=True,
            samesite="Strict",
            secure=secure,
            path="/",
        )
        # Readable by the page's script so it can echo it in the X-CSRF-Token header.
        response.set_cookie(
            CSRF_COOKIE,
            csrf,
            max_age=lifetime,
            httponly=False,
            samesite="Strict",
            secure=secure,
            path="/",
        )
        return response, 201

    @route(app, "session_logout")
    async def logout() -> Response:
        principal = g.principal
        if principal.kind == PrincipalKind.SESSION:
            await service.auth.logout(principal.id)
        response = jsonify({"logged_out": principal.kind == PrincipalKind.SESSION})
        response.delete_cookie(SESSION_COOKIE, path="/")
        response.delete_cookie(CSRF_COOKIE, path="/")
        return response
