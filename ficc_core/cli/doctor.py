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
@click.option(
    "--agent-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The agent directory to check (default: the agent_dir setting). [env: FICC_AGENT_DIR]",
)
@click.option(
    "--runtime-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The engines' socket directory to check (default: the runtime_dir setting). "
    "[env: FICC_RUNTIME_DIR]",
)
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

    It checks the real agent directory (writable, free disk) and runtime directory (an
    engine's socket fits and binds there), and runs the providers' own probes in a
    directory of its own inside the agent directory, removed afterwards: a running
    'ficc serve' or 'ficc executor' keeps its attempts.
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


def _probe_dir(agent_dir: Path) -> Path:
    """A fresh directory for the providers' probes: inside the real agent directory where
    it can be written (its filesystem is the one checked), else a scratch one.

    Never the agent directory itself: providers started there would adopt (and clean
    up) the attempts a running agent holds in it.
    """
    try:
        agent_dir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="doctor-", dir=agent_dir))
    except OSError:
        return Path(tempfile.mkdtemp(prefix="ficc-doctor-"))


async def _doctor(config: Config, controllers: tuple[str, ...], providers: tuple[str, ...]):
    from ..agent.doctor import (
        controller_findings,
        directory_findings,
        disk_findings,
        node_findings,
    )
    from ..agent.embedded import agent_from_config
    from ..executor.runtime_dir import default_runtime_dir
    from ..plugins import build_plugin_manager

    plugins = await trio.to_thread.run_sync(build_plugin_manager)
    found = await trio.to_thread.run_sync(
        directory_findings, config.agent_path, config.runtime_path
    )
    scratch = await trio.to_thread.run_sync(_probe_dir, config.agent_path)
    try:
        runtime_dir = config.runtime_path
        if any(f.check == "runtime_dir" and f.status == "FAIL" for f in found):
            runtime_dir = default_runtime_dir()  # the providers still probe isolation
        probe = attrs.evolve(config, agent_dir=scratch, runtime_dir=runtime_dir)
        agent = agent_from_config(probe, plugins, node_id="doctor", providers=providers)
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            found += [f for f in await node_findings(agent) if f.check != "disk"]
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
