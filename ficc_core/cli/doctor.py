"""``ficc doctor``: check a node the way its agent would run, and say what to fix."""

from __future__ import annotations

import json
import shutil
import ssl
import tempfile
from pathlib import Path
from typing import Any

import attrs
import click
import trio

from ..config import Config
from .settings import load_settings, run_trio


@click.command("doctor")
@click.option(
    "--controller",
    "controllers",
    multiple=True,
    envvar="FICC_CONTROLLER",
    help="A controller this node dials (checked for reachability, TLS and clock); repeat. "
    "[env: FICC_CONTROLLER]",
)
@click.option(
    "--provider",
    "providers",
    multiple=True,
    default=("process",),
    show_default=True,
    help="Executor provider to check; repeat.",
)
@click.option("--agent-dir", type=click.Path(path_type=Path), default=None)
@click.option("--agent-config", type=click.Path(path_type=Path), default=None)
@click.option("--ca-bundle", type=click.Path(path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.pass_context
def doctor(
    ctx: click.Context,
    controllers: tuple[str, ...],
    providers: tuple[str, ...],
    as_json: bool,
    **flags: Any,
) -> None:
    """Check this node: isolation and enforceable limits, each runtime's digest and
    executable, GPUs and driver, free disk for staging, and each controller's
    reachability, TLS and clock skew. One line per finding (OK, WARN or FAIL) with what
    to do; exits 1 when anything FAILs.

    It runs the providers' own probes in a scratch directory, so it is safe beside a
    running 'ficc executor'.
    """
    config = load_settings(ctx, flags)
    findings = run_trio(_doctor, config, controllers, providers)
    if as_json:
        click.echo(json.dumps({"findings": [f.to_json() for f in findings]}, indent=2))
    else:
        from ..agent.doctor import render

        click.echo(render(findings))
    if any(f.status == "FAIL" for f in findings):
        ctx.exit(1)


def _free_under(path: Path) -> int:
    """Free bytes on the filesystem that holds (or will hold) ``path``."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


async def _doctor(config: Config, controllers: tuple[str, ...], providers: tuple[str, ...]):
    from ..agent.doctor import controller_findings, disk_findings, node_findings
    from ..agent.embedded import agent_from_config
    from ..plugins import build_plugin_manager

    plugins = await trio.to_thread.run_sync(build_plugin_manager)
    scratch = await trio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="ficc-doctor-"))
    try:
        # A scratch agent directory: starting providers on the real one would adopt (and
        # clean up) the attempts a running agent holds there.
        probe = attrs.evolve(config, agent_dir=Path(scratch))
        agent = agent_from_config(probe, plugins, node_id="doctor", providers=providers)
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            found = [f for f in await node_findings(agent) if f.check != "disk"]
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(shutil.rmtree, scratch, True)
    free = await trio.to_thread.run_sync(_free_under, config.agent_path)
    found += disk_findings(free, str(config.agent_path))
    context = None
    if config.ca_bundle is not None:
        context = ssl.create_default_context(cafile=str(config.ca_bundle))
    for url in controllers:
        for item in url.split(","):
            if item.strip():
                found += await controller_findings(item.strip(), context)
    return found
