"""``ficc admin``: projects, users, credentials and nodes, straight in the data directory."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..api.views_auth import credential_view, project_view, revocation_view, user_view
from ..api.views_contributors import node_view
from ..auth import ALL_SCOPES, PROJECT_SCOPES
from ..config import Config, parse_duration
from ..controller.service import Service, open_service
from ..errors import FiccError
from .client import echo_json
from .settings import load_settings, run_trio


@click.group()
def admin() -> None:
    """Administer projects, users and credentials directly in the data directory.

    These commands open the database themselves, so they work with or without a
    running `ficc serve` (SQLite WAL allows both).
    """


async def _with_service(config: Config, fn) -> Any:
    async with open_service(config) as service:
        return await fn(service)


@admin.command("create-project")
@click.argument("name")
@click.pass_context
def create_project(ctx: click.Context, name: str) -> None:
    """Create a project NAME."""
    config = load_settings(ctx, {})
    echo_json(project_view(run_trio(_with_service, config, lambda s: s.auth.create_project(name))))


@admin.command("list-projects")
@click.pass_context
def list_projects(ctx: click.Context) -> None:
    """List every project."""
    config = load_settings(ctx, {})
    projects = run_trio(_with_service, config, lambda s: s.auth.list_projects())
    echo_json([project_view(project) for project in projects])


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

    config = load_settings(ctx, {})
    password = sys.stdin.readline().rstrip("\n") if password_stdin else new_secret()[:24]
    grant = frozenset(scopes or PROJECT_SCOPES)
    user = run_trio(
        _with_service,
        config,
        lambda s: s.auth.create_user(
            username, password, admin=is_admin, projects={p: grant for p in projects}
        ),
    )
    echo_json(user_view(user))
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
    config = load_settings(ctx, {})
    granted = frozenset(ALL_SCOPES if all_scopes else scopes)
    if not granted:
        raise click.UsageError("give --scope at least once, or --all-scopes")
    try:
        lifetime = parse_duration(expires_in) if expires_in is not None else None
    except FiccError as exc:
        raise click.BadParameter(exc.message, param_hint="--expires-in") from None
    record, token = run_trio(
        _with_service,
        config,
        lambda s: s.auth.create_credential(project, name=name, scopes=granted, lifetime=lifetime),
    )
    echo_json(credential_view(record))
    click.echo(f"token (shown once): {token}")


@admin.command("list-tokens")
@click.option("--project", required=True, help="Project (name or id).")
@click.pass_context
def list_tokens(ctx: click.Context, project: str) -> None:
    """List a project's credentials (never their secrets)."""
    config = load_settings(ctx, {})

    async def read(service: Service) -> Any:
        found = await service.auth.get_project(project)
        return [credential_view(c) for c in await service.auth.list_credentials(found.id)]

    echo_json(run_trio(_with_service, config, read))


@admin.command("revoke-token")
@click.argument("credential_id")
@click.pass_context
def revoke_token(ctx: click.Context, credential_id: str) -> None:
    """Revoke the credential CREDENTIAL_ID."""
    config = load_settings(ctx, {})
    revocation = run_trio(
        _with_service, config, lambda s: s.auth.revoke_credential(None, credential_id)
    )
    echo_json(revocation_view(revocation))


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
    config = load_settings(ctx, {})
    parsed = {}
    for label in labels:
        key, equals, value = label.partition("=")
        if not equals or not key:
            raise click.BadParameter(f"{label!r} is not KEY=VALUE", param_hint="--label")
        parsed[key] = value
    record, token = run_trio(
        _with_service, config, lambda s: s.contributors.add_node(name, labels=parsed)
    )
    echo_json(node_view(record))
    click.echo(f"node credential (shown once): {token}")


@admin.command("revoke-node")
@click.argument("node_id")
@click.pass_context
def revoke_node(ctx: click.Context, node_id: str) -> None:
    """Revoke node NODE_ID's credential; its attempts become unknown."""
    config = load_settings(ctx, {})
    revoked = run_trio(_with_service, config, lambda s: s.contributors.revoke_node(node_id))
    echo_json(node_view(revoked))


@admin.command("list-nodes")
@click.pass_context
def list_nodes(ctx: click.Context) -> None:
    """List contributor nodes with their states (as GET /api/v1/contributors shows them)."""
    config = load_settings(ctx, {})
    nodes = run_trio(_with_service, config, lambda s: s.contributors.list())
    echo_json([node_view(node) for node in nodes])
