"""The web console's pages and assets (docs/ui.md), served beside the API.

``/`` is the landing page with the login form, or a redirect to the dashboard for a
browser whose session is valid; ``/ui/dashboard`` is the dashboard's shell, or a
redirect to ``/`` without a valid session; ``/ui/static/<build>/<name>`` are the
assets. They are public routes: a shell holds nothing a visitor may not read, and
the page's script reads everything else from ``/api/v1`` as any client does, with
the session cookie and the CSRF token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response, redirect, request

from .._version import __version__
from ..errors import NotFound, Unauthenticated
from ..web import PAGE_HEADERS, Assets, Pages
from .authn import SESSION_COOKIE

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service

LANDING = "/"
DASHBOARD = "/ui/dashboard"


def _page(html: str) -> Response:
    response = Response(html, content_type="text/html; charset=utf-8")
    response.headers.update(PAGE_HEADERS)
    return response


def _redirect(location: str) -> Response:
    response = redirect(location, code=303)
    response.headers["Cache-Control"] = "no-store"
    return response


def register(app: QuartTrio, service: Service) -> None:
    """Add the console's routes to ``app``."""
    config = service.config
    assets = Assets.load()
    pages = Pages(
        assets,
        contact=config.landing_contact,
        notice=config.landing_notice,
        refresh=config.console_refresh,
        version=__version__,
    )

    async def logged_in() -> bool:
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie:
            return False
        try:
            await service.auth.authenticate_session(cookie)
        except Unauthenticated:
            return False
        return True

    @app.get(LANDING, endpoint="web_landing")
    async def landing() -> Response:
        if await logged_in():
            return _redirect(DASHBOARD)
        return _page(pages.render("landing.html", script="login.js"))

    @app.get(DASHBOARD, endpoint="web_dashboard")
    async def dashboard() -> Response:
        if not await logged_in():
            return _redirect(LANDING)
        return _page(pages.render("dashboard.html", script="dashboard.js"))

    @app.get("/ui/static/<build>/<path:name>", endpoint="web_static")
    async def static(build: str, name: str) -> Response:
        found = assets.get(build, name)
        if found is None:
            raise NotFound(f"the console has no asset {name!r}", code="asset_not_found")
        asset, cache = found
        response = Response(asset.body, content_type=asset.content_type)
        response.headers["Cache-Control"] = cache
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response
