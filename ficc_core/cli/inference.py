"""``ficc inference ...``: managed inference services from the command line, through the API.

Every command talks to ``/api/v1/inference``; give ``--url``/``FICC_URL`` and
``--token``/``FICC_TOKEN``. Control commands read the service's current revision
first unless ``--revision`` names one, and ``--wait`` follows the service to the
state the action rests in.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from ..config import parse_duration
from ..errors import FiccError
from .client import ApiClient, ApiError, client_from, connection_options, echo_json, echo_table

_BASE = "/api/v1/inference"

#: The state each control action rests in, as ``--wait`` waits for it.
_RESTING = {
    "start": "ready",
    "replace": "ready",
    "drain": "stopped",
    "stop": "stopped",
    "remove": "gone",
}


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


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _short(digest: str | None, keep: int = 19) -> str:
    if not digest:
        return "-"
    return digest if len(digest) <= keep else digest[:keep] + "..."


def _reasons_table(reasons: list[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [("REPLICA", "NODE", "CODE", "REASON")]
    rows += [(r["index"], r["node_id"], r["code"], r["message"]) for r in reasons]
    return rows


def _echo_plan(preview: Mapping[str, Any]) -> None:
    """A preview as tables: one row per replica, every reason, each node's capacity."""
    rows: list[tuple[Any, ...]] = [("REPLICA", "NODE", "CPUS", "MEMORY", "GPUS", "DISK", "FITS")]
    for replica in preview["replicas"]:
        reservation = replica["reservation"]
        rows.append(
            (
                replica["index"],
                replica["node_id"],
                _cpus(reservation["cpus"]),
                _size(reservation["memory_bytes"]),
                _gpus(reservation),
                _size(reservation["disk_bytes"]) if reservation["disk_bytes"] else "-",
                "yes" if replica["fits"] else "no",
            )
        )
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
    click.echo("")
    click.echo(f"plan digest: {preview['plan_digest']}")
    click.echo(
        "fits: yes" if preview["fits"] else "fits: no (submitting this specification is refused)"
    )


def _echo_service(view: Mapping[str, Any]) -> None:
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
        for name in ("gpu_layers", "tensor_split", "parallelism", "request_deadline")
        if spec.get(name) is not None
    ]
    if options:
        lines.append(f"options:      {', '.join(options)}")
    lines.append(f"plan digest:  {view['plan_digest'] or '-'}")
    if view.get("reason"):
        lines.append(f"reason:       {view['reason']}")
    if view.get("unknown_attempts"):
        lines.append(
            f"unknown:      {', '.join(view['unknown_attempts'])} (start with "
            "--acknowledge-unknown to give them up)"
        )
    click.echo("\n".join(lines))
    click.echo("")
    rows: list[tuple[Any, ...]] = [
        ("REPLICA", "NODE", "STATE", "REASON", "GENERATION", "ATTEMPT", "CPUS", "MEMORY", "GPUS")
    ]
    for replica in view["replicas"]:
        reservation = replica["reservation"]
        rows.append(
            (
                replica["index"],
                replica["node_id"],
                replica["state"],
                replica["reason"] or "-",
                "-" if replica["generation"] is None else replica["generation"],
                "-" if replica["attempt"] is None else replica["attempt"],
                _cpus(reservation["cpus"]) if reservation else "released",
                _size(reservation["memory_bytes"]) if reservation else "-",
                _gpus(reservation),
            )
        )
    echo_table(rows)
    for replica in view["replicas"]:
        if replica.get("message"):
            click.echo(f"replica {replica['index']}: {replica['message']}")


def _echo_outcome(view: Mapping[str, Any], what: str) -> None:
    click.echo(
        f"{view['id']} ({view['alias']}): {what}; state {view['state']}, desired "
        f"{view['desired']}, revision {view['revision']}, generation {view['generation']}"
    )


# -- reading input ---------------------------------------------------------------------------


def _read_spec(path: Path) -> dict[str, Any]:
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


_SPEC_FILE = click.Path(dir_okay=False, path_type=Path, allow_dash=True)


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


