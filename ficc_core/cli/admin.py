"""``ficc admin``: projects, users, credentials and nodes, straight in the data directory."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click

from ..api.views_auth import (
    credential_view,
    issued_view,
    project_view,
    revocation_view,
    user_view,
)
from ..api.views_contributors import node_view, removal_view
from ..auth import ALL_SCOPES, PROJECT_SCOPES
from ..base.errors import FiccError
from ..config import parse_duration
from ..controller.service import Service, open_service
from ..store import is_postgres_url
from .options import data_dir_flag
from .output import echo_table, emit, json_option, when
from .settings import load_settings, run_trio


@click.group()
def admin() -> None:
    """Administer projects, users and credentials directly in the data directory.

    These commands open the database themselves, so they work with or without a
    running `ficc serve` (SQLite WAL allows both). They never create one: the data
    directory (--data-dir, FICC_DATA_DIR or the configuration file) must hold the
    database `ficc serve` made there.
    """


def _admin(ctx: click.Context, fn: Callable[[Service], Awaitable[Any]]) -> Any:
    """Run ``fn`` on the service of the invocation's data directory, which must exist.

    A refusal names the data directory, so an operator who meant another one sees it.
    """
    config = load_settings(ctx, {})
    database = config.database_path
    if not is_postgres_url(config.database_url) and not database.is_file():
        raise click.ClickException(
            f"no FICC database at {database}; admin commands do not create one. Name the "
            f"data directory 'ficc serve' uses with --data-dir (or FICC_DATA_DIR), or start "
            f"'ficc serve{data_dir_flag(config)}' once to create it [no_database]"
        )

    async def run() -> Any:
        async with open_service(config) as service:
            return await fn(service)

    try:
        return run_trio(run)
    except click.ClickException as exc:
        # click's stubs mark message Final; rewording it keeps the exception's class and
        # exit code, which a new exception would not.
        exc.message = f"{exc.message} (data directory {config.data_dir})"  # type: ignore[misc]
        raise


@admin.command("create-project")
@click.argument("name")
@json_option
@click.pass_context
def create_project(ctx: click.Context, name: str, as_json: bool) -> None:
    """Create a project NAME."""
    view = project_view(_admin(ctx, lambda s: s.auth.create_project(name)))
    emit(view, as_json, lambda p: click.echo(f"created project {p['name']} ({p['id']})"))


@admin.command("list-projects")
@json_option
@click.pass_context
def list_projects(ctx: click.Context, as_json: bool) -> None:
    """List every project."""
    views = [project_view(p) for p in _admin(ctx, lambda s: s.auth.list_projects())]
    rows = [("ID", "NAME", "BAND", "CREATED")]
    emit(views, as_json, lambda ps: echo_table(rows + [_project_row(p) for p in ps]))


def _project_row(project: dict[str, Any]) -> tuple[Any, ...]:
    return (project["id"], project["name"], project["band"] or "-", when(project["created_at"]))


@admin.command("set-project-band")
@click.argument("project")
@click.argument("band", required=False)
@click.option("--clear", is_flag=True, help="Remove the project's band (band_default applies).")
@json_option
@click.pass_context
def set_project_band(
    ctx: click.Context, project: str, band: str | None, clear: bool, as_json: bool
) -> None:
    """Set the priority band of PROJECT's credentials that name none (docs/priority.md).

    BAND is one of the bands setting's; --clear removes it.
    """
    if (band is None) != clear:
        raise click.UsageError("give a BAND, or --clear")
    view = project_view(_admin(ctx, lambda s: s.auth.set_project_band(project, band)))

    def human(p: dict[str, Any]) -> None:
        click.echo(f"project {p['name']} ({p['id']}): band {p['band'] or 'unset (band_default)'}")

    emit(view, as_json, human)


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
@json_option
@click.pass_context
def create_user(
    ctx: click.Context,
    username: str,
    is_admin: bool,
    projects: tuple[str, ...],
    scopes: tuple[str, ...],
    password_stdin: bool,
    as_json: bool,
) -> None:
    """Create user USERNAME; without --password-stdin a password is generated and printed.

    --json prints {"user": ..., "password": ...} (the password null when read from stdin).
    """
    from ..auth.secrets import new_secret

    password = sys.stdin.readline().rstrip("\n") if password_stdin else new_secret()[:24]
    grant = frozenset(scopes or PROJECT_SCOPES)
    user = _admin(
        ctx,
        lambda s: s.auth.create_user(
            username, password, admin=is_admin, projects={p: grant for p in projects}
        ),
    )
    document = {"user": user_view(user), "password": None if password_stdin else password}

    def human(doc: dict[str, Any]) -> None:
        view = doc["user"]
        role = "administrator" if view["admin"] else "user"
        joined = ", ".join(m["project_id"] for m in view["projects"]) or "no project"
        click.echo(f"created {role} {view['username']} ({view['id']}) in {joined}")
        if doc["password"]:
            click.echo(f"password (shown once): {doc['password']}")

    emit(document, as_json, human)


@admin.command("create-token")
@click.option("--project", required=True, help="Project (name or id) the credential belongs to.")
@click.option(
    "--name",
    help="Its name, unique among the project's live credentials [default: cli, or cli-2, "
    "cli-3... when taken].",
)
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
@click.option("--band", default=None, help="Priority band (default: the project's band).")
@json_option
@click.pass_context
def create_token(
    ctx: click.Context,
    project: str,
    name: str | None,
    scopes: tuple[str, ...],
    all_scopes: bool,
    expires_in: str | None,
    band: str | None,
    as_json: bool,
) -> None:
    """Create a bearer credential and print its token (shown only once).

    --json prints {"credential": ..., "token": ...}, as POST /api/v1/tokens answers.
    """
    granted = frozenset(ALL_SCOPES if all_scopes else scopes)
    if not granted:
        raise click.UsageError("give --scope at least once, or --all-scopes")
    try:
        lifetime = parse_duration(expires_in) if expires_in is not None else None
    except FiccError as exc:
        raise click.BadParameter(exc.message, param_hint="--expires-in") from None
    record, token = _admin(
        ctx,
        lambda s: s.auth.create_credential(
            project,
            name=name or "cli",
            generated_name=name is None,
            scopes=granted,
            lifetime=lifetime,
            band=band,
        ),
    )

    def human(doc: dict[str, Any]) -> None:
        credential = doc["credential"]
        band_text = f"; band {credential['band']}" if credential["band"] else ""
        click.echo(
            f"credential {credential['id']} ({credential['name']}): "
            f"{', '.join(credential['scopes'])}; expires {when(credential['expires_at'])}"
            f"{band_text}"
        )
        click.echo(f"token (shown once): {doc['token']}")

    emit(issued_view(record, token), as_json, human)


@admin.command("list-tokens")
@click.option("--project", required=True, help="Project (name or id).")
@json_option
@click.pass_context
def list_tokens(ctx: click.Context, project: str, as_json: bool) -> None:
    """List a project's credentials (never their secrets)."""

    async def read(service: Service) -> Any:
        found = await service.auth.get_project(project)
        return [credential_view(c) for c in await service.auth.list_credentials(found.id)]

    def human(views: list[dict[str, Any]]) -> None:
        rows: list[tuple[Any, ...]] = [("ID", "NAME", "SCOPES", "BAND", "EXPIRES", "REVOKED")]
        rows += [
            (
                view["id"],
                view["name"],
                ",".join(view["scopes"]),
                view["band"] or "-",
                when(view["expires_at"]),
                when(view["revoked_at"]),
            )
            for view in views
        ]
        echo_table(rows)

    emit(_admin(ctx, read), as_json, human)


