"""A replica's engine log: a snapshot, a ticket, and the live stream the ticket opens.

- ``GET .../replicas/{n}/logs?tail=N`` (``inference:read``): the last lines of the
  replica's latest attempt's log, read from its node.
- ``POST .../replicas/{n}/logs/ticket`` (``inference:read``): a single-use ticket
  (:mod:`ficc_core.auth.tickets`, 60 s) for that replica's stream, bound to the caller.
- ``GET .../replicas/{n}/logs/stream?ticket=T&tail=N``: ``text/event-stream``,
  authenticated by the ticket alone (a long-lived credential never goes in a URL):
  the last ``tail`` lines, then new ones, one ``data:`` event per line; a
  ``: keepalive`` comment every ``log_keepalive`` seconds of quiet (reverse proxies
  drop idle connections); ``event: end`` once the attempt's log closes; ``event:
  error`` (the error envelope as data) when the follow fails, the caller's
  credential is revoked, or the server's shutdown grace ended (``server_shutting_down``,
  as on invoke streams).

The follow runs on the attempt's node (through the node link, bounded and
backpressured like endpoint streams) and is read by a task of its own here, handing
one line at a time to the response: a client that stops reading stops the node
reading the log, and one that disconnects ends the follow on the node. Nothing of
the invoke path (admission slots, the gateway) is held.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import trio
from quart import Response, g, jsonify, request

from ..auth.tickets import Tickets
from ..base.errors import FiccError
from ..base.strictjson import dumps_error
from ..inference.operations.logs import DEFAULT_TAIL, MAX_TAIL, ReplicaLog, ReplicaLogs
from .access import route
from .bodies import query_bounded

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..auth import Principal
    from ..controller.service import Service

log = logging.getLogger("ficc.api")

#: What a stream's follow task hands its response when the log ended.
_END = object()


def log_view(found: ReplicaLog) -> dict[str, Any]:
    """A snapshot as the API answers it."""
    return {
        "service_id": found.service_id,
        "replica": found.replica,
        "attempt_id": found.attempt_id,
        "attempt_state": found.attempt_state,
        "node_id": found.node_id,
        "lines": list(found.lines),
    }


def sse_data(line: str) -> bytes:
    """One log line as one ``data:`` event (a carriage return would end an SSE line)."""
    return b"data: " + line.rstrip("\r").replace("\r", " ").encode("utf-8", "replace") + b"\n\n"


def sse_event(event: str, data: Any) -> bytes:
    """A named event whose data is JSON on one line."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def sse_error(error: FiccError) -> bytes:
    """An ``error`` event carrying ``error``'s envelope."""
    return b"event: error\ndata: " + dumps_error(error.envelope()) + b"\n\n"


async def _follow_into(
    lines: AsyncGenerator[str, None], send: trio.MemorySendChannel[Any], scope: trio.CancelScope
) -> None:
    """Hand each line to the response (waiting for it to take one), then the end or the
    failure; cancelling ``scope`` closes the follow, which ends it on the node."""
    with scope, send:
        try:
            async with aclosing(lines) as follow:
                async for line in follow:
                    await send.send(line)
            await send.send(_END)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the response went away first
        except Exception as exc:  # the application's nursery must never see it
            if not isinstance(exc, FiccError):
                log.exception("a log follow failed")
                exc = FiccError("the log follow failed; see the controller's log")
            try:
                await send.send(exc)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


#: How often a quiet stream looks whether the server's shutdown grace ended, in seconds
#: (the gateway's streams re-check as often).
SHUTDOWN_RECHECK = 0.25


async def _events(
    received: trio.MemoryReceiveChannel[Any],
    scope: trio.CancelScope,
    *,
    keepalive: float,
    still_valid: Any,
    shutting_down: Any,
    attempt_id: str,
) -> AsyncIterator[bytes]:
    try:
        quiet_until = trio.current_time() + keepalive
        while True:
            item: Any = None
            with trio.move_on_at(min(quiet_until, trio.current_time() + SHUTDOWN_RECHECK)) as wait:
                item = await received.receive()
            ended: FiccError | None = shutting_down()
            if ended is not None:
                # The grace ended: a last event, so a client knows to reconnect later.
                yield sse_error(ended)
                return
            if not still_valid():
                yield sse_event(
                    "error",
                    {
                        "error": {
                            "code": "credential_revoked",
                            "message": "the credential that minted this stream's ticket was "
                            "revoked or expired",
                        }
                    },
                )
                return
            if wait.cancelled_caught:
                if trio.current_time() >= quiet_until:
                    quiet_until = trio.current_time() + keepalive
                    yield b": keepalive\n\n"
                continue
            quiet_until = trio.current_time() + keepalive
            if item is _END:
                yield sse_event("end", {"attempt_id": attempt_id, "reason": "attempt_ended"})
                return
            elif isinstance(item, FiccError):
                yield sse_error(item)
                return
            else:
                yield sse_data(item)
    except trio.EndOfChannel:
        return
    finally:
        scope.cancel()
        received.close()


def register(app: QuartTrio, service: Service) -> None:
    """Add the replica log routes to ``app``."""
    logs = ReplicaLogs(service.inference, service.contributors)
    tickets = Tickets(service.store, clock=service.auth.clock)

    def subject(service_id: str, replica: int) -> str:
        return f"{service_id}/{replica}"

    @route(app, "inference_logs")
    async def inference_logs(service_id: str, replica: int) -> Response:
        tail = query_bounded("tail", 1, MAX_TAIL, DEFAULT_TAIL)
        found = await logs.snapshot(g.principal.project_id, service_id, replica, tail)
        return jsonify(log_view(found))

    @route(app, "inference_logs_ticket")
    async def inference_logs_ticket(service_id: str, replica: int) -> Response:
        principal: Principal = g.principal
        await logs.latest_attempt(principal.project_id, service_id, replica, action="logs")
        ticket, expires_at = await tickets.mint(principal, "logs", subject(service_id, replica))
        return jsonify({"ticket": ticket, "expires_at": expires_at})

    @route(app, "inference_logs_stream")
    async def inference_logs_stream(service_id: str, replica: int) -> Response:
        tail = query_bounded("tail", 0, MAX_TAIL, DEFAULT_TAIL)
        redeemed = await tickets.redeem(
            request.args.get("ticket", ""), "logs", subject(service_id, replica)
        )
        nursery: trio.Nursery | None = getattr(app, "nursery", None)
        if nursery is None:  # only an application served without its lifespan lacks it
            raise FiccError(
                "live streams need the served application", code="stream_unavailable", status=503
            )
        principal = redeemed.principal()
        attempt = await logs.latest_attempt(redeemed.project_id, service_id, replica)
        lines = logs.follow(attempt, tail)
        # The follow is read by a task of the application's nursery (the response's
        # generator must not hold a nursery across its yields); a channel without a
        # buffer hands one line at a time, so a slow client holds back the node.
        send, received = trio.open_memory_channel[Any](0)
        scope = trio.CancelScope()
        nursery.start_soon(_follow_into, lines, send, scope)
        body = _events(
            received,
            scope,
            keepalive=service.config.log_keepalive,
            still_valid=lambda: service.auth.still_valid(principal),
            shutting_down=service.gateway.checks.shutdown_problem,
            attempt_id=attempt.attempt_id,
        )
        response = Response(body, content_type="text/event-stream")
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Accel-Buffering"] = "no"
        response.timeout = None  # a follow lasts as long as the attempt runs
        return response
