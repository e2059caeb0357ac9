"""The Quart (quart-trio) application: authentication, the error envelope, metrics."""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from quart import Response, g, request
from quart.json.provider import DefaultJSONProvider
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..auth import Principal
from ..base.errors import FiccError, Forbidden, StoreUnavailable
from ..base.strictjson import dumps_error
from ..http1.response_end import ResponseEnd
from ..models.registry import MAX_BYTES_CHUNK
from ..store.outage import RefusalLog, as_store_unavailable, is_store_failure
from . import (
    routes_admin,
    routes_contributors,
    routes_events,
    routes_inference,
    routes_invoke,
    routes_limits,
    routes_logs,
    routes_models,
    routes_operations,
    routes_people,
    routes_scaling,
    routes_system,
    routes_tokens,
    routes_usage,
    routes_web,
)
from .access import ROUTE_ACCESS, Access
from .access_log import log_request
from .authn import CSRF_HEADER, SESSION_COOKIE, authenticate

if TYPE_CHECKING:
    from ..controller.service import Service

log = logging.getLogger("ficc.api")

_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def error_response_bytes(error: FiccError) -> bytes:
    """The one JSON error envelope of ``error``, encoded (whatever its message holds)."""
    return dumps_error(error.envelope())


class StrictJSONProvider(DefaultJSONProvider):
    """``jsonify`` that raises rather than write ``NaN`` or ``Infinity`` into a response."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("allow_nan", False)
        return super().dumps(obj, **kwargs)


def error_response(error: FiccError) -> Response:
    """Render ``error`` as the one JSON error envelope."""
    response = Response(
        error_response_bytes(error), status=error.status, content_type="application/json"
    )
    for name, value in error.headers.items():
        response.headers[name] = value
    return response


def _http_error(exc: HTTPException) -> FiccError:
    status = exc.code or 500
    code = _HTTP_CODES.get(status, "http_error")
    if status == 404:
        message = f"no route matches {request.method} {request.path}"
    elif status == 405:
        allowed = sorted(getattr(exc, "valid_methods", None) or [])
        message = f"{request.path} does not accept {request.method}; use {', '.join(allowed)}"
        return FiccError(
            message,
            code=code,
            status=status,
            details={"allowed": allowed},
            headers={"Allow": ", ".join(allowed)},
        )
    elif status == 413:
        message = "the request body is larger than this service accepts"
    else:
        message = exc.description or exc.name
    return FiccError(message, code=code, status=status)


def current_principal() -> Principal:
    """Return the principal the current request was authenticated as."""
    return g.principal


def create_app(service: Service) -> QuartTrio:
    """Build the HTTP application around ``service``."""
    app = QuartTrio("ficc_core", static_folder=None)
    app.json = StrictJSONProvider(app)
    # Routes bound their own bodies (read_json, read_body); this is the outer bound.
    app.config["MAX_CONTENT_LENGTH"] = max(service.config.max_body_bytes, MAX_BYTES_CHUNK)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.extensions["ficc"] = service

    routes_system.register(app, service)
    routes_admin.register(app, service)
    routes_tokens.register(app, service)
    routes_limits.register(app, service)
    routes_people.register(app, service)
    routes_models.register(app, service)
    routes_contributors.register(app, service)
    routes_inference.register(app, service)
    routes_operations.register(app, service)
    routes_scaling.register(app, service)
    routes_events.register(app, service)
    routes_logs.register(app, service)
    routes_invoke.register(app, service)
    routes_usage.register(app, service)
    routes_web.register(app, service)

    # Views register through the route table (access.route, access.add_route); a route
    # added to Quart around it would have no access rule.
    missing = sorted(
        rule.endpoint for rule in app.url_map.iter_rules() if rule.endpoint not in ROUTE_ACCESS
    )
    if missing:
        raise RuntimeError(
            f"routes without an entry in the route table: {missing}; declare each in ROUTES "
            "(ficc_core/api/access.py) and register its view with access.route or add_route"
        )

    @app.before_request
    async def authenticate() -> None:
        g.started = time.perf_counter()
        rule = request.url_rule
        if rule is None:
            return  # routing raises 404/405 next, without authentication
        access: Access = ROUTE_ACCESS[rule.endpoint]
        if access.public:
            return
        principal = await _principal(service, access)
        g.principal = principal
        missing = sorted(access.scopes - principal.scopes)
        if missing:
            raise Forbidden(
                f"this credential lacks the scope(s) {', '.join(missing)} that "
                f"{request.method} {rule.rule} requires",
                code="missing_scope",
                details={"required": sorted(access.scopes), "missing": missing},
            )

    @app.after_request
    async def record(response: Response) -> Response:
        rule = request.url_rule
        route = rule.rule if rule is not None else "unmatched"
        service.metrics.http_requests.labels(route, request.method, str(response.status_code)).inc()
        started = g.get("started")
        if started is not None:
            duration = time.perf_counter() - started
            service.metrics.http_duration.labels(route).observe(duration)
            log_request(
                request.method, request.path, response.status_code, duration, g.get("principal")
            )
        response.headers.setdefault("Cache-Control", "no-store")
        if _body_left_unread():
            # Answered before its body arrived (a refusal: 413, 415, 404, 429...): the
            # rest of the body would stay in the connection, unread, and a kept-alive
            # client's next request behind it would wait for ever. Close it after this.
            response.headers["Connection"] = "close"
        return response

    # While the store is down every management route is refused: said once a while.
    store_refusals = RefusalLog(logger=log)

    @app.errorhandler(FiccError)
    async def ficc_error(error: FiccError) -> Response:
        if isinstance(error, StoreUnavailable):
            store_refusals.refused(error, f"{request.method} {request.path}")
        elif error.status >= 500:
            log.error("%s: %s", error.code, error.message)
        response = error_response(error)
        if error.status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="ficc"'
        return response

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        return error_response(_http_error(exc))

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Response:
        if is_store_failure(exc):
            # A driver's own error (or a group of them) the store let through: the store
            # is down, which is the one envelope's 503, never a 500.
            return await ficc_error(as_store_unavailable(exc))
        reference = secrets.token_hex(6)
        log.exception(
            "unexpected error (reference %s) on %s %s", reference, request.method, request.path
        )
        return error_response(
            FiccError(
                f"an internal error occurred; the operator can find it in the log under "
                f"reference {reference}",
                details={"reference": reference},
            )
        )

    # Outermost, in front of the invoke routes too: without it a kept-alive connection
    # was never marked idle again, and held the shutdown for the whole grace.
    # Quart types ASGI's scope and messages as TypedDicts, ResponseEnd as plain mappings:
    # the same dicts at run time.
    app.asgi_app = ResponseEnd(app.asgi_app)  # type: ignore[method-assign, assignment, arg-type]
    return app


async def _principal(service: Service, access: Access) -> Principal:
    authorization = request.headers.get("Authorization")
    return await authenticate(
        service.auth,
        check_csrf=access.csrf,
        authorization=authorization,
        session=None if authorization is not None else request.cookies.get(SESSION_COOKIE),
        csrf=request.headers.get(CSRF_HEADER, ""),
    )


def _body_left_unread() -> bool:
    """Whether the request declared a body that has not all arrived."""
    if (
        not request.content_length
        and "chunked" not in request.headers.get("Transfer-Encoding", "").lower()
    ):
        return False
    # Quart's Body sets this once the server handed it the last byte, read or not.
    complete = getattr(request.body, "_complete", None)
    return complete is None or not complete.is_set()
