"""The web console's pages and assets (docs/ui.md), served beside the API.

``/`` is the landing page with the login form, or a redirect to the dashboard for a
browser whose session is valid; ``/ui/dashboard`` is the dashboard's shell, or a
redirect to ``/`` without a valid session; ``/ui/static/<build>/<name>`` are the
assets. They are public routes: a shell holds nothing a visitor may not read, and
the page's script reads everything else from ``/api/v1`` as any client does, with
the session cookie and the CSRF token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from quart import Response, redirect, request

from .._version import __version__
from ..base.errors import NotFound, Unauthenticated
from ..web import CONSOLE_PAGES, PAGE_HEADERS, Assets, ConsolePage, Pages
from .access import add_route, declared, route
from .authn import SESSION_COOKIE

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..auth.principal import Principal
    from ..controller.service import Service

LANDING = "/"
DASHBOARD = CONSOLE_PAGES[0].path


def _page(html: str) -> Response:
    response = Response(html, content_type="text/html; charset=utf-8")
    response.headers.update(PAGE_HEADERS)
    return response


def _redirect(location: str) -> Response:
    # Quart builds it with the app's response class; its annotation names werkzeug's base.
    response = cast(Response, redirect(location, code=303))
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

    async def logged_in() -> Principal | None:
        """The browser's session, or None without a valid one."""
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie:
            return None
        try:
            return await service.auth.authenticate_session(cookie)
        except Unauthenticated:
            return None

    @route(app, "web_landing")
    async def landing() -> Response:
        if await logged_in() is not None:
            return _redirect(DASHBOARD)
        return _page(pages.render("landing.html", script="login.js"))

    def console_route(page: ConsolePage) -> None:
        async def shell(**_params: str) -> Response:
            # The path's parameters (a service ID) are read by the page's script.
            principal = await logged_in()
            if principal is None:
                return _redirect(LANDING)
            # The scopes only choose what the navigation links (a page a session may
            # not use is not offered); the API decides what the page may do.
            html = pages.render(
                f"{page.name}.html",
                script=f"{page.name}.js",
                page=page,
                scopes=sorted(principal.scopes),
            )
            return _page(html)

        endpoint = f"web_{page.name}"
        rule = declared(endpoint).rule
        if rule != page.path:
            raise RuntimeError(
                f"the console page {page.name} is at {page.path}, but the route table declares "
                f"{endpoint} at {rule}: make ROUTES in ficc_core/api/access.py agree"
            )
        add_route(app, endpoint, shell)

    for page in CONSOLE_PAGES:
        console_route(page)

    @route(app, "web_static")
    async def static(build: str, name: str) -> Response:
        found = assets.get(build, name)
        if found is None:
            raise NotFound(f"the console has no asset {name!r}", code="asset_not_found")
        asset, cache = found
        response = Response(asset.body, content_type=asset.content_type)
        response.headers["Cache-Control"] = cache
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response