def _refusals(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ApiError as exc:
        _echo_refusal(exc)
        raise


# -- the group -------------------------------------------------------------------------------


@click.group()
@connection_options
@click.pass_context
def inference(ctx: click.Context, url: str, token: str | None) -> None:
    """Preview, create, start, drain, stop, replace and remove managed inference services.

    Reading needs inference:read; preview inference:manage; create, replace and
    start also jobs:execute, contributors:read and models:read; drain, stop and
    remove jobs:cancel; tokens inference:manage, inference:invoke and tokens:manage.
    """
    ctx.obj = {"url": url, "token": token}


@inference.command("preview")
@click.argument("spec_file", type=_SPEC_FILE)
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_context
def preview(ctx: click.Context, spec_file: Path, as_json: bool) -> None:
    """Show SPEC_FILE's placement and why any replica does not fit.

    SPEC_FILE is a JSON or TOML specification (`-`: JSON on standard input).
    Nothing is written. The exit status is 1 when some replica does not fit.
    """
    document = _read_spec(spec_file)
    result = _refusals(lambda: client_from(ctx).json("POST", f"{_BASE}/preview", json=document))
    if as_json:
        echo_json(result)
    else:
        _echo_plan(result)
    if not result["fits"]:
        ctx.exit(1)


@inference.command("create")
@click.argument("spec_file", type=_SPEC_FILE)
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_context
def create(ctx: click.Context, spec_file: Path, as_json: bool) -> None:
    """Submit SPEC_FILE as a new, stopped service.

    Every replica's reservation is recorded, or none is (409 placement_failed
    with every reason). The service starts at generation 0; `start` starts
    generation 1.
    """
    document = _read_spec(spec_file)
    view = _refusals(lambda: client_from(ctx).json("POST", _BASE, json=document))
    if as_json:
        echo_json(view)
        return
    click.echo(f"{view['id']} {view['state']}")
    _echo_outcome(view, "created")
    click.echo(f"start it with: ficc inference start {view['id']}")


@inference.command("show")
@click.argument("service_id")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_context
def show(ctx: click.Context, service_id: str, as_json: bool) -> None:
    """Show a service: specification, state and replicas."""
    view = client_from(ctx).json("GET", f"{_BASE}/{service_id}")
    if as_json:
        echo_json(view)
    else:
        _echo_service(view)


@inference.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_context
def list_services(ctx: click.Context, as_json: bool) -> None:
    """List the project's services."""
    found = client_from(ctx).json("GET", _BASE)
    if as_json:
        echo_json(found)
        return
    rows: list[tuple[Any, ...]] = [
        ("ID", "ALIAS", "MODEL", "ENGINE", "STATE", "DESIRED", "READY", "REVISION", "GENERATION")
    ]
    for view in found["services"]:
        ready = sum(1 for replica in view["replicas"] if replica["state"] == "ready")
        rows.append(
            (
                view["id"],
                view["alias"],
                view["model_id"],
                view["engine"],
                view["state"],
                view["desired"],
                f"{ready}/{len(view['replicas'])}",
                view["revision"],
                view["generation"],
            )
        )
    echo_table(rows)


# -- changing state --------------------------------------------------------------------------


def _wait_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        (
            click.option(
                "--revision",
                type=int,
                default=None,
                help="The revision you read (default: read the current one first).",
            ),
            click.option("--wait", is_flag=True, help="Wait until the service rests there."),
            click.option(
                "--timeout",
                default="10m",
                show_default=True,
                help="How long --wait waits (e.g. 90s, 10m, 1h).",
            ),
            click.option(
                "--interval", default=0.5, show_default=True, help="Seconds between polls."
            ),
        )
    ):
        command = option(command)
    return command


def _seconds(text: str, hint: str) -> float:
    try:
        return parse_duration(text)
    except FiccError as exc:
        raise click.BadParameter(exc.message, param_hint=hint) from None


def _current_revision(client: ApiClient, service_id: str, revision: int | None) -> int:
    if revision is not None:
        return revision
    return client.json("GET", f"{_BASE}/{service_id}")["revision"]


