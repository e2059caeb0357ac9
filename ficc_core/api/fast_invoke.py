"""A direct ASGI path for invoke requests with a bearer credential, in front of Quart.

Every request with ``Authorization: Bearer ficc_...`` to one of the three invoke
routes (``/api/v1/inference/{id}/v1/models``, ``.../chat/completions``,
``.../embeddings``) is served here: the credential is authenticated (from the
in-memory cache when it was verified recently), the body is read within
``max_body_bytes``, and the one seam ``service.gateway.invoke`` does
the rest. The response goes out chunk by chunk; a client disconnect cancels the
relay, which closes the stream (and so cancels the engine request); so does the
response's send deadline (a client that stopped reading).

Everything else, including invoke requests authenticated by a session cookie or
not at all, goes to the Quart application, whose routes serve the same paths the
same way. Skipping Quart's request and response objects, its hooks and its
routing on the hottest path is what this module is for: they cost more CPU per
request than the rest of the gateway (see docs/performance.md).
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import trio

from ..contributors import is_node_token
from ..errors import FiccError, PayloadTooLarge
from .app import error_response_bytes

if TYPE_CHECKING:
    from ..controller.service import Service

log = logging.getLogger("ficc.api")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_ROUTE = re.compile(r"/api/v1/inference/([^/]+)/v1/(models|chat/completions|embeddings)")
#: Path suffix -> (method, the route template the metrics name, as Quart's would).
_ROUTES = {
    "models": ("GET", "/api/v1/inference/<service_id>/v1/models"),
    "chat/completions": ("POST", "/api/v1/inference/<service_id>/v1/chat/completions"),
    "embeddings": ("POST", "/api/v1/inference/<service_id>/v1/embeddings"),
}
_BEARER = b"bearer "


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            if value[:7].lower() != _BEARER:
                return None
            token = value[7:].strip().decode("latin-1")
            return token if token and not is_node_token(token) else None
    return None


class FastInvoke:
    """ASGI middleware: bearer invoke requests to the gateway, everything else to ``app``."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service
        self.limit = service.config.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match = _ROUTE.fullmatch(scope["path"])
            if match is not None:
                method, route = _ROUTES[match.group(2)]
                if scope["method"] == method:
                    token = _bearer(scope)
                    if token is not None:
                        await self._invoke(
                            scope, receive, send, match.group(1), match.group(2), route, token
                        )
                        return
        await self.app(scope, receive, send)

    async def _invoke(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        service_id: str,
        suffix: str,
        route: str,
        token: str,
    ) -> None:
        started = time.perf_counter()
        status = 500
        try:
            principal = await self.service.auth.authenticate_bearer(token)
            if scope["method"] == "POST":
                body = await self._body(receive)
                if body is None:
                    return  # the client left before it finished sending
            else:
                body = b""
            gateway = self.service.gateway
            status, chunks = await gateway.invoke(service_id, "/v1/" + suffix, body, principal)
        except FiccError as error:
            status = error.status
            await self._refuse(send, error)
        except Exception:
            reference = secrets.token_hex(6)
            log.exception("unexpected error (reference %s) on %s", reference, scope["path"])
            await self._refuse(
                send,
                FiccError(
                    "an internal error occurred; the operator can find it in the log under "
                    f"reference {reference}",
                    details={"reference": reference},
                ),
            )
        else:
            headers = [
                (b"content-type", chunks.content_type.encode("latin-1")),
                (b"cache-control", b"no-cache" if chunks.streaming else b"no-store"),
            ]
            if chunks.streaming:
                headers.append((b"x-accel-buffering", b"no"))
            await self._relay(receive, send, status, headers, chunks)
        finally:
            metrics = self.service.metrics
            metrics.http_requests.labels(route, scope["method"], str(status)).inc()
            metrics.http_duration.labels(route).observe(time.perf_counter() - started)

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

    async def _refuse(self, send: Send, error: FiccError) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", b"no-store"),
            *((k.lower().encode(), v.encode()) for k, v in error.headers.items()),
        ]
        if error.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="ficc"'))
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": error_response_bytes(error)})

    async def _whole(
        self, send: Send, status: int, headers: list[tuple[bytes, bytes]], chunks: Any
    ) -> bool:
        """Send a non-streamed answer as one body with its length, if it is all there.

        The gateway reads a JSON answer to its end before ``invoke`` returns (up to its
        prefetch bound), so this is one write instead of a chunked body. Returns False,
        having sent nothing, for a longer answer, which then streams as usual.
        """
        pending = chunks.take_pending()
        if pending is None:
            return False
        body = b"".join(pending)
        headers.append((b"content-length", str(len(body)).encode("ascii")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return True

    async def _relay(
        self,
        receive: Receive,
        send: Send,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: Any,
    ) -> None:
        async def watch(cancel_scope: trio.CancelScope) -> None:
            # Until the client goes away or the send deadline passes (it stopped reading).
            with trio.move_on_at(chunks.send_deadline) as waiting:
                while (await receive())["type"] != "http.disconnect":
                    pass
            cancel_scope.cancel()
            if waiting.cancelled_caught:
                # hypercorn shields its socket writes, so a send blocked on a client that
                # stopped reading is not cancelled: free the slot here, not after it.
                log.info("response cut at its send deadline: the client stopped reading")
                with trio.CancelScope(shield=True):
                    await chunks.aclose()

        try:
            # A whole JSON answer is already read: one write, nothing left to cancel.
            if not chunks.streaming and await self._whole(send, status, headers, chunks):
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, nursery.cancel_scope)
                await send({"type": "http.response.start", "status": status, "headers": headers})
                try:
                    async for chunk in chunks:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except FiccError as error:
                    # The head is out: the connection closes without a complete body.
                    log.info("response cut after it started: %s (%s)", error.message, error.code)
                    nursery.cancel_scope.cancel()
                    return
                await send({"type": "http.response.body", "body": b""})
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await chunks.aclose()
