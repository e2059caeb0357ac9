"""``ficc usage``: requests, errors by code, tokens, spend and latency (GET /api/v1/usage).

Without ``--by`` one row of totals; with ``--by`` (repeatable, or comma-separated:
service, key, person, project, model) one row per group, its names beside its IDs,
then the totals. Every column says its unit: tokens, spend in the price units of the
``pricing`` setting (printed exactly, from the API's milli-units), latency in
seconds. ``--since`` and ``--until`` take a time (:data:`TIME`): seconds since the
epoch, an ISO 8601 date or date and time, or a duration ago.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

import click

from ..config import parse_duration
from ..config.prices import units_text
from .client import client_from
from .output import echo_table, emit, json_option, when
from .resolve import resolve_credential

GROUPS = ("service", "key", "person", "project", "model")

_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)?\s*$")
_AGO = re.compile(r"^\s*\d+(?:\.\d+)?\s*(?:ms|s|m|h|d)\s*$")


class _Time(click.ParamType):
    """A point in time as seconds since the epoch: ``1765000000`` (epoch seconds as they
    are), ``2026-12-01`` or ``2026-12-01T09:30`` (ISO 8601; UTC unless it says its
    offset, as in ``2026-12-01T09:30:00+01:00`` or ``...Z``), or ``2h``, ``7d``, ``15m``
    (that long before now)."""

    name = "TIME"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value)
        if _NUMBER.match(text):
            return float(text)
        if _AGO.match(text):
            return time.time() - parse_duration(text)
        try:
            moment = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            self.fail(
                f"{text!r} is not a time: give an ISO 8601 date or date and time "
                "(2026-12-01, 2026-12-01T09:30Z), a duration ago (2h, 7d) or seconds since "
                "the epoch",
                param,
                ctx,
            )
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return moment.timestamp()


#: ``--since``/``--until``'s type (:class:`_Time`).
TIME = _Time()


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _errors(group: dict[str, Any]) -> str:
    by_code = group["errors_by_code"]
    return ", ".join(f"{code} {count}" for code, count in by_code.items()) or "-"


def _named(value: dict[str, Any] | None) -> str:
    if value is None or value["id"] in (None, ""):
        return "-"
    return value["id"] if value["name"] is None else f"{value['name']} ({value['id']})"


def echo_report(report: dict[str, Any]) -> None:
    """The groups (or totals) table, then the selection's period."""
    groups: list[str] = report["group_by"]
    header = (
        *(name.upper() for name in groups),
        "REQUESTS",
        "ERRORS",
        "PROMPT TOKENS",
        "COMPLETION TOKENS",
        "SPEND (UNITS)",
        "P50 (S)",
        "P90 (S)",
        "P99 (S)",
        "TTFB P50 (S)",
        "BY CODE",
    )
    rows: list[tuple[Any, ...]] = [header]
    listed = [*report["groups"], report["totals"]] if groups else [report["totals"]]
    for index, group in enumerate(listed):
        total = groups and index == len(listed) - 1
        duration, ttfb = group["latency"]["duration"], group["latency"]["ttfb"]
        rows.append(
            (
                *(
                    ("total" if i == 0 else "") if total else _named(group[name])
                    for i, name in enumerate(groups)
                ),
                group["requests"],
                group["errors"],
                group["prompt_tokens"],
                group["completion_tokens"],
                units_text(group["spend_milli"]),
                _seconds(duration["p50"]),
                _seconds(duration["p90"]),
                _seconds(duration["p99"]),
                _seconds(ttfb["p50"]),
                _errors(group),
            )
        )
    echo_table(rows)
    until = "now" if report["until"] is None else when(report["until"])
    since = "the start" if report["since"] is None else when(report["since"])
    click.echo(
        f"from {since} to {until}; latency in seconds, spend in the pricing setting's units",
        err=True,
    )


@click.command("usage")
@click.option("--service", help="Only this service (ID or alias).")
@click.option("--key", help="Only this credential (ID or name).")
@click.option("--person", help="Only this person (user ID or username).")
@click.option("--project", help="Only this project (ID or name).")
@click.option("--model", help="Only this model (ID or name).")
@click.option("--period", help="day, month (UTC calendar) or a duration ending now (15m, 7d).")
@click.option(
    "--since",
    type=TIME,
    help="From this time: an ISO 8601 date or time (2026-12-01, 2026-12-01T09:30Z; UTC "
    "unless it says), a duration ago (2h, 7d) or seconds since the epoch.",
)
@click.option("--until", type=TIME, help="Until this time (as --since).")
@click.option(
    "--by",
    "group_by",
    multiple=True,
    help=f"Group by {', '.join(GROUPS)} (repeat, or separate with commas).",
)
@json_option
@click.pass_context
def usage(ctx: click.Context, group_by: tuple[str, ...], as_json: bool, **filters: Any) -> None:
    """Show what inference requests used: requests, errors by code, tokens, spend, latency."""
    params = {name: value for name, value in filters.items() if value is not None}
    client = client_from(ctx)
    if "key" in params:
        params["key"] = resolve_credential(client, params["key"])
    groups = [part.strip() for value in group_by for part in value.split(",") if part.strip()]
    for name in groups:
        if name not in GROUPS:
            raise click.BadParameter(f"expected one of {', '.join(GROUPS)}", param_hint="--by")
    if groups:
        params["group_by"] = ",".join(groups)
    report = client.json("GET", "/api/v1/usage", params=params)
    emit(report, as_json, echo_report)