def _wait(
    client: ApiClient,
    service_id: str,
    resting: str,
    *,
    timeout: float,
    interval: float,
) -> dict[str, Any] | None:
    """Poll the service until it rests in ``resting`` (``gone``: until it is 404).

    Each change of state is reported on standard error. A service that can no
    longer get there by itself (all its replicas unknown, or someone asked
    something else meanwhile) ends the wait with an error.
    """
    deadline = time.monotonic() + timeout
    last: tuple[str, str] | None = None
    view: dict[str, Any] | None = None
    while True:
        try:
            view = client.json("GET", f"{_BASE}/{service_id}")
        except ApiError as exc:
            if resting == "gone" and exc.code == "service_not_found":
                click.echo(f"{service_id}: removed", err=True)
                return None
            raise
        now = (view["state"], view["desired"])
        if now != last:
            replicas = ", ".join(f"{r['index']}:{r['state']}" for r in view["replicas"])
            click.echo(
                f"{service_id}: {view['state']} (desired {view['desired']}; replicas {replicas})",
                err=True,
            )
            last = now
        if resting == "ready":
            if view["state"] == "ready":
                return view
            if view["desired"] != "running":
                raise click.ClickException(
                    f"service {service_id} is now {view['desired']}; it will not become ready"
                )
            if view["state"] == "unknown":
                raise click.ClickException(
                    f"every replica of {service_id} has an unknown outcome; stop it, then "
                    "start it with --acknowledge-unknown"
                )
        elif resting == "stopped":
            if view["state"] == "stopped" and view["desired"] == "stopped":
                return view
            if view["desired"] == "running":
                raise click.ClickException(f"service {service_id} was started again meanwhile")
        if time.monotonic() >= deadline:
            reason = f" ({view['reason']})" if view.get("reason") else ""
            raise click.ClickException(
                f"timed out after {timeout:g} s waiting for {service_id} to be {resting}; "
                f"it is {view['state']}{reason}"
            )
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))


def _finish(
    client: ApiClient,
    view: dict[str, Any],
    action: str,
    *,
    wait: bool,
    timeout: str,
    interval: float,
    quiet: bool = False,
) -> None:
    if not quiet:
        _echo_outcome(view, f"{action} accepted")
    if not wait:
        return
    resting = _RESTING[action]
    rested = _wait(
        client, view["id"], resting, timeout=_seconds(timeout, "--timeout"), interval=interval
    )
    if quiet:
        return
    if rested is None:
        click.echo(f"{view['id']} gone")
        return
    click.echo(f"{view['id']} {rested['state']}")
    if rested.get("reason"):
        click.echo(f"reason: {rested['reason']}")


def _control(
    ctx: click.Context,
    service_id: str,
    action: str,
    *,
    revision: int | None,
    wait: bool,
    timeout: str,
    interval: float,
    acknowledge_unknown: bool = False,
) -> None:
    client = client_from(ctx)
    _seconds(timeout, "--timeout")  # refuse a bad --timeout before changing anything

    def send() -> dict[str, Any]:
        body: dict[str, Any] = {"revision": _current_revision(client, service_id, revision)}
        if acknowledge_unknown:
            body["acknowledge_unknown"] = True
        return client.json("POST", f"{_BASE}/{service_id}/control/{action}", json=body)

    view = _refusals(send)
    _finish(client, view, action, wait=wait, timeout=timeout, interval=interval)


@inference.command("start")
@click.argument("service_id")
@click.option(
    "--acknowledge-unknown",
    is_flag=True,
    help="Give up replicas whose outcome is unknown and start new attempts.",
)
@_wait_options
@click.pass_context
def start(
    ctx: click.Context,
    service_id: str,
    acknowledge_unknown: bool,
    revision: int | None,
    wait: bool,
    timeout: str,
    interval: float,
) -> None:
    """Start a stopped service's next generation.

    --wait waits until every replica is ready.
    """
    _control(
        ctx,
        service_id,
        "start",
        revision=revision,
        wait=wait,
        timeout=timeout,
        interval=interval,
        acknowledge_unknown=acknowledge_unknown,
    )


def _simple_control(action: str, doc: str) -> None:
    @_wait_options
    @click.pass_context
    def command(
        ctx: click.Context,
        service_id: str,
        revision: int | None,
        wait: bool,
        timeout: str,
        interval: float,
    ) -> None:
        _control(
            ctx,
            service_id,
            action,
            revision=revision,
            wait=wait,
            timeout=timeout,
            interval=interval,
        )

    command.__doc__ = doc
    inference.command(action)(click.argument("service_id")(command))


