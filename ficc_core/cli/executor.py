"""``ficc executor``: a node agent that dials out to its controller, or to every one of several."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import trio

from ..config import Config
from .logs import configure_logging
from .settings import load_settings, run_trio

_AGENT_DIR_HELP = (
    "Agent state directory (any length: engine sockets are in runtime_dir, "
    "FICC_RUNTIME_DIR). [env: FICC_AGENT_DIR]"
)
_AGENT_CONFIG_HELP = (
    "TOML file with the node's labels and more installed runtimes (the installed runtime "
    "distributions' are found without it). [env: FICC_AGENT_CONFIG]"
)


_CONTROLLER_HELP = (
    "A controller's URL (http:// or https://); repeat it, or give a comma-separated list, "
    "for an installation of several controllers: the agent keeps a link to each, and blobs "
    "are fetched from them in this order. [env: FICC_CONTROLLER, comma-separated]"
)


def _controller_list(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    """Every URL given, split at commas (FICC_CONTROLLER holds a list), in order, once each."""
    urls = [url.strip() for value in values for url in value.split(",")]
    found = tuple(dict.fromkeys(url for url in urls if url))
    if not found:
        raise click.BadParameter("give at least one controller URL", ctx=ctx, param=param)
    return found


@click.command()
@click.option(
    "--controller",
    "controllers",
    multiple=True,
    required=True,
    envvar="FICC_CONTROLLER",
    callback=_controller_list,
    help=_CONTROLLER_HELP,
)
@click.option(
    "--credential",
    required=True,
    envvar="FICC_NODE_CREDENTIAL",
    help="The node credential from 'ficc admin add-node'. [env: FICC_NODE_CREDENTIAL]",
)
@click.option(
    "--provider",
    "providers",
    multiple=True,
    default=("process",),
    show_default=True,
    help="Executor provider to load; repeat.",
)
@click.option("--agent-dir", type=click.Path(path_type=Path), default=None, help=_AGENT_DIR_HELP)
@click.option(
    "--runtime-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The engines' Unix sockets (default /tmp/ficc-<uid>; at most 56 bytes). "
    "[env: FICC_RUNTIME_DIR]",
)
@click.option(
    "--agent-config", type=click.Path(path_type=Path), default=None, help=_AGENT_CONFIG_HELP
)
@click.option(
    "--ca-bundle",
    type=click.Path(path_type=Path),
    default=None,
    help="PEM bundle of CAs trusted for an https controller (default: the system's).",
)
@click.option("--log-level", default=None, help="debug, info, warning or error.")
@click.option("--log-format", default=None, help="text, or json: one JSON object per line.")
@click.pass_context
def executor(
    ctx: click.Context,
    controllers: tuple[str, ...],
    credential: str,
    providers: tuple[str, ...],
    **flags: Any,
) -> None:
    """Run a node agent that dials out to its controllers and runs what it is told, fenced.

    It authenticates with a node credential, reports its snapshot (providers,
    measured resources, the runtimes installed here with their computed digests),
    holds leases, and reconnects with backoff until SIGINT or SIGTERM. With several
    controllers it keeps a link to each and prints which one leads; only the
    leader's launches and stops are obeyed (the highest leader term wins).
    """
    config = load_settings(ctx, flags)
    configure_logging(config.log_level, config.log_format)
    run_trio(_executor, config, controllers, credential, providers)


async def _executor(
    config: Config, controllers: tuple[str, ...], credential: str, providers: tuple[str, ...]
) -> None:
    import signal
    import ssl

    from ..agent import Agent
    from ..agent.embedded import agent_from_config
    from ..agent.remote import RemoteAgent, Welcome
    from ..executor.runtime_dir import ensure_runtime_dir
    from ..plugins import build_plugin_manager

    context = None
    if config.ca_bundle is not None and any(url.startswith("https") for url in controllers):
        context = ssl.create_default_context(cafile=str(config.ca_bundle))

    def connected(welcome: Welcome) -> None:
        role = "" if welcome.role is None else f" ({welcome.role}, term {welcome.term})"
        click.echo(
            f"ficc executor: connected to {welcome.controller} as node {welcome.node_id}{role}"
        )
        if welcome.role == "leader":
            click.echo(f"ficc executor: the leader is {welcome.controller} (term {welcome.term})")
        sys.stdout.flush()

    # Before it connects: a runtime directory too long for an engine socket (or not this
    # user's) would fail every launch; the refusal names the setting.
    await trio.to_thread.run_sync(ensure_runtime_dir, config.runtime_path)
    # One plugin set for the process (entry points are read off the event loop): its
    # executor providers and the runtimes installed distributions declare.
    plugins = await trio.to_thread.run_sync(build_plugin_manager)

    def make_agent(node_id: str) -> Agent:
        # The remote agent gives it a stager: inputs this node lacks are fetched before
        # a launch, from the controller that sent it, then from the others in order.
        return agent_from_config(config, plugins, node_id=node_id, providers=providers)

    remote = RemoteAgent(
        controllers, credential, make_agent, ssl_context=context, on_connected=connected
    )
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in received:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await remote.run()
            nursery.cancel_scope.cancel()
    click.echo("ficc executor: stopped", err=True)
