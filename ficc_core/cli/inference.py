"""``ficc inference ...``: managed inference services from the command line, through the API.

Every command talks to ``/api/v1/inference`` of the controller ``ficc login`` stored
(or ``--url``/``FICC_URL`` with ``--token``/``FICC_TOKEN``); a service is named by its
ID or its alias (:func:`~.resolve.resolve`). Control commands read the service's current revision
first unless ``--revision`` names one, and ``--wait`` follows the service to the
state the action rests in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .chat import chat
from .client import ApiClient, ApiError, client_from
from .inference_control import COMMANDS
from .inference_create import create
from .inference_events import events, print_recent_events
from .inference_io import (
    BASE,
    SPEC_FILE,
    echo_plan,
    echo_reservations,
    echo_service,
    read_spec,
    refusals,
    seconds,
)
from .inference_logs import logs
from .inference_ops import COMMANDS as OPERATIONS
from .inference_scaling import COMMANDS as SCALING
from .inference_scaling import scaling_cell, scaling_lines
from .inference_status import echo_replicas, fetch_status
from .options import url_flag
from .output import echo_json, echo_table, json_option, when
from .resolve import resolve

# -- the group -------------------------------------------------------------------------------


@click.group()
def inference() -> None:
    """Preview, create, start, drain, stop, replace, pin and remove managed inference services.

    Reading needs inference:read; preview inference:manage; create, replace and
    start also jobs:execute, contributors:read and models:read; drain, stop and
    remove jobs:cancel; tokens inference:manage, inference:invoke and tokens:manage;
    chat inference:invoke.
    """


@inference.command("preview")
@click.argument("spec_file", type=SPEC_FILE)
@json_option
@click.pass_context
def preview(ctx: click.Context, spec_file: Path, as_json: bool) -> None:
    """Show SPEC_FILE's placement and why any replica does not fit.

    SPEC_FILE is a JSON or TOML specification (`-`: JSON on standard input).
    Nothing is written. The exit status is 1 when some replica does not fit.
    """
    document = read_spec(spec_file)
    result = refusals(lambda: client_from(ctx).json("POST", f"{BASE}/preview", json=document))
    if as_json:
        echo_json(result)
    else:
        echo_plan(result)
    if not result["fits"]:
        ctx.exit(1)


@inference.command("show")
@click.argument("service_id", metavar="SERVICE")
@json_option
@click.pass_context
def show(ctx: click.Context, service_id: str, as_json: bool) -> None:
    """Show a service (its ID or alias): specification, state, each replica's status.

    A replica's row: its state, node, attempt, engine PID, restarts in this
    generation, last exit, the readiness probe's last answer and the requests in
    flight. With --json: the service, its status under "status".
    """
    client = client_from(ctx)
    service_id = resolve(client, "inference", service_id)
    view = client.json("GET", f"{BASE}/{service_id}")
    status = fetch_status(client, service_id)
    if as_json:
        echo_json({**view, "status": status})
    else:
        echo_service(view)
        for line in scaling_lines(view):
            click.echo(line)
        click.echo("")
        echo_replicas(view, status)
        click.echo("")
        echo_reservations(view)
        print_recent_events(client, view["id"])


def model_names(client: ApiClient) -> dict[str, str]:
    """The project's models' names by ID; none for a credential that may not read models."""
    try:
        models = client.json("GET", "/api/v1/models")["models"]
    except ApiError as exc:
        if exc.code != "missing_scope":
            raise
        return {}
    return {model["id"]: model["name"] for model in models if model.get("name")}


@inference.command("list")
@json_option
@click.pass_context
def list_services(ctx: click.Context, as_json: bool) -> None:
    """List the project's services.

    MODEL is the model's name (its ID where the credential may not read models; --json
    has the service's model_id). READY counts the replicas that serve (take the
    service's requests now, as its state counts them) of the service's placements.
    """
    client = client_from(ctx)
    found = client.json("GET", BASE)
    if as_json:
        echo_json(found)
        return
    names = model_names(client) if found["services"] else {}
    rows: list[tuple[Any, ...]] = [
        (
            "ID",
            "ALIAS",
            "MODEL",
            "ENGINE",
            "STATE",
            "DESIRED",
            "READY",
            "REVISION",
            "GENERATION",
            "SCALING",
        )
    ]
    for view in found["services"]:
        # What serves (a controller without ``serving``: the replicas in state ready).
        ready = sum(
            1 for replica in view["replicas"] if replica.get("serving", replica["state"] == "ready")
        )
        rows.append(
            (
                view["id"],
                view["alias"],
                names.get(view["model_id"], view["model_id"]),
                view["engine"],
                view["state"],
                view["desired"],
                f"{ready}/{len(view['replicas'])}",
                view["revision"],
                view["generation"],
                scaling_cell(view),
            )
        )
    echo_table(rows)


for _command in (*COMMANDS, chat, logs):
    inference.add_command(_command)
inference.add_command(create)
for _operation in OPERATIONS:  # restart, move, bulk-move, rollout
    inference.add_command(_operation)
inference.add_command(events)
for _scaling in SCALING:  # pin, unpin
    inference.add_command(_scaling)


# -- invoke tokens ---------------------------------------------------------------------------


@inference.command("token")
@click.argument("service_id", metavar="SERVICE")
@click.option("--lifetime", help="Issue a token living this long (e.g. 30s, 10m, 12h, 1d).")
@click.option(
    "--name",
    help="The issued token's name, unique among the project's live credentials "
    "[default: invoke-ALIAS, -2, -3... when taken].",
)
@click.option("--band", help="The issued token's priority band (default: the project's).")
@click.option("--list", "list_them", is_flag=True, help="List the service's invoke tokens.")
@click.option(
    "--revoke", "revoke_id", metavar="TOKEN", help="Revoke this invoke token (its ID or name)."
)
@json_option
@click.pass_context
def token(
    ctx: click.Context,
    service_id: str,
    lifetime: str | None,
    name: str | None,
    band: str | None,
    list_them: bool,
    revoke_id: str | None,
    as_json: bool,
) -> None:
    """Issue, list or revoke a service's invoke tokens.

    --lifetime issues one, --list lists them, --revoke TOKEN (ID or name) revokes one.

    An issued token calls only this service's OpenAI-compatible routes; it is
    shown once.
    """
    if sum((lifetime is not None, list_them, revoke_id is not None)) != 1:
        raise click.UsageError("give exactly one of --lifetime DURATION, --list or --revoke ID")
    client = client_from(ctx)
    service_id = resolve(client, "inference", service_id)
    path = f"{BASE}/{service_id}/tokens"
    if list_them:
        found = client.json("GET", path)
        if as_json:
            echo_json(found)
            return
        rows: list[tuple[Any, ...]] = [("ID", "NAME", "CREATED", "EXPIRES", "REVOKED")]
        for credential in found["tokens"]:
            rows.append(
                (
                    credential["id"],
                    credential["name"],
                    when(credential["created_at"]),
                    when(credential["expires_at"]),
                    when(credential["revoked_at"]),
                )
            )
        echo_table(rows)
        return
    if revoke_id is not None:
        revoked = client.json("DELETE", f"{path}/{revoke_id}")
        if as_json:
            echo_json(revoked)
        else:
            click.echo(f"revoked {revoked['id']} ({revoked['name']})")
        return
    assert lifetime is not None
    body: dict[str, Any] = {"lifetime": seconds(lifetime, "--lifetime")}
    if name:
        body["name"] = name
    if band:
        body["band"] = band
    issued = client.json("POST", path, json=body)
    if as_json:
        echo_json(issued)
    else:
        credential = issued["credential"]
        click.echo(
            f"credential: {credential['id']} ({credential['name']}), expires "
            f"{when(credential['expires_at'])}"
        )
        click.echo(f"token: {issued['token']}")
    click.echo(
        "warning: the token is shown only once; store it now (revoke it with "
        f"'ficc inference token {service_id} --revoke {issued['credential']['name']}"
        f"{url_flag(client.url)}')",
        err=True,
    )
