"""``ficc inference events SERVICE``: what happened to a service, its replicas, attempts
and nodes; ``ficc inference show`` ends with the last few (:func:`print_recent_events`).

Events come from ``GET /api/v1/inference/{id}/events``, oldest first; ``--follow``
asks again with the cursor (``next_after``) until interrupted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import click

from .client import ApiClient, client_from
from .inference_io import BASE
from .output import echo_json, echo_table, when
from .resolve import resolve

#: How many events ``ficc inference show`` prints under the service.
RECENT = 5
HEADER = ("TIME", "KIND", "SUBJECT", "REASON", "MESSAGE")


def _rows(events: Sequence[Mapping[str, Any]], *, header: bool) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [HEADER] if header else []
    for event in events:
        rows.append(
            (
                when(event["at"]),
                event["kind"],
                event["subject_id"],
                event["reason"] or "-",
                event["message"] or "",
            )
        )
    return rows


def _page(client: ApiClient, service_id: str, **params: Any) -> dict[str, Any]:
    query = {name: value for name, value in params.items() if value is not None}
    return client.json("GET", f"{BASE}/{service_id}/events", params=query)


def print_recent_events(client: ApiClient, service_id: str, count: int = RECENT) -> None:
    """The service's last ``count`` events, under a blank line (``inference show``)."""
    events = _page(client, service_id, limit=count)["events"]
    click.echo("")
    if not events:
        click.echo("events: none yet")
        return
    click.echo(f"recent events (ficc inference events {service_id} for more):")
    echo_table(_rows(events, header=True))


@click.command("events")
@click.argument("service_id", metavar="SERVICE")
@click.option(
    "--limit",
    type=click.IntRange(1, 500),
    default=20,
    show_default=True,
    help="How many events (the newest, or the first after --after).",
)
@click.option("--after", type=click.IntRange(0), help="Only events after this event ID.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until interrupted.")
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 60),
    default=1.0,
    show_default=True,
    help="With --follow, seconds between checks for new events.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (with --follow: one event a line)."
)
@click.pass_context
def events(
    ctx: click.Context,
    service_id: str,
    limit: int,
    after: int | None,
    follow: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Show what happened to SERVICE (its ID or alias), oldest first.

    Every change of the service, its replicas and attempts, and of the nodes they
    ran on: what was asked, what was observed, why. Needs inference:read.
    """
    client = client_from(ctx)
    service_id = resolve(client, "inference", service_id)
    page = _page(client, service_id, after=after, limit=limit)
    if as_json and not follow:
        echo_json(page)
        return
    _print(page["events"], as_json=as_json, header=True)
    if not follow:
        return
    cursor = page["next_after"] or 0
    header = not page["events"]
    try:
        while True:
            time.sleep(interval)
            page = _page(client, service_id, after=cursor, limit=500)
            _print(page["events"], as_json=as_json, header=header)
            header = header and not page["events"]
            cursor = page["next_after"] or cursor
    except KeyboardInterrupt:
        return


def _print(events: Sequence[Mapping[str, Any]], *, as_json: bool, header: bool) -> None:
    if as_json:
        for event in events:
            click.echo(json.dumps(event, sort_keys=True))
        return
    if events:
        echo_table(_rows(events, header=header))
    elif header:
        click.echo("no events")
