"""``ficc executor``: a node agent that dials out to a controller."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import trio

from ..config import Config
from .logs import configure_logging
from .settings import load_settings, run_trio

_AGENT_DIR_HELP = "Agent state directory (keep it short). [env: FICC_AGENT_DIR]"
_AGENT_CONFIG_HELP = (
    "TOML file with the node's labels and more installed runtimes (the installed runtime "
    "distributions' are found without it). [env: FICC_AGENT_CONFIG]"
)


@click.command()
@click.option(
    "--controller",
    required=True,
    envvar="FICC_CONTROLLER",
    help="The controller's URL (http:// or https://). [env: FICC_CONTROLLER]",
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
    controller: str,
    credential: str,
    providers: tuple[str, ...],
    **flags: Any,
) -> None:
    """Run a node agent that dials out to CONTROLLER and runs what it is told, fenced.

    It authenticates with a node credential, reports its snapshot (providers,
    measured resources, the runtimes installed here with their computed digests),
    holds leases, and reconnects with backoff until SIGINT or SIGTERM.
    """
    config = load_settings(ctx, flags)
    configure_logging(config.log_level, config.log_format)
    run_trio(_executor, config, controller, credential, providers)


async def _executor(
    config: Config, controller: str, credential: str, providers: tuple[str, ...]
) -> None:
    import signal
    import ssl

    from ..agent import Agent
    from ..agent.embedded import agent_from_config
    from ..agent.remote import RemoteAgent
    from ..agent.staging import stager_from_settings
    from ..plugins import build_plugin_manager

    context = None
    if config.ca_bundle is not None and controller.startswith("https"):
        context = ssl.create_default_context(cafile=str(config.ca_bundle))

    def connected(node_id: str) -> None:
        click.echo(f"ficc executor: connected to {controller} as node {node_id}")
        sys.stdout.flush()

    # One plugin set for the process (entry points are read off the event loop): its
    # executor providers and the runtimes installed distributions declare.
    plugins = await trio.to_thread.run_sync(build_plugin_manager)

    def make_agent(node_id: str) -> Agent:
        agent = agent_from_config(config, plugins, node_id=node_id, providers=providers)
        # Blob inputs this node lacks are fetched from the controller before a launch.
        agent.stager = stager_from_settings(
            config.agent_path, controller, credential, agent.settings, ssl_context=context
        )
        return agent

    remote = RemoteAgent(
        controller, credential, make_agent, ssl_context=context, on_connected=connected
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
