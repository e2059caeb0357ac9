"""``ficc admin set-limits`` and ``show-limits``: rate limits and budgets (docs/limits.md)."""

from __future__ import annotations

from typing import Any

import click

from ..api.views_limits import limits_view, subject
from ..base.errors import InvalidRequest
from ..controller.service import Service
from ..quotas.records import PERIODS
from .admin import _admin
from .output import echo_fields, emit, json_option

_SCOPE_OPTIONS = (
    click.option("--project", help="A project (name or id)."),
    click.option("--user", help="A person (id or username): all their keys."),
    click.option("--token", help="A credential (its ID or name)."),
)


def _scope_options(fn: Any) -> Any:
    for option in reversed(_SCOPE_OPTIONS):
        fn = option(fn)
    return fn


def _scope(project: str | None, user: str | None, token: str | None) -> tuple[str, str]:
    given = [(s, ref) for s, ref in (("project", project), ("user", user), ("credential", token))]
    chosen = [(scope, ref) for scope, ref in given if ref is not None]
    if len(chosen) != 1:
        raise click.UsageError("name one of --project, --user or --token")
    return chosen[0]


def _human(view: dict[str, Any]) -> None:
    limits, use = view["limits"], view["use"]

    def shown(value: Any) -> str:
        return "default" if value is None else ("none" if value == 0 else str(value))

    budget = (
        "-"
        if not limits["budget"]
        else f"{limits['budget']} per {limits['period']} (spent {use['spent']:g}, "
        f"{use['in_flight']:g} in flight)"
    )
    echo_fields(
        [
            (view["scope"], f"{view['name']} ({view['id']})"),
            ("rpm", f"{shown(limits['rpm'])} (this minute: {use['requests']})"),
            ("tpm", f"{shown(limits['tpm'])} (this minute: {use['tokens']})"),
            ("budget", budget),
        ]
    )


@click.command("set-limits")
@_scope_options
@click.option("--rpm", type=click.IntRange(min=0), help="Requests per minute (0: no limit).")
@click.option("--tpm", type=click.IntRange(min=0), help="Tokens per minute (0: no limit).")
@click.option("--budget", type=click.IntRange(min=0), help="Whole units per --period.")
@click.option("--period", type=click.Choice(PERIODS), help="What the budget renews over (UTC).")
@click.option("--clear", is_flag=True, help="Clear every limit first (the defaults apply).")
@json_option
@click.pass_context
def set_limits(
    ctx: click.Context,
    project: str | None,
    user: str | None,
    token: str | None,
    rpm: int | None,
    tpm: int | None,
    budget: int | None,
    period: str | None,
    clear: bool,
    as_json: bool,
) -> None:
    """Set the rate limits or budget of a project, a person or a credential.

    Limits not given stay as they are (--clear drops them all first). A running
    'ficc serve' applies them within limits_sync_interval. As PUT .../limits does.
    """
    scope, ref = _scope(project, user, token)
    change: dict[str, Any] = dict.fromkeys(("rpm", "tpm", "budget", "period")) if clear else {}
    given = {"rpm": rpm, "tpm": tpm, "budget": budget, "period": period}
    change.update({key: value for key, value in given.items() if value is not None})
    if not change:
        raise click.UsageError("give --rpm, --tpm, --budget with --period, or --clear")

    async def write(service: Service) -> dict[str, Any]:
        key, name = await subject(service, scope, ref)
        try:
            await service.quotas.set_limits(scope, key, change)
        except InvalidRequest as exc:
            problems = "; ".join(
                f"--{e['path'].removeprefix('$.')}: {e['message']}" for e in exc.details["errors"]
            )
            raise InvalidRequest(f"{exc.message}: {problems}", details=exc.details) from None
        return limits_view(service, scope, key, name)

    emit(_admin(ctx, write), as_json, _human)


@click.command("show-limits")
@_scope_options
@json_option
@click.pass_context
def show_limits(
    ctx: click.Context, project: str | None, user: str | None, token: str | None, as_json: bool
) -> None:
    """Show the limits of a project, a person or a credential and what it used (requests
    and tokens this minute, spend this period, as the serving processes last wrote)."""
    scope, ref = _scope(project, user, token)

    async def read(service: Service) -> dict[str, Any]:
        key, name = await subject(service, scope, ref)
        return limits_view(service, scope, key, name)

    emit(_admin(ctx, read), as_json, _human)
