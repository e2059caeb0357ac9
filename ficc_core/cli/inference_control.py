"""``ficc inference start|drain|stop|remove|replace``: changing a service's state.

Each reads the service's current revision first unless ``--revision`` names one;
``--wait`` follows the service to the state the action rests in.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from .client import ApiClient, ApiError, client_from
from .inference_io import (
    BASE,
    SPEC_FILE,
    current_revision,
    echo_outcome,
    read_spec,
    refusals,
    seconds,
    wait_options,
)
from .output import echo_json
from .resolve import resolve

#: The state each control action rests in, as ``--wait`` waits for it.
_RESTING = {
    "start": "ready",
    "replace": "ready",
    "drain": "stopped",
    "stop": "stopped",
    "remove": "gone",
}


def _wait(
    client: ApiClient,
    service_id: str,
    resting: str,
    *,
    timeout: float,
    interval: float,
    idle_rests: bool = True,
) -> dict[str, Any] | None:
    """Poll the service until it rests in ``resting`` (``gone``: until it is 404).

    An on-demand service that started rests ``idle`` (no replica until a request wakes
    it), which ends a wait for ``ready`` too unless ``idle_rests`` is false (``pin``
    waits for the replica it wakes).

    Each change of state is reported on standard error. A service that can no
    longer get there by itself (all its replicas unknown, or someone asked
    something else meanwhile) ends the wait with an error.
    """
    deadline = time.monotonic() + timeout
    last: tuple[str, str] | None = None
    view: dict[str, Any] | None = None
    while True:
        try:
            view = client.json("GET", f"{BASE}/{service_id}")
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
            if view["state"] == "ready" or (idle_rests and view["state"] == "idle"):
                return view
            if view["desired"] != "running":
                raise click.ClickException(
                    f"service {service_id} is now {view['desired']}; it will not become ready"
                )
            if view.get("stopped_retrying"):
                raise click.ClickException(
                    f"service {service_id} will not become ready: {view['reason']}"
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
    as_json: bool = False,
) -> None:
    """Print the accepted action and, with ``wait``, where the service came to rest.

    With ``--json`` only one document is printed: the service as it rests (``--wait``;
    ``{"id": ..., "gone": true}`` once removed) or as the action left it.
    """
    if not as_json:
        echo_outcome(view, f"{action} accepted")
    if not wait:
        if as_json:
            echo_json(view)
        return
    resting = _RESTING[action]
    rested = _wait(
        client, view["id"], resting, timeout=seconds(timeout, "--timeout"), interval=interval
    )
    if as_json:
        echo_json({"id": view["id"], "gone": True} if rested is None else rested)
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
    as_json: bool,
    acknowledge_unknown: bool = False,
) -> None:
    client = client_from(ctx)
    seconds(timeout, "--timeout")  # refuse a bad --timeout before changing anything
    service_id = resolve(client, "inference", service_id)

    def send() -> dict[str, Any]:
        body: dict[str, Any] = {"revision": current_revision(client, service_id, revision)}
        if acknowledge_unknown:
            body["acknowledge_unknown"] = True
        return client.json("POST", f"{BASE}/{service_id}/control/{action}", json=body)

    view = refusals(send)
    _finish(client, view, action, wait=wait, timeout=timeout, interval=interval, as_json=as_json)


@click.command("start")
@click.argument("service_id", metavar="SERVICE")
@click.option(
    "--acknowledge-unknown",
    is_flag=True,
    help="Give up replicas whose outcome is unknown and start new attempts.",
)
@wait_options("Wait until the service rests there.")
@click.pass_context
def start(
    ctx: click.Context,
    service_id: str,
    acknowledge_unknown: bool,
    revision: int | None,
    wait: bool,
    timeout: str,
    interval: float,
    as_json: bool,
) -> None:
    """Start a stopped service's next generation (SERVICE: its ID or alias).

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
        as_json=as_json,
        acknowledge_unknown=acknowledge_unknown,
    )


def _simple_control(action: str, doc: str) -> click.Command:
    @wait_options("Wait until the service rests there.")
    @click.pass_context
    def command(
        ctx: click.Context,
        service_id: str,
        revision: int | None,
        wait: bool,
        timeout: str,
        interval: float,
        as_json: bool,
    ) -> None:
        _control(
            ctx,
            service_id,
            action,
            revision=revision,
            wait=wait,
            timeout=timeout,
            interval=interval,
            as_json=as_json,
        )

    command.__doc__ = doc
    return click.command(action)(click.argument("service_id", metavar="SERVICE")(command))


drain = _simple_control(
    "drain",
    "Refuse new requests, finish in-flight ones, then stop.\n\n"
    "In-flight requests get up to the controller's drain_timeout. --wait waits until "
    "the service is stopped.",
)
stop = _simple_control(
    "stop",
    "Stop every replica now.\n\nEach reservation is released once its executor confirms "
    "the end. --wait waits until the service is stopped.",
)
remove = _simple_control(
    "remove",
    "Stop the service and delete it.\n\n--wait waits until it is gone.",
)


@click.command("replace")
@click.argument("service_id", metavar="SERVICE")
@click.argument("spec_file", type=SPEC_FILE)
@wait_options("Wait until the service rests there.")
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
    """Replace a stopped service's specification and start it (SERVICE: ID or alias).

    The new specification is placed like a new one and runs as the next
    generation. --wait waits until it is ready.
    """
    document = read_spec(spec_file)
    client = client_from(ctx)
    seconds(timeout, "--timeout")
    service_id = resolve(client, "inference", service_id)

    def send() -> dict[str, Any]:
        body = {"revision": current_revision(client, service_id, revision), "spec": document}
        return client.json("PUT", f"{BASE}/{service_id}", json=body)

    view = refusals(send)
    _finish(client, view, "replace", wait=wait, timeout=timeout, interval=interval, as_json=as_json)


#: The commands of this module, as the ``inference`` group adds them.
COMMANDS = (start, drain, stop, remove, replace)