_simple_control(
    "drain",
    "Refuse new requests, finish in-flight ones, then stop.\n\n"
    "In-flight requests get up to the controller's drain_timeout. --wait waits until "
    "the service is stopped.",
)
_simple_control(
    "stop",
    "Stop every replica now.\n\nEach reservation is released once its executor confirms "
    "the end. --wait waits until the service is stopped.",
)
_simple_control(
    "remove",
    "Stop the service and delete it.\n\n--wait waits until it is gone.",
)


@inference.command("replace")
@click.argument("service_id")
@click.argument("spec_file", type=_SPEC_FILE)
@_wait_options
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_context
def replace(
    ctx: click.Context,
    service_id: str,
    spec_file: Path,
    revision: int | None,
    wait: bool,
    timeout: str,
    interval: float,
    as_json: bool,
) -> None:
    """Replace a stopped service's specification and start it.

    The new specification is placed like a new one and runs as the next
    generation. --wait waits until it is ready.
    """
    document = _read_spec(spec_file)
    client = client_from(ctx)
    _seconds(timeout, "--timeout")

    def send() -> dict[str, Any]:
        body = {"revision": _current_revision(client, service_id, revision), "spec": document}
        return client.json("PUT", f"{_BASE}/{service_id}", json=body)

    view = _refusals(send)
    if as_json:
        echo_json(view)
    _finish(
        client,
        view,
        "replace",
        wait=wait,
        timeout=timeout,
        interval=interval,
        quiet=as_json,
    )


# -- invoke tokens ---------------------------------------------------------------------------


@inference.command("token")
@click.argument("service_id")
@click.option("--lifetime", help="Issue a token living this long (e.g. 30s, 10m, 12h, 1d).")
@click.option("--name", help="A label for the issued token.")
@click.option("--list", "list_them", is_flag=True, help="List the service's invoke tokens.")
@click.option("--revoke", "revoke_id", metavar="TOKEN_ID", help="Revoke this invoke token.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead.")
@click.pass_context
def token(
    ctx: click.Context,
    service_id: str,
    lifetime: str | None,
    name: str | None,
    list_them: bool,
    revoke_id: str | None,
    as_json: bool,
) -> None:
    """Issue, list or revoke a service's invoke tokens.

    --lifetime issues one, --list lists them, --revoke TOKEN_ID revokes one.

    An issued token calls only this service's OpenAI-compatible routes; it is
    shown once.
    """
    if sum((lifetime is not None, list_them, revoke_id is not None)) != 1:
        raise click.UsageError("give exactly one of --lifetime DURATION, --list or --revoke ID")
    client = client_from(ctx)
    path = f"{_BASE}/{service_id}/tokens"
    if list_them:
        found = client.json("GET", path)
        if as_json:
            echo_json(found)
            return
        rows: list[tuple[Any, ...]] = [("ID", "NAME", "CREATED", "EXPIRES", "REVOKED")]
        for credential in found["tokens"]:
            rows.append(
                (
                    credential["id"],
                    credential["name"],
                    _when(credential["created_at"]),
                    _when(credential["expires_at"]),
                    _when(credential["revoked_at"]),
                )
            )
        echo_table(rows)
        return
    if revoke_id is not None:
        revoked = client.json("DELETE", f"{path}/{revoke_id}")
        if as_json:
            echo_json(revoked)
        else:
            click.echo(f"revoked {revoked['id']} ({revoked['name']})")
        return
    assert lifetime is not None
    body: dict[str, Any] = {"lifetime": _seconds(lifetime, "--lifetime")}
    if name:
        body["name"] = name
    issued = client.json("POST", path, json=body)
    if as_json:
        echo_json(issued)
    else:
        credential = issued["credential"]
        click.echo(
            f"credential: {credential['id']} ({credential['name']}), expires "
            f"{_when(credential['expires_at'])}"
        )
        click.echo(f"token: {issued['token']}")
    click.echo(
        "warning: the token is shown only once; store it now (revoke it with "
        f"'ficc inference token {service_id} --revoke {issued['credential']['id']}')",
        err=True,
    )
