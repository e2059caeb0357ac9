"""``ficc inference restart|move|bulk-move|rollout``: operations on a running service.

Each reads the service's current revision first unless ``--revision`` names one.
``move`` and ``bulk-move`` print each step and exit 1 unless every replica moved;
``rollout --wait`` follows the rollout until the next generation serves (or failed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import httpx

from .client import client_from
from .inference_io import (
    BASE,
    SPEC_FILE,
    current_revision,
    read_spec,
    refusals,
    revision_option,
    seconds,
    wait_options,
)
from .inference_scaling import scaling_given, scaling_options, with_scaling
from .output import echo_json, echo_table, json_option
from .resolve import resolve

#: A move, a bulk move and a restart answer once done; the controller bounds each wait
#: (replica_ready_timeout, drain_timeout), so the answer is awaited without a read bound.
_UNTIL_DONE = httpx.Timeout(30.0, read=None)


@click.command("restart")
@click.argument("service", metavar="SERVICE")
@click.option("--replica", type=int, default=None, help="Restart this replica only.")
@revision_option
@json_option
@click.pass_context
def restart(
    ctx: click.Context, service: str, replica: int | None, revision: int | None, as_json: bool
) -> None:
    """Restart a running service's replicas one at a time (or only --replica N).

    Each replica drains, stops and starts again; the next waits until it is ready,
    so a service of two or more replicas always has one serving.
    """
    client = client_from(ctx)
    service_id = resolve(client, "inference", service)
    path = f"{BASE}/{service_id}/restart"
    if replica is not None:
        path = f"{BASE}/{service_id}/replicas/{replica}/restart"
    result = refusals(
        lambda: client.json(
            "POST",
            path,
            json={"revision": current_revision(client, service_id, revision)},
            timeout=_UNTIL_DONE,
        )
    )
    if as_json:
        echo_json(result)
    else:
        rows: list[list[Any]] = [["REPLICA", "OK", "FROM", "TO", "MS"]]
        for item in result["replicas"]:
            rows.append(
                [
                    item["replica"],
                    "yes" if item["ok"] else "no",
                    item["from_attempt"],
                    item.get("to_attempt") or item.get("error"),
                    item.get("ms", "-"),
                ]
            )
        echo_table(rows)
    if not all(item["ok"] for item in result["replicas"]):
        ctx.exit(1)


def _echo_move(result: dict[str, Any]) -> None:
    click.echo(
        f"replica {result['replica']} of {result['service_id']}: {result['final_state']} "
        f"({result['from_node']} -> {result['to_node']})"
    )
    rows: list[list[Any]] = [["STEP", "OK", "MS", "DETAILS"]]
    for step in result["steps"]:
        details = step["details"].get("error") or ", ".join(
            f"{k}={v}" for k, v in step["details"].items() if not isinstance(v, dict)
        )
        rows.append([step["name"], "yes" if step["ok"] else "no", step["ms"], details])
    echo_table(rows)


def _target(to: str, gpu: int | None, start_after_move: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"target_node_id": to, "start_after_move": start_after_move}
    if gpu is not None:
        body["target_gpu_index"] = gpu
    return body


_target_options = [
    click.option("--to", "to", required=True, help="The target node."),
    click.option("--gpu", type=int, default=None, help="The target GPU (default: the same)."),
    click.option(
        "--no-start-after-move",
        "start_after_move",
        is_flag=True,
        flag_value=False,
        default=True,
        help="Stop the source without waiting until the target is ready.",
    ),
]


def _with_target(command: Any) -> Any:
    for option in reversed(_target_options):
        command = option(command)
    return command


@click.command("move")
@click.argument("service", metavar="SERVICE")
@click.option("--replica", type=int, required=True, help="The replica to move.")
@_with_target
@revision_option
@json_option
@click.pass_context
def move(
    ctx: click.Context,
    service: str,
    replica: int,
    to: str,
    gpu: int | None,
    start_after_move: bool,
    revision: int | None,
    as_json: bool,
) -> None:
    """Move replica --replica of a running SERVICE to node --to, without an outage.

    The target starts beside the source; once it is ready the source drains and
    stops. The exit status is 1 unless the final state is `moved`.
    """
    client = client_from(ctx)
    service_id = resolve(client, "inference", service)
    body = {**_target(to, gpu, start_after_move), "revision": revision}
    result = refusals(
        lambda: client.json(
            "POST",
            f"{BASE}/{service_id}/replicas/{replica}/move",
            json=body,
            timeout=_UNTIL_DONE,
        )
    )
    echo_json(result) if as_json else _echo_move(result)
    if result["final_state"] != "moved":
        ctx.exit(1)


@click.command("bulk-move")
@click.argument("replicas", metavar="SERVICE:REPLICA...", nargs=-1, required=True)
@_with_target
@json_option
@click.pass_context
def bulk_move(
    ctx: click.Context,
    replicas: tuple[str, ...],
    to: str,
    gpu: int | None,
    start_after_move: bool,
    as_json: bool,
) -> None:
    """Move several replicas (each SERVICE:REPLICA, 1 to 50) to node --to, one after
    the other; one that fails never stops the rest. Exit status 1 if any failed."""
    client = client_from(ctx)
    items = []
    for text in replicas:
        service, _, index = text.rpartition(":")
        if not service or not index.isdigit():
            raise click.BadParameter(f"{text!r}: use SERVICE:REPLICA", param_hint="REPLICAS")
        items.append({"service_id": resolve(client, "inference", service), "replica": int(index)})
    body = {**_target(to, gpu, start_after_move), "replicas": items}
    result = refusals(
        lambda: client.json("POST", f"{BASE}/bulk-move", json=body, timeout=_UNTIL_DONE)
    )
    if as_json:
        echo_json(result)
    else:
        rows: list[list[Any]] = [["SERVICE", "REPLICA", "OK", "OUTCOME"]]
        for item in result["items"]:
            outcome = (
                item["response"]["final_state"] if "response" in item else item["error"]["message"]
            )
            ok = "yes" if item["ok"] else "no"
            rows.append([item["service_id"], item["replica"], ok, outcome])
        echo_table(rows)
        click.echo(
            f"{result['moved_count']} of {result['total']} moved, {result['failed_count']} failed"
        )
    if result["failed_count"]:
        ctx.exit(1)


def _next_spec(
    current: dict[str, Any], spec_file: Path | None, replicas: int | None, context: int | None
) -> dict[str, Any]:
    spec = read_spec(spec_file) if spec_file is not None else dict(current)
    if replicas is not None:
        if replicas < 1:
            raise click.BadParameter("must be 1 or more", param_hint="--replicas")
        placements = list(spec["placements"])
        while len(placements) < replicas:
            placements.append(placements[-1])  # the next one beside the last
        spec["placements"] = placements[:replicas]
    if context is not None:
        spec["context"] = context
    return spec


def _echo_adjusted(service_id: str, answer: dict[str, Any]) -> None:
    for change in answer.get("adjusted_limits") or ():
        click.echo(
            f"{service_id}: {change['path']} {change['from']} -> {change['to']} bytes "
            f"(the estimate at the new context is {change['estimate_bytes']})"
        )


def _echo_preview(
    ctx: click.Context, client: Any, service_id: str, body: dict[str, Any], as_json: bool
) -> None:
    """``rollout --preview``: what the rollout would do; exit 1 when it would be refused."""
    ask = {k: body[k] for k in ("spec", "strategy", "keep_limits")}
    answer = refusals(lambda: client.json("POST", f"{BASE}/{service_id}/rollout/preview", json=ask))
    strategy = answer["strategy"]
    if as_json:
        echo_json(answer)
    else:
        _echo_adjusted(service_id, answer)
        chosen = strategy["chosen"] or "none fits"
        least = strategy["least_serving_replicas"]
        click.echo(f"{service_id}: strategy {chosen} (asked: {strategy['requested']})")
        if least is not None:
            down = "; downtime" if strategy["downtime"] else ""
            click.echo(
                f"{service_id}: at least {least} of {strategy['serving_replicas']} replica(s) "
                f"serve meanwhile{down}"
            )
        click.echo(f"{service_id}: {strategy['message']}")
        for warning in answer.get("warnings", []):
            click.echo(f"warning: {warning['message']} [{warning['code']}]", err=True)
    if strategy["chosen"] is None:
        ctx.exit(1)


@click.command("rollout")
@click.argument("service", metavar="SERVICE")
@click.option("-f", "--file", "spec_file", type=SPEC_FILE, default=None, help="The next spec.")
@click.option("--replicas", type=int, default=None, help="The next replica count.")
@click.option(
    "--engine-context",
    "--context",
    "context",
    type=click.IntRange(1),
    default=None,
    help="The next engine context window in tokens (the KV cache the engine allocates; "
    "its memory limit is recomputed unless --keep-limits). Not --context-length, which "
    "bounds one request.",
)
@click.option(
    "--strategy",
    type=click.Choice(["auto", "surge", "rolling", "recreate"]),
    default="auto",
    show_default=True,
    help="surge: beside the serving generation (needs room for both); rolling: in place, "
    "one replica at a time; recreate: in place, all at once (downtime). auto: surge when "
    "it fits, a scale-down at once.",
)
@click.option(
    "--keep-limits", is_flag=True, help="Keep the memory limits a new context would recompute."
)
@click.option(
    "--preview",
    is_flag=True,
    help="Show the strategy it would take, the capacity meanwhile and the limits it "
    "recomputes; change nothing.",
)
@scaling_options
@wait_options("Wait until the next generation serves.")
@click.pass_context
def rollout(
    ctx: click.Context,
    service: str,
    spec_file: Path | None,
    replicas: int | None,
    context: int | None,
    strategy: str,
    keep_limits: bool,
    preview: bool,
    min_replicas: int | None,
    max_replicas: int | None,
    idle_timeout: str | None,
    revision: int | None,
    wait: bool,
    timeout: str,
    interval: float,
    as_json: bool,
) -> None:
    """Roll a running SERVICE out to its next specification.

    The next generation (-f SPEC, or the current one with --replicas/--engine-context)
    starts beside the serving one (--strategy surge) and takes the traffic once every
    replica is ready; a failed rollout leaves the serving generation as it was. On a
    node without room for both, --strategy rolling or recreate replaces the replicas
    in place (capacity drops meanwhile; preview says by how much). A scale-down
    (--replicas fewer) is applied at once.

    --min, --max and --idle-timeout change the next specification's scaling (only
    the ones given; the rest stay as they are).
    """
    scaling = scaling_given(min_replicas, max_replicas, idle_timeout)
    client = client_from(ctx)
    limit = seconds(timeout, "--timeout")
    service_id = resolve(client, "inference", service)
    current = client.json("GET", f"{BASE}/{service_id}")
    spec = with_scaling(_next_spec(current["spec"], spec_file, replicas, context), scaling)
    body = {
        "revision": current["revision"] if revision is None else revision,
        "spec": spec,
        "strategy": strategy,
        "keep_limits": keep_limits,
    }
    if preview:
        _echo_preview(ctx, client, service_id, body, as_json)
        return
    started = refusals(lambda: client.json("POST", f"{BASE}/{service_id}/rollout", json=body))
    if not as_json:
        _echo_adjusted(service_id, started)
    if started["rollout"] is None:
        if as_json:
            echo_json(started)
        else:
            click.echo(f"{service_id}: {started['strategy']['message']}")
        return
    generation = started["rollout"]["generation"]
    if not as_json:
        chosen = started["strategy"]["chosen"]
        click.echo(f"{service_id}: rolling out generation {generation} ({chosen})")
    if not wait:
        if as_json:
            echo_json(started)
        return
    deadline = time.monotonic() + limit
    while True:
        status = client.json("GET", f"{BASE}/{service_id}/rollout")
        if not status["pending"]:
            break
        if time.monotonic() >= deadline:
            raise click.ClickException(
                f"timed out after {limit:g} s waiting for generation {generation} to serve"
            )
        time.sleep(interval)
    if as_json:
        echo_json(status)
    if status["generation"] != generation:
        raise click.ClickException(status["reason"] or f"generation {generation} was abandoned")
    if not as_json:
        click.echo(f"{service_id}: generation {generation} serves")


COMMANDS = (restart, move, bulk_move, rollout)
