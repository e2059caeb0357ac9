"""What the ``ficc inference`` commands read and print: specification files, plans,
services, refusals.

Refusals arrive as the API's error envelope (:class:`ApiError`); which details to
print is chosen by the envelope's wire ``code``, the one thing a client has.
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from ..base.errors import FiccError
from ..config import parse_duration
from .client import ApiClient, ApiError
from .output import echo_table, json_option

BASE = "/api/v1/inference"


# -- the options and the revision of the commands that change a service ----------------------

#: ``--revision``: the revision the operator read; by default the current one is read first.
revision_option = click.option(
    "--revision",
    type=int,
    default=None,
    help="The revision you read (default: read the current one first).",
)


def wait_options(wait_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--revision``, ``--wait`` (``wait_help`` says until what), ``--timeout``,
    ``--interval`` and ``--json``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(
            (
                revision_option,
                click.option("--wait", is_flag=True, help=wait_help),
                click.option(
                    "--timeout",
                    default="10m",
                    show_default=True,
                    help="How long --wait waits (e.g. 90s, 10m, 1h).",
                ),
                click.option(
                    "--interval", default=0.5, show_default=True, help="Seconds between polls."
                ),
                json_option,
            )
        ):
            command = option(command)
        return command

    return decorate


def current_revision(client: ApiClient, service_id: str, revision: int | None) -> int:
    """``revision`` when the operator named one, else the service's current one."""
    if revision is not None:
        return revision
    return client.json("GET", f"{BASE}/{service_id}")["revision"]


# -- formatting ------------------------------------------------------------------------------


def _size(value: float | None) -> str:
    """Bytes as an operator reads them: ``1 GiB``, ``512 MiB``, ``1.5 GiB``."""
    if value is None:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{int(value)} B"


