"""``ficc admin users``: list accounts, approve signups, reset passwords (docs/people.md)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..api.views_auth import user_view
from .admin import _admin
from .output import echo_table, emit, json_option, when


@click.group("users")
def users() -> None:
    """Accounts: list them with their status, approve signups, reset passwords.

    Like every `ficc admin` command, these work straight in the data directory.
    """


@users.command("list")
@json_option
@click.pass_context
def list_users(ctx: click.Context, as_json: bool) -> None:
    """List every user with their status (active, or pending approval) and projects."""
    views = [user_view(u) for u in _admin(ctx, lambda s: s.auth.list_users())]

    def human(found: list[dict[str, Any]]) -> None:
        rows: list[tuple[Any, ...]] = [("ID", "USERNAME", "STATUS", "ADMIN", "PROJECTS", "CREATED")]
        rows += [
            (
                v["id"],
                v["username"],
                v["status"],
                "yes" if v["admin"] else "-",
                ",".join(m["project_id"] for m in v["projects"]) or "-",
                when(v["created_at"]),
            )
            for v in found
        ]
        echo_table(rows)

    emit(views, as_json, human)


@users.command("approve")
@click.argument("user")
@json_option
@click.pass_context
def approve(ctx: click.Context, user: str, as_json: bool) -> None:
    """Activate the pending account USER (a username or user ID)."""
    view = user_view(_admin(ctx, lambda s: s.auth.people.approve(user)))
    emit(view, as_json, lambda v: click.echo(f"user {v['username']} ({v['id']}) is {v['status']}"))


@users.command("reset-password")
@click.argument("user")
@click.option("--password-stdin", is_flag=True, help="Read the new password from standard input.")
@json_option
@click.pass_context
def reset_password(ctx: click.Context, user: str, password_stdin: bool, as_json: bool) -> None:
    """Set USER's password (asked for twice without --password-stdin) and end their
    browser sessions."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("New password", hide_input=True, confirmation_prompt=True)
    found, ended = _admin(ctx, lambda s: s.auth.people.reset_password(user, password))
    document = {**user_view(found), "sessions_ended": ended}

    def human(doc: dict[str, Any]) -> None:
        click.echo(
            f"password of {doc['username']} ({doc['id']}) replaced; "
            f"{doc['sessions_ended']} browser session(s) ended"
        )

    emit(document, as_json, human)
