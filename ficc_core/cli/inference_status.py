"""``ficc inference show``'s replicas table: each replica's status, from the status route.

One row per replica: its state, its node (with ``disconnected`` or ``stale`` when
the node dropped or missed its heartbeats), its attempt, the engine's PID, how
often it restarted in this generation, how its last attempt ended, the readiness
probe's last answer and the requests in flight. REASON says why the replica is as it
is (:func:`reason_shown`): the current attempt's reason, else the reason of a last
exit that failed, so a replica killed and relaunched still says why; a replica that
runs again after a restart or a move it was asked for shows none (LAST EXIT keeps
how its previous attempt ended). The messages follow the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from .client import ApiClient, ApiError
from .inference_io import BASE
from .output import echo_table

HEADER = (
    "REPLICA",
    "STATE",
    "NODE",
    "ATTEMPT",
    "PID",
    "RESTARTS",
    "LAST EXIT",
    "HEALTH",
    "IN-FLIGHT",
    "REASON",
)


def fetch_status(client: ApiClient, service_id: str) -> dict[str, Any] | None:
    """The service's status, or None from a controller without the status route."""
    try:
        return client.json("GET", f"{BASE}/{service_id}/status")
    except ApiError as exc:
        if exc.status == 404 and exc.code != "service_not_found":
            return None
        raise


def _dash(value: Any) -> Any:
    return "-" if value is None else value


def how_it_ended(last: Mapping[str, Any] | None) -> str:
    """``signal 9``, ``status 3``, ``memory limit``, ``stopped``, or ``-`` for none."""
    if last is None:
        return "-"
    if last["memory_limit"]:
        return "memory limit"
    if last["signal"] is not None:
        return f"signal {last['signal']}"
    if last["exit_code"] is not None:
        return f"status {last['exit_code']}"
    return last["reason"] or "-"


#: Replica states that a reason explains even when their last exit was no failure.
_NEEDS_REASON = frozenset({"stopped", "failed", "unknown"})


def reason_shown(replica: Mapping[str, Any]) -> str | None:
    """The REASON cell: the current attempt's own reason, else its last exit's where that
    explains the replica's state: a failure (it was relaunched because of it), or any
    end of a replica that is stopped, failed or unknown now. A replica that runs again
    after a stop it was asked for (``restart_requested``, ``moved``) needs no reason."""
    if replica["reason"]:
        return replica["reason"]
    last = replica["last_exit"]
    if last is None:
        return None
    # A controller without ``failed``: any end counts, as it used to.
    if replica["state"] in _NEEDS_REASON or last.get("failed", True):
        return last["reason"]
    return None


def _node(node: Mapping[str, Any]) -> str:
    name = node["name"] or node["id"]
    return name if node["state"] == "connected" else f"{name} ({node['state']})"


def echo_replicas(view: Mapping[str, Any], status: Mapping[str, Any] | None) -> None:
    """The replicas table (the service view's replicas when there is no status)."""
    if status is None:
        rows: list[tuple[Any, ...]] = [("REPLICA", "STATE", "NODE", "ATTEMPT", "REASON")]
        for replica in view["replicas"]:
            rows.append(
                (
                    replica["index"],
                    replica["state"],
                    replica["node_id"],
                    _dash(replica["attempt"]),
                    _dash(replica["reason"]),
                )
            )
        echo_table(rows)
        return
    rows = [HEADER]
    notes = []
    for replica in status["replicas"]:
        last = replica["last_exit"]
        ended_now = last is not None and last["attempt_id"] == replica["attempt_id"]
        reason = reason_shown(replica)
        rows.append(
            (
                replica["index"],
                replica["state"],
                _node(replica["node"]),
                _dash(replica["attempt"]),
                _dash(replica["pid"]),
                replica["restarts"],
                how_it_ended(last),
                _dash(replica["health"]),
                replica["in_flight"],
                _dash(reason),
            )
        )
        if replica["message"]:
            notes.append(f"replica {replica['index']}: {replica['message']}")
        if last is not None and last["message"] and not ended_now:
            notes.append(
                f"replica {replica['index']} last exit (attempt {last['attempt']}): "
                f"{last['message']}"
            )
        if replica["node"]["trouble"]:
            notes.append(f"replica {replica['index']}: {replica['node']['trouble']}")
        coming = replica.get("successor")
        if coming:
            notes.append(
                f"replica {replica['index']}: attempt {coming['attempt']} (generation "
                f"{coming['generation']}) on {coming['node_id']} is {coming['state']}; it "
                "takes over once ready"
            )
    echo_table(rows)
    for note in notes:
        click.echo(note)