@admin.command("revoke-token")
@click.argument("credential_id", metavar="CREDENTIAL")
@click.option("--project", help="The project whose credential CREDENTIAL names (name or id).")
@json_option
@click.pass_context
def revoke_token(
    ctx: click.Context, credential_id: str, project: str | None, as_json: bool
) -> None:
    """Revoke the credential CREDENTIAL, its ID or name (and what it minted).

    A name is unique among a project's live credentials; one that several projects
    use needs --project (or the ID).
    """

    async def revoke(service: Service) -> Any:
        project_id = None if project is None else (await service.auth.get_project(project)).id
        return await service.auth.revoke_credential(project_id, credential_id)

    revocation = _admin(ctx, revoke)

    def human(view: dict[str, Any]) -> None:
        also = f"; also revoked {', '.join(view['also_revoked'])}" if view["also_revoked"] else ""
        click.echo(f"revoked {view['id']} ({view['name']}){also}")

    emit(revocation_view(revocation), as_json, human)


@admin.command("add-node")
@click.argument("name")
@click.option(
    "--label", "labels", multiple=True, help="A label KEY=VALUE recorded with the node; repeat."
)
@json_option
@click.pass_context
def add_node(ctx: click.Context, name: str, labels: tuple[str, ...], as_json: bool) -> None:
    """Register contributor node NAME and print its node credential (shown only once).

    The credential can do nothing but connect as this node ('ficc executor').
    --json prints {"node": ..., "credential": ...}.
    """
    parsed = {}
    for label in labels:
        key, equals, value = label.partition("=")
        if not equals or not key:
            raise click.BadParameter(f"{label!r} is not KEY=VALUE", param_hint="--label")
        parsed[key] = value
    record, token = _admin(ctx, lambda s: s.contributors.add_node(name, labels=parsed))

    def human(doc: dict[str, Any]) -> None:
        click.echo(f"registered node {doc['node']['name']} ({doc['node']['id']})")
        click.echo(f"node credential (shown once): {doc['credential']}")

    emit({"node": node_view(record), "credential": token}, as_json, human)


