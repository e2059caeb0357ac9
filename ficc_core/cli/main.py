"""The ``ficc`` command line.

Settings come from embedded defaults, then the TOML file named by ``--config`` (or
``FICC_CONFIG``), then ``FICC_*`` environment variables, then flags.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import attrs
import click
import trio

from .._version import __version__
from ..auth import ALL_SCOPES, PROJECT_SCOPES
from ..config import Config, env_name, load_config, parse_duration, render_reference
from ..controller.service import Service, open_service
from ..errors import FiccError

_FLAG_TYPES = {"int": int, "bool": bool, "path": click.Path(path_type=Path), "str": str}


def _config_options(exclude: tuple[str, ...] = ()):
    """Decorate a command with one flag per :class:`Config` setting, help from its metadata."""

    def decorate(command):
        for field in reversed(attrs.fields(Config)):
            if field.name in exclude:
                continue
            flag = "--" + field.name.replace("_", "-")
            help_text = f"{field.metadata['help']} [env: {env_name(field)}]"
            if field.metadata["kind"] == "bool":
                command = click.option(
                    f"{flag}/--no-{flag[2:]}", field.name, default=None, help=help_text
                )(command)
            else:
                command = click.option(
                    flag,
                    field.name,
                    type=_FLAG_TYPES.get(field.metadata["kind"], str),
                    default=None,
                    help=help_text,
                )(command)
        return command

    return decorate


def _load(ctx: click.Context, overrides: dict[str, Any]) -> Config:
    try:
        return load_config(ctx.obj["config_path"], overrides={**ctx.obj["overrides"], **overrides})
    except FiccError as exc:
        raise click.ClickException(exc.message) from None


def _run(fn, *args: Any) -> Any:
    try:
        return trio.run(fn, *args)
    except FiccError as exc:
        raise click.ClickException(f"{exc.message} [{exc.code}]") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ficc")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML configuration file (keys are the setting names). [env: FICC_CONFIG]",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory for the database and blobs. [env: FICC_DATA_DIR]",
)
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, data_dir: Path | None) -> None:
    """FICC Inference: a control plane for self-hosted LLM inference."""
    ctx.obj = {"config_path": config_path, "overrides": {"data_dir": data_dir}}


@cli.command()
@_config_options(exclude=("data_dir",))
@click.option(
    "--demo",
    is_flag=True,
    help="Also register the SmolLM2 model, start a llama.cpp chat service on the embedded "
    "node and print an invoke token with curl and openai snippets (reused on later runs).",
)
@click.pass_context
def serve(ctx: click.Context, demo: bool, **flags: Any) -> None:
    """Run the controller: the HTTP API on hypercorn, until SIGINT or SIGTERM.

    On first start with an empty data directory it creates the project 'default',
    the administrator 'admin' and an admin bearer token, and writes them once to
    data_dir/first-run-secrets, readable only by this user (with first_run_secrets
    'stdout', prints them instead).
    """
    config = _load(ctx, flags)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if demo:
        from .demo import write_agent_settings

        if not config.embedded_agent:
            raise click.UsageError("--demo runs its service on the embedded agent")
        if config.agent_config is None:
            try:
                settings = write_agent_settings(config.data_dir)
            except FiccError as exc:
                raise click.ClickException(f"{exc.message} [{exc.code}]") from None
            config = attrs.evolve(config, agent_config=settings)
    _run(_serve, config, demo)


async def _serve(config: Config, demo: bool = False) -> None:
    from ..agent.embedded import run_embedded_agent
    from ..controller.server import run_until_signalled

    async with open_service(config, background=True) as service:
        first_run = await service.auth.bootstrap()
        if first_run and config.first_run_secrets == "file":
            from ..auth.first_run import write_first_run_secrets

            try:
                first_run["file"] = await trio.to_thread.run_sync(
                    write_first_run_secrets, config.data_dir, first_run
                )
            except OSError as exc:
                raise click.ClickException(
                    f"could not write the first-run secrets: {exc}; recover with "
                    "'ficc admin create-user NAME --admin' and 'ficc admin create-token'"
                ) from None

        async with trio.open_nursery() as nursery:

            def ready(urls: list[str], metrics_urls: list[str]) -> None:
                _print_ready(service, urls, first_run, metrics_urls)
                if demo:
                    nursery.start_soon(_demo, service, urls[0])

            if config.embedded_agent:
                await nursery.start(run_embedded_agent, service)
            await run_until_signalled(service, on_ready=ready)
            nursery.cancel_scope.cancel()
    click.echo("ficc: stopped", err=True)


async def _demo(service: Service, url: str) -> None:
    from .demo import run_demo

    try:
        await run_demo(service, url)
    except FiccError as exc:
        click.echo(f"demo: {exc.message} [{exc.code}]; the controller keeps serving", err=True)


_AGENT_DIR_HELP = "Agent state directory (keep it short). [env: FICC_AGENT_DIR]"
_AGENT_CONFIG_HELP = (
    "TOML file with the node's labels and installed runtimes. [env: FICC_AGENT_CONFIG]"
)


@cli.command()
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
    measured resources, checked runtimes), holds leases, and reconnects with
    backoff until SIGINT or SIGTERM.
    """
    config = _load(ctx, flags)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _run(_executor, config, controller, credential, providers)


