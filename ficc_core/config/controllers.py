"""Several controllers (docs/operations.md#several-controllers): the lease, events, log streams."""

from __future__ import annotations

from typing import Any

import attrs

from .fields import setting


def _below_lease(config: Any, _setting: attrs.Attribute, interval: float) -> None:
    if interval >= config.leader_lease:
        raise ValueError(
            f"leader_renew_interval ({interval:g} s) must be shorter than leader_lease "
            f"({config.leader_lease:g} s): a leader must renew before its lease runs out"
        )


@attrs.frozen(slots=False)
class ControllerSettings:
    """Several controllers sharing a store (a section of Config)."""

    controller_id: str = setting(
        "",
        "This controller's name among the controllers sharing the store (the leader row, "
        "GET /api/v1/system/controllers, the logs). Empty: the hostname and the listening "
        "port (with port 0, a random suffix, so two on one machine never share one).",
        kind="str",
    )
    advertise_url: str = setting(
        "",
        "The URL other controllers, clients and a standby's not_leader refusals name for "
        "this controller. Empty: http(s)://host:port of the listener (the port it bound).",
        kind="str",
    )
    leader_lease: float = setting(
        15.0,
        "How long the leader's claim stands without a renewal; a standby takes the lease "
        "once it ran out. Long enough to survive a slow query or a brief network stall, "
        "short enough that a standby takes over before anyone has finished reading the "
        "alert. The controllers' clocks must agree to well within it (NTP) (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    leader_renew_interval: float = setting(
        5.0,
        "How often the leader renews its lease and a standby tries to take it: a third of "
        "leader_lease, so two renewals may fail before the leader steps down; a standby "
        "takes over within leader_lease + this (duration).",
        kind="duration",
        validator=[attrs.validators.gt(0), _below_lease],
    )
    follow_interval: float = setting(
        1.0,
        "How stale a standby's routing table and the leader's view of services created "
        "or changed through another controller may be: both read the store this often "
        "(duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    events_retention: float = setting(
        7 * 86400.0,
        "How long events (every state change of a service, replica, attempt and node) are "
        "kept; a week covers a weekend's incident read on Monday, and older ones are pruned "
        "every minute, off the request path (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    events_max_per_service: int = setting(
        1000,
        "The most events kept per service (and per node, of its own): a replica that keeps "
        "failing writes a few events per try, so a crash loop cannot fill the database; "
        "a thousand keep days of an ordinary service's history. The oldest go first.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    log_keepalive: float = setting(
        25.0,
        "How often a live log stream (logs/stream) sends a ': keepalive' comment while the "
        "log is quiet, so reverse proxies and load balancers do not drop it as idle (their "
        "idle timeouts are often 30 or 60 s) (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
