"""The invoke routes: one handler for the per-service and the project endpoint's routes.

The per-service routes are ``/api/v1/inference/{id}`` and each of ``gateway.PATHS``;
the project endpoint's are each of ``gateway.PATHS`` alone (``/v1/chat/completions``:
an OpenAI client's ``base_url`` is the server's URL with ``/v1``), where the body's
``model`` names the service (:class:`~ficc_core.gateway.ProjectEndpoint`), whose alias
the response's ``x-ficc-service`` header carries. Beside them, ``GET .../v1/models/{model}``
(both bases) answers one model's ``/v1/models`` entry (:data:`MODEL_ROUTES`).

:func:`register` puts the routes in Quart's URL map (its routing answers 405 for
another method, and the route table lists them) and :class:`InvokeRoutes` in front
of Quart's own handling (``app.asgi_app``): every request to an invoke route with
the route's method is served there, however it is authenticated, by the rules
every route follows (:func:`~ficc_core.api.authn.authenticate`: a bearer
credential, from memory when it was verified recently, or a browser session with
its CSRF header). Its body is read within ``max_body_bytes`` and the gateway's seam
(``gateway.invoke``, or the project endpoint's ``invoke``, which ends in it) does the
rest; the response is closed when the handler leaves it.

The response goes out chunk by chunk (a whole JSON answer as one body with its
length). A request still running 0.1 s after its body's end, and a streamed response
from its head, gets a watcher (:mod:`.client_watch`) that waits for the client to
leave: a disconnect cancels whatever the handler awaits, the queue, the activation,
the engine's whole answer (not streamed) or the relay, and leaving the response
closes it and so cancels the engine request. Once the response exists the watcher
also ends at its send deadline, when the client stopped reading: the response is
closed there even while a write to the client is blocked (hypercorn does not cancel
a socket write), which frees the replica slot.

Skipping Quart's request and response objects, its hooks and its routing on the
hottest path is why this is plain ASGI: they cost more CPU per request than the
rest of the gateway (see docs/performance.md).
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from werkzeug.http import parse_cookie

from ..base.errors import FiccError, PayloadTooLarge
from ..base.strictjson import dumps_error
from ..gateway import MODEL_PREFIX, PATHS
from ..http1.client_watch import ClientWatch, Watcher
from ..store.outage import RefusalLog, as_store_unavailable, is_store_failure
from .access import add_route, declared
from .access_log import log_request
from .authn import SESSION_COOKIE, authenticate

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..auth import Principal
    from ..controller.service import Service
    from ..gateway import ResponseChunks

log = logging.getLogger("ficc.api")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PREFIX = "/api/v1/inference/"
#: An invoke route: the service ID, then one of the gateway's paths.
_ROUTE = re.compile(re.escape(PREFIX) + r"([^/]+)(" + "|".join(map(re.escape, PATHS)) + ")")


def endpoint_name(path: str, prefix: str = "invoke_") -> str:
    """The route's name in the route table (``invoke_chat_completions``; the
    project endpoint's with ``prefix`` ``project_``)."""
    return prefix + path.removeprefix("/v1/").replace("/", "_")


def _served(endpoint: str, method: str, rule: str) -> tuple[str, str, bool, str]:
    """What :class:`InvokeRoutes` serves as ``endpoint``: the method and rule the gateway's
    paths make, which the route table must declare, the table's CSRF rule, the endpoint."""
    route = declared(endpoint)
    if (route.method, route.rule) != (method, rule):
        raise RuntimeError(
            f"the route table declares {endpoint} as {route.method} {route.rule}, but the "
            f"gateway serves {method} {rule}: make ROUTES in ficc_core/api/access.py agree"
        )
    return method, rule, route.csrf, endpoint


#: Gateway path -> (method, the route as Quart's URL map and the HTTP metrics name it,
#: whether a session sends its CSRF token, the endpoint).
ROUTES = {
    path: _served(endpoint_name(path), method, f"{PREFIX}<service_id>{path}")
    for path, method in PATHS.items()
}
#: The project endpoint's routes: the gateway's paths at the root.
PROJECT_ROUTES = {
    path: _served(endpoint_name(path, "project_"), method, path) for path, method in PATHS.items()
}
#: One model's entry (``GET .../v1/models/{model}``, the ``openai`` client's
#: ``models.retrieve``): the route per service, at the root; the model may hold ``/``.
MODEL_ROUTES = (
    _served("invoke_model", "GET", f"{PREFIX}<service_id>/v1/models/<path:model>"),
    _served("project_model", "GET", "/v1/models/<path:model>"),
)
_MODEL = re.compile(re.escape(PREFIX) + r"([^/]+)(" + re.escape(MODEL_PREFIX) + ".+)")
#: The header naming the service that answered a project-endpoint request.
SERVICE_HEADER = b"x-ficc-service"
#: The status the access log and metrics record for a request whose client left before
#: it was answered (nginx's "client closed request"); nothing is sent.
CLIENT_LEFT = 499


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers for the gateway's routing: lower-case names, first values."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = name.decode("latin-1")
        if key not in headers:
            headers[key] = value.decode("latin-1")
    return headers