def _echo_nodes(views: list[dict[str, Any]]) -> None:
    rows: list[tuple[Any, ...]] = [("ID", "NAME", "STATE", "LAST HEARTBEAT", "REVOKED")]
    rows += [
        (v["id"], v["name"], v["state"], when(v["last_heartbeat"]), when(v["revoked_at"]))
        for v in views
    ]
    echo_table(rows)


@admin.command("revoke-node")
@click.argument("node_id")
@json_option
@click.pass_context
def revoke_node(ctx: click.Context, node_id: str, as_json: bool) -> None:
    """Revoke node NODE_ID's credential; its attempts become unknown."""
    revoked = _admin(ctx, lambda s: s.contributors.revoke_node(node_id))
    emit(node_view(revoked), as_json, lambda v: _echo_nodes([v]))


@admin.command("remove-node")
@click.argument("node_id")
@json_option
@click.pass_context
def remove_node(ctx: click.Context, node_id: str, as_json: bool) -> None:
    """Remove node NODE_ID for good: a lost, revoked or never-connected one.

    Its record, credential, assignments and reported attempts go; the name can be
    added again. Refused while the node is connected or unreachable, or while a
    service places a replica there or has an attempt there not released (move or
    remove those first). As DELETE /api/v1/contributors/{id} does.
    """
    view = removal_view(_admin(ctx, lambda s: s.contributors.remove_node(node_id)))
    emit(view, as_json, lambda v: click.echo(f"removed node {v['name']} (it was {v['state']})"))


@admin.command("list-nodes")
@json_option
@click.pass_context
def list_nodes(ctx: click.Context, as_json: bool) -> None:
    """List contributor nodes with their states (as GET /api/v1/contributors shows them)."""
    nodes = _admin(ctx, lambda s: s.contributors.list())
    emit([node_view(node) for node in nodes], as_json, _echo_nodes)
