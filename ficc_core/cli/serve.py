"""``ficc serve``: the controller, its embedded agent, the first run and the demo."""

from __future__ import annotations

import gc
import sys
from typing import Any

import click
import trio

from .._version import __version__
from ..base.errors import FiccError, StoreError
from ..config import Config
from ..controller.service import Service, open_service
from .logs import configure_logging
from .options import data_dir_flag
from .settings import config_options, load_settings, run_trio
from .startup import Listeners, StartupRefused, bind_listeners, check_directories, store_hint


@click.command()
@config_options(exclude=("data_dir",))
@click.option(
    "--demo",
    is_flag=True,
    help="Also register the SmolLM2 model, start a llama.cpp chat service on the embedded "
    "node and print an invoke token with curl and openai snippets (reused on later runs).",
)
@click.option(
    "--debug",
    is_flag=True,
    help="Show the whole traceback when the controller cannot start (by default one line "
    "says why and what to change).",
)
@click.pass_context
def serve(ctx: click.Context, demo: bool, debug: bool, **flags: Any) -> None:
    """Run the controller: the HTTP API on hypercorn, until SIGINT or SIGTERM.

    On first start with an empty data directory it creates the project 'default',
    the administrator 'admin' and an admin bearer token, and writes them once to
    data_dir/first-run-secrets, readable only by this user (with first_run_secrets
    'stdout', prints them instead).
    """
    config = load_settings(ctx, flags)
    configure_logging(config.log_level, config.log_format, access=config.access_log)
    if demo and not config.embedded_agent:
        raise click.UsageError("--demo runs its service on the embedded agent")
    try:
        run_trio(_serve, config, demo)
    except StartupRefused as exc:
        if debug:
            raise
        raise click.ClickException(" ".join(exc.message.split())) from None
    except click.ClickException:
        raise
    except Exception as exc:
        if debug:
            raise
        raise click.ClickException(
            f"the controller stopped: {_describe(exc)}; run 'ficc serve --debug' for the traceback"
        ) from None


def _describe(exc: BaseException) -> str:
    """The innermost error of an exception group of one, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def _serve(config: Config, demo: bool = False) -> None:
    # Everything that would stop it from serving is checked first, and its ports are
    # bound: a controller that cannot serve never takes the leader lease.
    await trio.to_thread.run_sync(
        lambda: check_directories(config, embedded_agent=config.embedded_agent)
    )
    listeners = await trio.to_thread.run_sync(bind_listeners, config)
    opened = False
    try:
        async with open_service(config, background=True) as service:
            opened = True
            await _run(service, config, demo, listeners)
    except StoreError as exc:
        if opened:
            raise
        raise StartupRefused(
            f"cannot open the store: {exc.message}; {store_hint(config)}"
        ) from None
    click.echo("ficc: stopped", err=True)


async def _run(service: Service, config: Config, demo: bool, listeners: Listeners) -> None:
    from ..agent.embedded import run_embedded_agent
    from ..controller.server import run_until_signalled

    first_run = await service.auth.bootstrap()
    if first_run and config.first_run_secrets == "file":
        from ..auth.first_run import write_first_run_secrets

        try:
            first_run["file"] = await trio.to_thread.run_sync(
                write_first_run_secrets, config.data_dir, first_run
            )
        except OSError as exc:
            flag = data_dir_flag(config)
            raise click.ClickException(
                f"could not write the first-run secrets: {exc}; recover with "
                f"'ficc admin create-user NAME --admin{flag}' and "
                f"'ficc admin create-token --project default --all-scopes{flag}'"
            ) from None

    async with trio.open_nursery() as nursery:

        def ready(urls: list[str], metrics_urls: list[str]) -> None:
            _print_ready(service, urls, first_run, metrics_urls)
            if demo:
                nursery.start_soon(_demo, service, urls[0])

        if config.embedded_agent:
            await nursery.start(run_embedded_agent, service)
        settle_heap()
        await run_until_signalled(
            service, on_ready=ready, bind=listeners.api, metrics_bind=listeners.metrics
        )
        nursery.cancel_scope.cancel()


#: Net container allocations between two collections of the youngest generation once the
#: controller is up (Python's default is 700). See :func:`settle_heap`.
YOUNG_GENERATION_THRESHOLD = 10_000


def settle_heap() -> None:
    """Tune the cyclic garbage collector for serving, once start-up is done.

    The start-up heap (modules, settings, the store's and the gateway's tables: about
    100,000 objects) lives as long as the process, yet every full collection walked
    it again: about 50 ms, every few seconds under load, on the event loop. It is
    collected once and frozen (:func:`gc.freeze`), so later collections walk only
    what was made since. The relayed request path makes no reference cycles, so the
    young generation fills only with requests in flight (16 of them cross Python's
    default of 700 container objects); collecting it at 10,000 instead cut the
    collector's share of a request's CPU from about 46 to under 2 µs
    (docs/performance.md). Memory is not at stake: a young generation of 10,000
    objects is about a megabyte.
    """
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, oldest)


async def _demo(service: Service, url: str) -> None:
    from .demo import run_demo

    try:
        await run_demo(service, url)
    except FiccError as exc:
        click.echo(f"demo: {exc.message} [{exc.code}]; the controller keeps serving", err=True)


def _print_ready(
    service: Service,
    urls: list[str],
    first_run: dict[str, Any] | None,
    metrics_urls: list[str],
) -> None:
    url = urls[0] if urls else "?"
    flag = data_dir_flag(service.config)
    lines = [
        f"FICC {__version__} listening on {', '.join(urls)}",
        f"  data directory: {service.config.data_dir}",
        f"  controller {service.lease.controller_id}: {service.lease.describe()}",
        f"  web console: {url}/ (log in with a username and password)",
    ]
    if metrics_urls:
        lines.append(f"  metrics on {', '.join(u + '/metrics' for u in metrics_urls)}")
    if first_run and "file" in first_run:
        lines += [
            f"  first run: created project {first_run['project']!r} and administrator "
            f"{first_run['username']!r}; their password and token are in a file only this "
            "user can read (store them, then delete it):",
            f"    secrets file: {first_run['file']}",
        ]
    elif first_run:
        lines += [
            f"  first run: created project {first_run['project']!r} and administrator "
            f"{first_run['username']!r}; these are shown only once:",
            f"    admin password: {first_run['password']}",
            f"    admin token:    {first_run['token']}",
            f"  try: curl -H 'Authorization: Bearer {first_run['token']}' {url}/api/v1/whoami",
        ]
    lines += [
        "  log in from another shell (then every ficc command uses it):",
        f"    ficc login {url} --username admin",
        "  to issue a token on this machine instead:",
        f"    ficc admin create-token --project default --all-scopes{flag}",
    ]
    click.echo("\n".join(lines), nl=True)
    sys.stdout.flush()
