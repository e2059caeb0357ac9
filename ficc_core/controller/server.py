"""Serving the HTTP application with hypercorn's trio worker inside our own nursery."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from ..api.app import create_app
from ..api.metrics_app import MetricsApp
from ..http1.server import use_http1
from .service import Service

log = logging.getLogger("ficc.server")

#: Seconds hypercorn waits past the shutdown grace, for the responses still open at its end
#: to send their last event (the gateway notices within its recheck interval, 0.25 s).
SHUTDOWN_NOTICE = 1.0

#: Seconds an idle kept-alive connection stays open (hypercorn's default is 5 s): longer
#: than the idle timeouts of clients' pools and of proxies and load balancers (60 s is
#: usual), so that a client rarely sends a request on a connection the server is closing.
#: On shutdown idle connections close at once (:class:`~ficc_core.http1.response_end.ResponseEnd`).
KEEP_ALIVE_TIMEOUT = 75.0


def _hypercorn_config(service: Service, bind: str | None = None) -> HypercornConfig:
    config = service.config
    hc = HypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host
    hc.bind = [bind or f"{host}:{config.port}"]
    hc.graceful_timeout = config.shutdown_grace + SHUTDOWN_NOTICE
    hc.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    if config.tls:
        hc.certfile = str(config.tls_certfile)
        hc.keyfile = str(config.tls_keyfile)
    return use_http1(hc)


async def serve_http(
    service: Service,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    bind: str | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API until ``shutdown_trigger`` returns; report the bound URLs when ready.

    ``bind`` is a socket bound already (``fd://N``); by default hypercorn binds
    ``host:port`` itself. Without ``advertise_url``, the leader lease names the URL it
    bound (port 0 chose one).
    """

    async def serve(task_status: trio.TaskStatus[list[str]]) -> None:
        await hypercorn_serve(
            create_app(service),
            _hypercorn_config(service, bind),
            shutdown_trigger=shutdown_trigger,
            task_status=task_status,
        )

    async with trio.open_nursery() as nursery:
        urls = await nursery.start(serve)
        if not service.config.advertise_url and urls:
            await service.lease.advertise(urls[0])
        task_status.started(urls)


async def serve_metrics(
    service: Service,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    bind: str | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` alone on ``metrics_listen`` (with the same TLS as the API),
    or on ``bind``, a socket bound already (``fd://N``)."""
    await hypercorn_serve(
        # hypercorn types ASGI's scope and messages as TypedDicts, MetricsApp as plain
        # mappings: the same dicts at run time.
        MetricsApp(service.metrics),  # type: ignore[arg-type]
        _hypercorn_config(service, bind or service.config.metrics_listen),
        shutdown_trigger=shutdown_trigger,
        task_status=task_status,
    )


async def end_node_connections(service: Service, grace: float) -> None:
    """Once no invoke request is in flight (a remote replica's are relayed over its
    node's connection), stop this controller's own work, end what is still open and
    every node connection.

    hypercorn's shutdown waits for each open connection, a remote agent's WebSocket
    too: without this it waited out the whole grace. The role's work (the reconciler,
    the node sweep) stops first, as when the lease is lost (nothing a node runs is
    stopped), so the connections this controller ends are not recorded as trouble of
    their nodes (a replica that "cannot be reached"). What is still open, a replica's
    live log relayed over its node's connection, ends as at the end of the grace
    (``server_shutting_down``). The embedded node's connection ends too: it stops with
    the process.
    """
    await service.live.wait_all_idle()
    await service.lease.stop_work()
    log.info("no request in flight; ending the node connections")
    service.gateway.checks.shut_down(grace, idle=True)
    service.contributors.live.end_all()


async def run_until_signalled(
    service: Service,
    *,
    on_ready: Callable[[list[str], list[str]], None],
    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
    bind: str | None = None,
    metrics_bind: str | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully within the configured grace.

    In-flight requests may finish within ``shutdown_grace``; at its end every response
    still open or queued ends with ``server_shutting_down`` (a streamed one as its last
    SSE event, :meth:`~ficc_core.gateway.checks.RequestChecks.shut_down`), which
    hypercorn gives :data:`SHUTDOWN_NOTICE` more seconds to send before it closes the
    connections. Once none is in flight, the node connections end
    (:func:`end_node_connections`): with nothing else open, the process exits at once.

    ``on_ready`` gets the API's URLs and the metrics listener's (empty unless
    ``metrics_listen`` is set). ``bind`` and ``metrics_bind`` are their sockets when
    bound already (``fd://N``: ``ficc serve`` binds before it takes the leader lease).
    """
    stop = trio.Event()
    grace = service.config.shutdown_grace

    async def end_streams_after_grace() -> None:
        await trio.sleep(grace)
        log.info("the %g s shutdown grace ended; ending the responses still open", grace)
        service.gateway.checks.shut_down(grace)

    with trio.open_signal_receiver(*signals) as received:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in received:
                    log.info("received %s; shutting down", signal.Signals(signum).name)
                    stop.set()
                    return

            nursery.start_soon(watch_signals)
            async with trio.open_nursery() as servers:
                metrics_urls: list[str] = []
                if service.config.metrics_listen is not None:
                    metrics_urls = await servers.start(
                        lambda task_status: serve_metrics(
                            service,
                            shutdown_trigger=stop.wait,
                            bind=metrics_bind,
                            task_status=task_status,
                        )
                    )
                urls = await servers.start(
                    lambda task_status: serve_http(
                        service, shutdown_trigger=stop.wait, bind=bind, task_status=task_status
                    )
                )
                on_ready(urls, metrics_urls)
                await stop.wait()
                # hypercorn drains within graceful_timeout; this is the hard deadline on top.
                nursery.cancel_scope.deadline = trio.current_time() + grace + SHUTDOWN_NOTICE + 1
                nursery.start_soon(end_streams_after_grace)
                nursery.start_soon(end_node_connections, service, grace)
            # Both servers are done (nothing was left open): nothing to end any more.
            nursery.cancel_scope.cancel()
