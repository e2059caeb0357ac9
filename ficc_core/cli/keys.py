"""``ficc keys``: the project's keys (its bearer credentials) from the command line.

``ficc keys create NAME`` makes an application key (``POST /api/v1/tokens``), shown
once; by default a *lasting* one, which outlives the credential that made it (the
one ``ficc login --username`` stored: ``ficc logout`` does not revoke it), capped at
``token_max_lifetime``. ``ficc keys list`` lists the project's keys, whoever made
them; ``ficc keys revoke NAME`` revokes one by name or ID. Scope ``tokens:manage``.
"""

from __future__ import annotations

from typing import Any

import click

from ..auth.scopes import ALL_SCOPES
from .client import ApiError, client_from
from .inference_io import seconds
from .login import span
from .options import url_flag
from .output import echo_table, emit, hint, json_option, when


@click.group("keys")
def keys() -> None:
    """Make, list and revoke the project's keys (scope tokens:manage)."""


@keys.command("create")
@click.argument("name")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    type=click.Choice(ALL_SCOPES),
    help="A scope it holds (repeat); only scopes your credential holds.",
)
@click.option(
    "--lifetime",
    default="30d",
    show_default=True,
    help="How long it lives (e.g. 12h, 30d); capped at token_max_lifetime, and said so.",
)
@click.option("--band", help="Its priority band (default: the project's).")
@click.option(
    "--bound",
    is_flag=True,
    help="Bind it to the credential making it: revoked with it (and at ficc logout), "
    "expiring no later.",
)
@json_option
@click.pass_context
def create(
    ctx: click.Context,
    name: str,
    scopes: tuple[str, ...],
    lifetime: str,
    band: str | None,
    bound: bool,
    as_json: bool,
) -> None:
    """Make the application key NAME and print its token, shown only once.

    It is lasting unless --bound: 'ficc logout' does not revoke it. A lasting key is
    made only by a person's own credential (the one 'ficc login --username' stores);
    a credential minted by another needs --bound.
    """
    client = client_from(ctx)
    body: dict[str, Any] = {
        "name": name,
        "scopes": sorted(set(scopes)),
        "lifetime": seconds(lifetime, "--lifetime"),
        "lasting": not bound,
    }
    if band:
        body["band"] = band
    try:
        issued = client.json("POST", "/api/v1/tokens", json=body)
    except ApiError as exc:
        if exc.code != "lasting_needs_session":
            raise
        raise click.ClickException(
            "this credential cannot make a lasting key (another credential minted it): log in "
            "with 'ficc login --username', or give --bound for a key that ends with this "
            "credential [lasting_needs_session]"
        ) from None

    def human(document: dict[str, Any]) -> None:
        credential = document["credential"]
        click.echo(
            f"key {credential['name']} ({credential['id']}): {', '.join(credential['scopes'])};"
            f" expires {when(credential['expires_at'])}"
        )
        click.echo(f"token (shown once): {document['token']}")

    emit(issued, as_json, human)
    capped = issued["credential"].get("capped")
    if capped:
        why = (
            "the server's token_max_lifetime"
            if capped["by"] == "token_max_lifetime"
            else "the expiry of the credential that made it"
        )
        hint(f"note: --lifetime {lifetime} was capped to {span(capped['granted'])} by {why}")
    hint(
        "store the token now; revoke it with "
        f"'ficc keys revoke {issued['credential']['name']}{url_flag(client.url)}'"
    )


@keys.command("list")
@json_option
@click.pass_context
def list_keys(ctx: click.Context, as_json: bool) -> None:
    """List the project's keys, whoever made them (never their secrets)."""
    found = client_from(ctx).json("GET", "/api/v1/tokens")

    def human(document: dict[str, Any]) -> None:
        rows: list[tuple[Any, ...]] = [("ID", "NAME", "SCOPES", "EXPIRES", "LAST USED", "REVOKED")]
        rows += [
            (
                key["id"],
                key["name"],
                ",".join(key["scopes"]),
                when(key["expires_at"]),
                when(key.get("last_used_at")),
                when(key["revoked_at"]),
            )
            for key in document["tokens"]
        ]
        echo_table(rows)

    emit(found, as_json, human)


@keys.command("revoke")
@click.argument("key", metavar="KEY")
@json_option
@click.pass_context
def revoke(ctx: click.Context, key: str, as_json: bool) -> None:
    """Revoke KEY (its name or ID) and every key it made."""
    revoked = client_from(ctx).json("DELETE", f"/api/v1/tokens/{key}")

    def human(view: dict[str, Any]) -> None:
        also = f"; also revoked {', '.join(view['also_revoked'])}" if view["also_revoked"] else ""
        click.echo(f"revoked {view['id']} ({view['name']}){also}")

    emit(revoked, as_json, human)