def _cpus(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _gpus(reservation: Mapping[str, Any] | None) -> str:
    if not reservation or not reservation.get("gpus"):
        return "-"
    return ",".join(f"{gpu['index']}:{_size(gpu['memory_bytes'])}" for gpu in reservation["gpus"])


def _short(digest: str | None, keep: int = 19) -> str:
    if not digest:
        return "-"
    return digest if len(digest) <= keep else digest[:keep] + "..."


def _reasons_table(reasons: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [("REPLICA", "NODE", "CODE", "REASON")]
    rows += [(r["index"], r["node_id"], r["code"], r["message"]) for r in reasons]
    return rows


def echo_plan(preview: Mapping[str, Any]) -> None:
    """A preview as tables: one row per replica, every reason, each node's capacity.

    A scaled service's plan adds HELD: ``planned`` for a candidate placement whose
    reservation is shown but not taken (it runs no replica now).
    """
    scaled = any(replica.get("held") is False for replica in preview["replicas"])
    header = ("REPLICA", "NODE", "CPUS", "MEMORY", "GPUS", "DISK", "FITS")
    rows: list[tuple[Any, ...]] = [header + (("HELD",) if scaled else ())]
    for replica in preview["replicas"]:
        reservation = replica["reservation"]
        row = (
            replica["index"],
            replica["node_id"],
            _cpus(reservation["cpus"]),
            _size(reservation["memory_bytes"]),
            _gpus(reservation),
            _size(reservation["disk_bytes"]) if reservation["disk_bytes"] else "-",
            "yes" if replica["fits"] else "no",
        )
        rows.append(row + (("yes" if replica.get("held", True) else "planned",) if scaled else ()))
    echo_table(rows)
    reasons = [
        {"index": replica["index"], "node_id": replica["node_id"], **reason}
        for replica in preview["replicas"]
        for reason in replica["reasons"]
    ]
    if reasons:
        click.echo("")
        echo_table(_reasons_table(reasons))
    if preview.get("nodes"):
        click.echo("")
        nodes: list[tuple[Any, ...]] = [
            ("NODE", "STATE", "CPUS USED/CAPACITY", "MEMORY USED/CAPACITY", "DISK FREE")
        ]
        for node in preview["nodes"]:
            cpus, memory, disk = node["cpus"], node["memory_bytes"], node["disk_bytes"]
            nodes.append(
                (
                    node["node_id"],
                    node["state"] or "unknown",
                    f"{_cpus(cpus['reserved'])}+{_cpus(cpus['planned'])}/{_cpus(cpus['capacity'])}",
                    f"{_size(memory['reserved'])}+{_size(memory['planned'])}/"
                    f"{_size(memory['capacity'])}",
                    _size(disk["free"]),
                )
            )
        echo_table(nodes)
    scaling = preview.get("scaling")
    if scaling:
        planned = ", ".join(str(index) for index in scaling["planned"]) or "none"
        click.echo("")
        click.echo(
            f"scaling:     min {scaling['min']}, max {scaling['max']}; held at the start: "
            f"{len(scaling['held'])}, planned (not held): {planned}; {scaling['fit_together']} "
            f"fit together, " + ("max fits" if scaling["max_fits"] else "max does not fit")
        )
    click.echo("")
    click.echo(f"plan digest: {preview['plan_digest']}")
    click.echo(
        "fits: yes" if preview["fits"] else "fits: no (submitting this specification is refused)"
    )


def echo_service(view: Mapping[str, Any]) -> None:
    """The service's header lines (its replicas are :func:`.inference_status.echo_replicas`)."""
    spec = view["spec"]
    runtime = spec["runtime"]
    lines = [
        f"service:      {view['id']} ({view['alias']})",
        f"state:        {view['state']} (desired: {view['desired']})",
        f"revision:     {view['revision']}",
        f"generation:   {view['generation']}",
        f"model:        {view['model_id']}",
        f"engine:       {view['engine']}",
        f"runtime:      {runtime['executor_provider']} {_short(runtime['image_digest'])} "
        f"(isolation {runtime['isolation']}, network {runtime['network']})",
        f"executable:   {spec['image_executable']}",
        f"context:      {spec['context']} tokens, concurrency {spec['concurrency']} per replica",
    ]
    options = [
        f"{name} {spec[name]}"
        for name in (
            "gpu_layers",
            "tensor_split",
            "parallelism",
            "request_deadline",
            "prompt_cache_bytes",
        )
        if spec.get(name) is not None
    ]
    if options:
        lines.append(f"options:      {', '.join(options)}")
    lines.append(f"plan digest:  {view['plan_digest'] or '-'}")
    if view.get("reason") and view["state"] != "idle":  # an idle one's: its scaling lines
        lines.append(f"reason:       {view['reason']}")
    if view.get("unknown_attempts"):
        lines.append(f"unknown:      {', '.join(view['unknown_attempts'])} ({_unknown_hint(view)})")
    click.echo("\n".join(lines))


def _unknown_hint(view: Mapping[str, Any]) -> str:
    """What gives the service's unknown attempts up, from where it stands: the start route
    accepts ``acknowledge_unknown`` only on a service that is stopped and wants to be."""
    if view["desired"] == "removed":
        return "the service is removed once their node is back or revoked"
    if view["desired"] == "stopped" and view["state"] == "stopped":
        return "start with --acknowledge-unknown to give them up"
    if view["desired"] == "running":
        return "stop the service, then start it with --acknowledge-unknown to give them up"
    return "once the service has stopped, start it with --acknowledge-unknown to give them up"


def echo_reservations(view: Mapping[str, Any]) -> None:
    """What each replica holds on its node (``released`` once its attempt ended; ``not
    held`` for a scaled service's placement that runs no replica now)."""
    rows: list[tuple[Any, ...]] = [("REPLICA", "NODE", "CPUS", "MEMORY", "GPUS")]
    nothing = "not held" if view.get("scaling") else "released"
    for replica in view["replicas"]:
        reservation = replica["reservation"]
        rows.append(
            (
                replica["index"],
                replica["node_id"],
                _cpus(reservation["cpus"]) if reservation else nothing,
                _size(reservation["memory_bytes"]) if reservation else "-",
                _gpus(reservation),
            )
        )
    echo_table(rows)


def echo_outcome(view: Mapping[str, Any], what: str) -> None:
    click.echo(
        f"{view['id']} ({view['alias']}): {what}; state {view['state']}, desired "
        f"{view['desired']}, revision {view['revision']}, generation {view['generation']}"
    )


# -- reading input ---------------------------------------------------------------------------


def read_spec(path: Path) -> dict[str, Any]:
    """A specification from a JSON or TOML file (``-``: JSON from standard input)."""
    if str(path) == "-":
        text, suffix = sys.stdin.read(), ".json"
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"cannot read {path}: {exc}") from None
        suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            document: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise click.BadParameter(f"{path} is not valid TOML: {exc}") from None
    else:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            if suffix == ".json":
                raise click.BadParameter(f"{path} is not valid JSON: {exc}") from None
            try:
                document = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                raise click.BadParameter(f"{path} is neither JSON nor TOML: {exc}") from None
    if not isinstance(document, dict):
        raise click.BadParameter(f"{path} must hold one specification object")
    return document


SPEC_FILE = click.Path(dir_okay=False, path_type=Path, allow_dash=True)


def _echo_refusal(exc: ApiError) -> None:
    """Print what a refusal's details explain (reasons, the current revision, attempts)."""
    details = exc.details
    if exc.code == "placement_failed" and details.get("reasons"):
        echo_table(_reasons_table(details["reasons"]), err=True)
    elif exc.code == "stale_revision" and "revision" in details:
        click.echo(f"current revision: {details['revision']}", err=True)
    elif exc.code == "inference_unknown_outcome":
        for attempt in details.get("attempts", []):
            click.echo(
                f"unknown outcome: replica {attempt['replica']} attempt {attempt['attempt_id']} "
                f"on node {attempt['node_id']} (generation {attempt['generation']})",
                err=True,
            )
        click.echo(
            "start again with --acknowledge-unknown to give them up (no request is replayed)",
            err=True,
        )
    elif exc.code == "invalid_request":
        for error in details.get("errors", []):
            click.echo(f"{error.get('path', '$')}: {error.get('message', '')}", err=True)


def refusals(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ApiError as exc:
        _echo_refusal(exc)
        raise


def seconds(text: str, hint: str) -> float:
    try:
        return parse_duration(text)
    except FiccError as exc:
        raise click.BadParameter(exc.message, param_hint=hint) from None