def register(app: QuartTrio, service: Service) -> None:
    """Add the invoke routes to ``app``, served by :class:`InvokeRoutes` in front of it."""

    async def served_in_front(**_: str) -> None:
        raise RuntimeError("the invoke routes are served by InvokeRoutes, in front of Quart")

    for *_, endpoint in (*ROUTES.values(), *PROJECT_ROUTES.values(), *MODEL_ROUTES):
        add_route(app, endpoint, served_in_front)
    # Quart and hypercorn type ASGI's scope and messages as TypedDicts, our middleware as
    # plain mappings (what it indexes): the same dicts at run time.
    invoke = InvokeRoutes(app.asgi_app, service)  # type: ignore[arg-type]
    app.asgi_app = invoke  # type: ignore[method-assign, assignment]

    @app.before_serving
    async def watch_clients() -> None:
        # In the lifespan's nursery: the server's one scheduler of client watchers.
        await app.nursery.start(invoke.clients.run)

    @app.after_serving
    async def stop_watching() -> None:
        invoke.clients.stop()


class InvokeRoutes:
    """ASGI middleware: requests to the invoke routes to the gateway, everything else to ``app``."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service
        self.limit = service.config.max_body_bytes
        #: The project endpoint, built by the assembly.
        self.project = service.project
        #: Arms a watcher on the client of each request that lasts (see client_watch).
        self.clients = ClientWatch()
        #: Invoke requests refused because the store failed (logged once a while).
        self.store_refusals = RefusalLog(logger=log)
        #: The metric children per (route, method, status), looked up once.
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            found = PROJECT_ROUTES.get(path)
            service_id: str | None = None
            if found is None:
                match = _ROUTE.fullmatch(path)
                if match is not None:
                    service_id, path = match.group(1), match.group(2)
                    found = ROUTES[path]
                elif path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
                    found = MODEL_ROUTES[1]
                else:
                    match = _MODEL.fullmatch(path)
                    if match is not None:
                        service_id, path = match.group(1), match.group(2)
                        found = MODEL_ROUTES[0]
            if found is not None:
                method, route, check_csrf, _ = found
                if scope["method"] == method or (scope["method"] == "HEAD" and method == "GET"):
                    await self._invoke(scope, receive, send, service_id, path, route, check_csrf)
                    return
        await self.app(scope, receive, send)

    async def _invoke(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        service_id: str | None,
        path: str,
        route: str,
        check_csrf: bool,
    ) -> None:
        started = time.perf_counter()
        status, answered = 500, False
        principal: Principal | None = None
        response = None
        try:
            principal = await self._principal(scope, check_csrf)
            if scope["method"] == "POST":
                body = await self._body(receive)
                if body is None:
                    return  # the client left before it finished sending
            else:
                body = b""
            headers = request_headers(scope)
            extra: tuple[tuple[bytes, bytes], ...] = ()
            # The client may leave while its request waits in the queue, loads, or (not
            # streamed) is generated whole: the watcher cancels it all, and so the engine
            # request (its slot freed at once, not when the engine would have finished).
            failure: BaseException | None = None
            async with self.clients.watching(receive) as watcher:
                try:
                    if service_id is None:
                        served = await self.project.invoke(path, body, principal, headers)
                        response = served.response
                        if served.service is not None:
                            extra = ((SERVICE_HEADER, served.service.alias.encode("ascii")),)
                    else:
                        _, response = await self.service.gateway.invoke(
                            service_id, path, body, principal, headers
                        )
                    async with response:
                        status, answered = response.status, True
                        watcher.until(response.send_deadline)
                        await self._relay(scope, send, response, extra, watcher)
                except Exception as exc:  # raised below, outside the watch (no group)
                    failure = exc
            if watcher.left and not answered:
                status = CLIENT_LEFT  # nobody to answer: the request was cancelled
                return
            if failure is not None:
                raise failure
        except Exception as exc:
            if answered:
                raise  # the head may be out: nothing else can be sent
            outage = is_store_failure(exc)
            error: FiccError
            if outage:
                # Only a credential never verified here (or an activation) needs the store.
                error = as_store_unavailable(exc)
                self.store_refusals.refused(error, f"{scope['method']} {scope['path']}")
            else:
                error = exc if isinstance(exc, FiccError) else self._internal(scope, exc)
            status = error.status
            await self._refuse(send, error, logged=outage)
        finally:
            duration = time.perf_counter() - started
            series = self._series.get((route, scope["method"], status))
            if series is None:
                metrics = self.service.metrics
                series = self._series[(route, scope["method"], status)] = (
                    metrics.http_requests.labels(route, scope["method"], str(status)),
                    metrics.http_duration.labels(route),
                )
            series[0].inc()
            series[1].observe(duration)
            finished = None if response is None else response.request
            if finished is not None and finished.replica is not None:
                prompt, completion = finished.tokens
                log_request(
                    scope["method"],
                    scope["path"],
                    status,
                    duration,
                    principal,
                    service=finished.view.alias,
                    replica=finished.replica.index,
                    node=finished.replica.node_id,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                )
            else:
                log_request(scope["method"], scope["path"], status, duration, principal)

    async def _principal(self, scope: Scope, check_csrf: bool) -> Principal:
        authorization: str | None = None
        csrf: str | None = None
        cookies: list[str] = []
        for name, value in scope["headers"]:
            if name == b"authorization":
                if authorization is None:
                    authorization = value.decode("latin-1")
            elif name == b"cookie":
                cookies.append(value.decode("latin-1"))
            elif name == b"x-csrf-token" and csrf is None:
                csrf = value.decode("latin-1")
        session = None
        if authorization is None and cookies:
            session = parse_cookie(";".join(cookies)).get(SESSION_COOKIE)
        return await authenticate(
            self.service.auth,
            check_csrf=check_csrf,
            authorization=authorization,
            session=session,
            csrf=csrf or "",
        )

    async def _body(self, receive: Receive) -> bytes | None:
        received = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            received += message.get("body", b"")
            if len(received) > self.limit:
                raise PayloadTooLarge(
                    f"the request body is larger than this route accepts ({self.limit} bytes)",
                    details={"limit": self.limit},
                )
            if not message.get("more_body", False):
                return bytes(received)

    @staticmethod
    def _internal(scope: Scope, exc: Exception) -> FiccError:
        reference = secrets.token_hex(6)
        log.error(
            "unexpected error (reference %s) on %s %s",
            reference,
            scope["method"],
            scope["path"],
            exc_info=exc,
        )
        return FiccError(
            "an internal error occurred; the operator can find it in the log under "
            f"reference {reference}",
            details={"reference": reference},
        )

    async def _refuse(self, send: Send, error: FiccError, *, logged: bool = False) -> None:
        if error.status >= 500 and not logged:
            # A 503 is the service's state (stopped, draining, saturated, no replica
            # ready): the access log has it; an engine's 502 or 504 is worth a warning;
            # only the controller's own failure is an error.
            level = (
                logging.INFO
                if error.status == 503
                else logging.WARNING
                if error.status in (502, 504)
                else logging.ERROR
            )
            log.log(level, "%s: %s", error.code, error.message)
        body = dumps_error(error.envelope())
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
            (b"cache-control", b"no-store"),
            *((k.lower().encode(), v.encode()) for k, v in error.headers.items()),
        ]
        if error.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="ficc"'))
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _relay(
        self,
        scope: Scope,
        send: Send,
        response: ResponseChunks,
        extra: tuple[tuple[bytes, bytes], ...],
        watcher: Watcher,
    ) -> None:
        headers = [
            (b"content-type", response.content_type.encode("latin-1")),
            (b"cache-control", b"no-cache" if response.streaming else b"no-store"),
            *extra,
        ]
        if response.streaming:
            headers.append((b"x-accel-buffering", b"no"))
        # A whole JSON answer is already read: one write with its length.
        pending = None if response.streaming else response.take_pending()
        if pending is not None:
            body = b"".join(pending)
            headers.append((b"content-length", str(len(body)).encode("ascii")))
        start = {"type": "http.response.start", "status": response.status, "headers": headers}
        if scope["method"] == "HEAD":
            await send(start)
            await send({"type": "http.response.body", "body": b""})
            return
        if pending is not None:
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        watcher.relay(response)
        await send(start)
        try:
            async for chunk in response:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except FiccError as error:
            # The head is out: the connection closes without a complete body.
            log.info("response cut after it started: %s (%s)", error.message, error.code)
            return
        await send({"type": "http.response.body", "body": b""})
