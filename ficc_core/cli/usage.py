"""``ficc usage``: requests, errors by code, tokens, spend and latency (GET /api/v1/usage).

Without ``--by`` one row of totals; with ``--by`` (repeatable, or comma-separated:
service, key, person, project, model) one row per group, its names beside its IDs,
then the totals. Spend is printed exactly, from the API's milli-units.
"""

from __future__ import annotations

from typing import Any

import click

from ..prices import units_text
from .client import client_from
from .output import echo_table, emit, json_option, when

GROUPS = ("service", "key", "person", "project", "model")


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
        "PROMPT",
        "COMPLETION",
        "SPEND",
        "P50",
        "P90",
        "P99",
        "TTFB P50",
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
    click.echo(f"from {since} to {until}", err=True)


@click.command("usage")
@click.option("--service", help="Only this service (ID or alias).")
@click.option("--key", help="Only this credential (ID).")
@click.option("--person", help="Only this person (user ID or username).")
@click.option("--project", help="Only this project (ID or name).")
@click.option("--model", help="Only this model (ID or name).")
@click.option("--period", help="day, month (UTC calendar) or a duration ending now (15m, 7d).")
@click.option("--since", type=float, help="From this time (seconds since the epoch).")
@click.option("--until", type=float, help="Until this time (seconds since the epoch).")
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
    groups = [part.strip() for value in group_by for part in value.split(",") if part.strip()]
    for name in groups:
        if name not in GROUPS:
            raise click.BadParameter(f"expected one of {', '.join(GROUPS)}", param_hint="--by")
    if groups:
        params["group_by"] = ",".join(groups)
    report = client_from(ctx).json("GET", "/api/v1/usage", params=params)
    emit(report, as_json, echo_report)
