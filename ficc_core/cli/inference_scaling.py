"""Scaling from the command line: ``--min``/``--max``/``--idle-timeout``, ``show``'s
scaling lines, and ``ficc inference pin|unpin``.

The options set the specification's ``scaling`` block (docs/inference.md, "Scaling and
on-demand services"): only the ones given, so ``rollout --max 3`` keeps the current
``min`` and ``idle_timeout``. The controller validates the block (``min`` at most
``max``, ``max`` at most the number of placements) and says why in its refusal; here
only a duration that is not one is refused, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import click

from .client import ApiClient, client_from
from .inference_control import _wait
from .inference_io import (
    BASE,
    current_revision,
    echo_outcome,
    refusals,
    revision_option,
    seconds,
    wait_options,
)
from .output import echo_json, json_option
from .resolve import resolve

#: How ``show`` ends an idle service's line when the reason does not say it already.
WAKES = "the next request wakes it"


def scaling_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--min``, ``--max`` and ``--idle-timeout`` (their values: ``min_replicas``,
    ``max_replicas``, ``idle_timeout``)."""
    for option in reversed(
        (
            click.option(
                "--min",
                "min_replicas",
                type=click.IntRange(0),
                default=None,
                help="Replicas that always run (scaling.min); 0 makes the service on-demand.",
            ),
            click.option(
                "--max",
                "max_replicas",
                type=click.IntRange(1),
                default=None,
                help="Replicas that may run at once (scaling.max; default: every placement).",
            ),
            click.option(
                "--idle-timeout",
                default=None,
                metavar="DURATION",
                help="How long a replica may serve nothing before it stops while more than "
                "--min run (e.g. 15m, 900s, 900; default: the idle_timeout setting).",
            ),
        )
    ):
        command = option(command)
    return command


def scaling_given(
    min_replicas: int | None, max_replicas: int | None, idle_timeout: str | None
) -> dict[str, Any]:
    """The scaling fields given on the command line (empty when none was)."""
    given: dict[str, Any] = {}
    if min_replicas is not None:
        given["min"] = min_replicas
    if max_replicas is not None:
        given["max"] = max_replicas
    if idle_timeout is not None:
        value = seconds(idle_timeout, "--idle-timeout")
        if value <= 0:
            raise click.BadParameter("must be more than 0", param_hint="--idle-timeout")
        given["idle_timeout"] = int(value) if value == int(value) else value
    return given


def with_scaling(spec: dict[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with the given scaling fields over its own ``scaling`` block (if any)."""
    if not given:
        return spec
    return {**spec, "scaling": {**(spec.get("scaling") or {}), **given}}


def duration(value: float | None) -> str:
    """Seconds as an operator writes them: ``15m``, ``2h``, ``90s``, ``1.5s``."""
    if value is None:
        return "the idle_timeout setting"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s"


def scaling_lines(view: Mapping[str, Any]) -> list[str]:
    """``show``'s lines for a scaled service (none for one that is not scaled).

    ``scaling: 1 of at most 3 replicas running (min 0, idle timeout 15m), pinned`` and,
    while it is idle, ``idle: <the view's reason>; the next request wakes it``.
    """
    scaling = view.get("scaling")
    if not scaling:
        return []
    running, most = scaling.get("running", 0), scaling["max"]
    line = (
        f"scaling:      {running} of at most {most} replica{'s' if most != 1 else ''} running "
        f"(min {scaling['min']}, idle timeout {duration(scaling.get('idle_timeout'))})"
    )
    if scaling.get("pinned"):
        line += ", pinned"
    lines = [line]
    if scaling.get("active"):
        lines.append(
            "active:       placement"
            + ("s " if len(scaling["active"]) != 1 else " ")
            + ", ".join(str(index) for index in scaling["active"])
        )
    if view.get("state") == "idle":
        reason = view.get("reason") or "no request for a while"
        reason = reason.removeprefix("idle: ")  # the controller's reason may start so
        says = WAKES in reason or "tries again" in reason  # how it wakes, said already
        lines.append(f"idle:         {reason}" + ("" if says else f"; {WAKES}"))
    return lines


def scaling_cell(view: Mapping[str, Any]) -> str:
    """The list's SCALING column: ``1/3 min 0`` (running / max), ``pinned``; ``-`` unscaled."""
    scaling = view.get("scaling")
    if not scaling:
        return "-"
    cell = f"{scaling.get('running', 0)}/{scaling['max']} min {scaling['min']}"
    return cell + (" pinned" if scaling.get("pinned") else "")


def _pin(
    ctx: click.Context, service_id: str, action: str, revision: int | None
) -> tuple[ApiClient, dict[str, Any]]:
    """Send ``pin`` or ``unpin`` with the revision read (or given); the service view."""
    client = client_from(ctx)
    service_id = resolve(client, "inference", service_id)

    def send() -> dict[str, Any]:
        body = {"revision": current_revision(client, service_id, revision)}
        return client.json("POST", f"{BASE}/{service_id}/{action}", json=body)

    return client, refusals(send)


def _echo_pinned(view: Mapping[str, Any], what: str, as_json: bool) -> None:
    if as_json:
        echo_json(view)
        return
    echo_outcome(view, what)
    for line in scaling_lines(view):
        click.echo(line)


@click.command("pin")
@click.argument("service_id", metavar="SERVICE")
@wait_options("Wait until the service is ready (pinning wakes an idle service).")
@click.pass_context
def pin(
    ctx: click.Context,
    service_id: str,
    revision: int | None,
    wait: bool,
    timeout: str,
    interval: float,
    as_json: bool,
) -> None:
    """Pin a scaled SERVICE (its ID or alias): it is never scaled to zero.

    An idle service wakes now; one replica keeps running however long nobody asks
    (replicas above that still stop once idle). --wait waits until it is ready.
    """
    limit = seconds(timeout, "--timeout")  # refuse a bad --timeout before changing anything
    client, view = _pin(ctx, service_id, "pin", revision)
    if wait:
        view = (
            _wait(client, view["id"], "ready", timeout=limit, interval=interval, idle_rests=False)
            or view
        )
    _echo_pinned(view, "pinned", as_json)


@click.command("unpin")
@click.argument("service_id", metavar="SERVICE")
@revision_option
@json_option
@click.pass_context
def unpin(ctx: click.Context, service_id: str, revision: int | None, as_json: bool) -> None:
    """Unpin a scaled SERVICE: it scales by demand again (with min 0, to zero once
    nobody asked for its idle timeout)."""
    _, view = _pin(ctx, service_id, "unpin", revision)
    _echo_pinned(view, "unpinned", as_json)


#: The commands of this module, as the ``inference`` group adds them.
COMMANDS = (pin, unpin)