_AGENT_DIR_HELP = "Agent state directory (keep it short). [env: FICC_AGENT_DIR]"
_AGENT_CONFIG_HELP = (
    "TOML file with the node's labels and installed runtimes. [env: FICC_AGENT_CONFIG]"
)


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

    executors = build_plugin_manager().executors  # one plugin set for the process

    def make_agent(node_id: str) -> Agent:
        agent = agent_from_config(config, executors, node_id=node_id, providers=providers)
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


def _print_ready(
    service: Service,
    urls: list[str],
    first_run: dict[str, Any] | None,
    metrics_urls: list[str],
) -> None:
    url = urls[0] if urls else "?"
    lines = [
        f"FICC {__version__} listening on {', '.join(urls)}",
        f"  data directory: {service.config.data_dir}",
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
    else:
        lines += [
            "  authenticate with 'Authorization: Bearer <token>'; to issue a token run:",
            "    ficc admin create-token --project default --all-scopes",
        ]
    click.echo("\n".join(lines), nl=True)
    sys.stdout.flush()


def _register_subcommands() -> None:
    from .inference import inference
    from .models import models
    from .plugins import plugins_command

    cli.add_command(plugins_command, "plugins")
    cli.add_command(models, "models")
    cli.add_command(inference, "inference")


_register_subcommands()


@cli.command("config")
@click.option("--reference", is_flag=True, help="Print the table of every setting instead.")
@click.pass_context
def config_command(ctx: click.Context, reference: bool) -> None:
    """Print the effective configuration as JSON (after file, environment and flags)."""
    if reference:
        click.echo(render_reference(), nl=False)
        return
    config = _load(ctx, {})
    document = {
        field.name: (str(value) if isinstance(value, Path) else value)
        for field in attrs.fields(Config)
        for value in [getattr(config, field.name)]
    }
    click.echo(json.dumps(document, indent=2, sort_keys=True))


# -- administration ----------------------------------------------------------------


@cli.group()
def admin() -> None:
    """Administer projects, users and credentials directly in the data directory.

    These commands open the database themselves, so they work with or without a
    running `ficc serve` (SQLite WAL allows both).
    """


async def _with_service(config: Config, fn) -> Any:
    async with open_service(config) as service:
        return await fn(service)


def _echo_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=True))


@admin.command("create-project")
@click.argument("name")
@click.pass_context
def create_project(ctx: click.Context, name: str) -> None:
    """Create a project NAME."""
    config = _load(ctx, {})
    _echo_json(_run(_with_service, config, lambda s: s.auth.create_project(name)))


@admin.command("list-projects")
@click.pass_context
def list_projects(ctx: click.Context) -> None:
    """List every project."""
    config = _load(ctx, {})
    _echo_json(_run(_with_service, config, lambda s: s.auth.list_projects()))


@admin.command("create-user")
@click.argument("username")
@click.option("--admin", "is_admin", is_flag=True, help="Administrator of the installation.")
@click.option("--project", "projects", multiple=True, help="Project (name or id) to join; repeat.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(PROJECT_SCOPES),
    help="Scope in each --project; repeat. Default: every project scope.",
)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.pass_context
def create_user(
    ctx: click.Context,
    username: str,
    is_admin: bool,
    projects: tuple[str, ...],
    scopes: tuple[str, ...],
    password_stdin: bool,
) -> None:
    """Create user USERNAME; without --password-stdin a password is generated and printed."""
    from ..auth.secrets import new_secret

    config = _load(ctx, {})
    password = sys.stdin.readline().rstrip("\n") if password_stdin else new_secret()[:24]
    grant = frozenset(scopes or PROJECT_SCOPES)
    user = _run(
        _with_service,
        config,
        lambda s: s.auth.create_user(
            username, password, admin=is_admin, projects={p: grant for p in projects}
        ),
    )
    _echo_json(user)
    if not password_stdin:
        click.echo(f"password (shown once): {password}")


