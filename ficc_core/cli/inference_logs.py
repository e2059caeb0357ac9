"""``ficc inference logs SERVICE``: a replica's engine log, its last lines or followed live.

Without ``-f`` it prints the last ``--tail`` lines of the replica's latest attempt
(``GET .../replicas/{n}/logs``). With ``-f`` it mints a single-use ticket (``POST
.../logs/ticket``, with the credential in its header) and follows the live stream the
ticket opens (``GET .../logs/stream?ticket=...``) until the attempt ends or Ctrl-C:
the credential itself never goes into a URL.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import click
import httpx

from .client import ApiClient, client_from
from .inference_io import BASE
from .resolve import resolve


def _events(response: httpx.Response) -> Iterator[tuple[str, str]]:
    """``(event, data)`` of each event of a stream (``data`` for plain ones); comments
    (the keepalives) are skipped."""
    event, data = "", []
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and data:
            yield event or "data", "\n".join(data)
            event, data = "", []


def _follow(client: ApiClient, path: str, tail: int) -> None:
    ticket = client.json("POST", f"{path}/ticket")["ticket"]
    # Keepalives arrive every log_keepalive seconds; a quiet log is no read timeout.
    timeout = httpx.Timeout(30.0, read=None)
    with client.stream(
        "GET", f"{path}/stream", params={"ticket": ticket, "tail": tail}, timeout=timeout
    ) as response:
        for event, data in _events(response):
            if event == "data":
                click.echo(data)
            elif event == "end":
                attempt = json.loads(data).get("attempt_id", "")
                click.echo(f"ficc: the attempt ended ({attempt}); the log is complete", err=True)
                return
            elif event == "error":
                error = json.loads(data).get("error", {})
                raise click.ClickException(
                    f"{error.get('message', 'the log stream failed')} [{error.get('code')}]"
                )
    raise click.ClickException("the log stream closed before the attempt ended")


@click.command("logs")
@click.argument("service_id", metavar="SERVICE")
@click.option(
    "--replica",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Which replica (its index in the specification's placements).",
)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing new lines until the attempt ends (or Ctrl-C).",
)
@click.option(
    "--tail",
    type=click.IntRange(0, 1000),
    default=100,
    show_default=True,
    help="How many of the last lines to print first (1 to 1000; 0 with -f).",
)
@click.pass_context
def logs(ctx: click.Context, service_id: str, replica: int, follow: bool, tail: int) -> None:
    """Print the engine log of a service's replica (SERVICE: its ID or alias).

    The log of the replica's latest attempt, read from its node; it stays readable
    after the attempt ended. Needs inference:read.
    """
    client = client_from(ctx)
    path = f"{BASE}/{resolve(client, 'inference', service_id)}/replicas/{replica}/logs"
    if not follow:
        if tail == 0:
            raise click.BadParameter("must be at least 1 without -f", param_hint="--tail")
        found = client.json("GET", path, params={"tail": tail})
        click.echo(
            f"ficc: replica {replica}, attempt {found['attempt_id']} ({found['attempt_state']}) "
            f"on node {found['node_id']}",
            err=True,
        )
        for line in found["lines"]:
            click.echo(line)
        return
    try:
        _follow(client, path, tail)
    except KeyboardInterrupt:
        sys.stdout.flush()
        ctx.exit(130)