@admin.command("create-token")
@click.option("--project", required=True, help="Project (name or id) the credential belongs to.")
@click.option("--name", default="cli", show_default=True, help="A label for the credential.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(ALL_SCOPES),
    help="Scope to grant; repeat.",
)
@click.option("--all-scopes", is_flag=True, help="Grant every scope, admin included.")
@click.option(
    "--expires-in",
    default=None,
    help="Lifetime, e.g. 3600, 12h, 30d. Default and maximum: token_max_lifetime.",
)
@click.pass_context
def create_token(
    ctx: click.Context,
    project: str,
    name: str,
    scopes: tuple[str, ...],
    all_scopes: bool,
    expires_in: str | None,
) -> None:
    """Create a bearer credential and print its token (shown only once)."""
    config = _load(ctx, {})
    granted = frozenset(ALL_SCOPES if all_scopes else scopes)
    if not granted:
        raise click.UsageError("give --scope at least once, or --all-scopes")
    try:
        lifetime = parse_duration(expires_in) if expires_in is not None else None
    except FiccError as exc:
        raise click.BadParameter(exc.message, param_hint="--expires-in") from None
    record, token = _run(
        _with_service,
        config,
        lambda s: s.auth.create_credential(project, name=name, scopes=granted, lifetime=lifetime),
    )
    _echo_json(record)
    click.echo(f"token (shown once): {token}")


@admin.command("list-tokens")
@click.option("--project", required=True, help="Project (name or id).")
@click.pass_context
def list_tokens(ctx: click.Context, project: str) -> None:
    """List a project's credentials (never their secrets)."""
    config = _load(ctx, {})

    async def read(service: Service) -> Any:
        found = await service.auth.get_project(project)
        return await service.auth.list_credentials(found["id"])

    _echo_json(_run(_with_service, config, read))


@admin.command("revoke-token")
@click.argument("credential_id")
@click.pass_context
def revoke_token(ctx: click.Context, credential_id: str) -> None:
    """Revoke the credential CREDENTIAL_ID."""
    config = _load(ctx, {})
    _echo_json(_run(_with_service, config, lambda s: s.auth.revoke_credential(None, credential_id)))


@admin.command("add-node")
@click.argument("name")
@click.option(
    "--label", "labels", multiple=True, help="A label KEY=VALUE recorded with the node; repeat."
)
@click.pass_context
def add_node(ctx: click.Context, name: str, labels: tuple[str, ...]) -> None:
    """Register contributor node NAME and print its node credential (shown only once).

    The credential can do nothing but connect as this node ('ficc executor').
    """
    config = _load(ctx, {})
    parsed = {}
    for label in labels:
        key, equals, value = label.partition("=")
        if not equals or not key:
            raise click.BadParameter(f"{label!r} is not KEY=VALUE", param_hint="--label")
        parsed[key] = value
    record, token = _run(
        _with_service, config, lambda s: s.contributors.add_node(name, labels=parsed)
    )
    _echo_json(record)
    click.echo(f"node credential (shown once): {token}")


@admin.command("revoke-node")
@click.argument("node_id")
@click.pass_context
def revoke_node(ctx: click.Context, node_id: str) -> None:
    """Revoke node NODE_ID's credential; its attempts become unknown."""
    config = _load(ctx, {})
    _echo_json(_run(_with_service, config, lambda s: s.contributors.revoke_node(node_id)))


@admin.command("list-nodes")
@click.pass_context
def list_nodes(ctx: click.Context) -> None:
    """List contributor nodes with their states (as GET /api/v1/contributors shows them)."""
    config = _load(ctx, {})
    _echo_json(_run(_with_service, config, lambda s: s.contributors.list()))


def main() -> None:
    """Entry point of the ``ficc`` script."""
    cli(prog_name="ficc")
