"""The JSON views of inference services, their previews and their usage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..config.prices import MILLI
from ..inference import Preview, ServiceDetail
from ..inference.reconciliation.publication import give_up_reason, given_up
from ..inference.reconciliation.status import ServiceStatus, current_attempts, serves
from ..inference.records import AttemptState, Desired, ServiceRecord, ServiceState
from ..schema import unstructure
from ..usage.records import CredentialUsage, UsageRecord, UsageSummary, UsageTotals, stored


def service_view(
    detail: ServiceDetail,
    give_up_after: int = 0,
    *,
    trouble: Callable[[str, str], str | None],
) -> dict[str, Any]:
    """A service as the API shows it: specification, revision, generation, replicas.

    ``stopped_retrying`` lists the replicas that stopped retrying because their last
    ``give_up_after`` attempts failed the same way (the service's reason says how).
    Each replica's ``serving`` says whether it takes the service's requests now
    (:func:`~ficc_core.inference.reconciliation.status.serves`; ``trouble`` says, by node
    and attempt ID, why an attempt cannot count now: the registry's ``attempt_trouble``).
    """
    service, attempts = detail.service, detail.attempts
    spec = service.document()
    # The reservation of the replica's placement, in the service's generation (a move's
    # target or a rollout's next generation holds its own beside it).
    held = {
        (r.replica, r.node_id): r.to_json()
        for r in sorted(detail.reservations, key=lambda r: r.generation == service.generation)
    }
    latest = current_attempts(attempts, service.generation)
    replicas = []
    for index, placement in enumerate(spec["placements"]):
        last = latest.get(index)
        replicas.append(
            {
                "index": index,
                "node_id": placement["node_id"],
                "state": "stopped" if last is None else str(last.state),
                "serving": serves(service, index, last, trouble),
                "reason": None if last is None else last.reason,
                "message": None if last is None else last.message,
                "generation": None if last is None else last.generation,
                "attempt": None if last is None else last.number,
                "attempt_id": None if last is None else last.attempt_id,
                "plan_digest": None if last is None else last.plan_digest,
                "reservation": held.get((index, placement["node_id"])),
            }
        )
    unknown = [a.attempt_id for a in attempts if a.state == AttemptState.UNKNOWN and not a.released]
    reason = service.reason
    if unknown and service.state in (ServiceState.STOPPED, ServiceState.REMOVING):
        # Derived from the attempts held now, never stored: it cannot outlive them.
        count = len({a.replica for a in attempts if a.attempt_id in unknown})
        reason = f"{count} replica(s) have an unknown outcome; " + (
            "start with acknowledge_unknown: true to give them up"
            if service.state == ServiceState.STOPPED
            else "the service is removed once their node is back or revoked"
        )
    stopped_retrying = {}
    if service.desired == Desired.RUNNING:
        for index in range(len(spec["placements"])):
            last = given_up(attempts, service.generation, index, give_up_after)
            if last is not None:
                stopped_retrying[index] = last
    if stopped_retrying:
        # Derived from the attempts as they are read, so it never lags the list above.
        index, last = next(iter(stopped_retrying.items()))
        reason = give_up_reason(index, last, give_up_after)
    view = {
        "id": service.id,
        "project_id": service.project_id,
        "alias": service.alias,
        "model_id": service.model_id,
        "engine": spec["engine"],
        "spec": spec,
        "revision": service.revision,
        "generation": service.generation,
        "desired": str(service.desired),
        "state": str(service.state),
        "reason": reason,
        "plan_digest": service.plan_digest,
        "replicas": replicas,
        "unknown_attempts": unknown,
        "stopped_retrying": list(stopped_retrying),
        "created_at": service.created_at,
        "updated_at": service.updated_at,
    }
    scaling = spec.get("scaling")
    if scaling is not None:
        view["scaling"] = scaling_view(service, scaling, len(spec["placements"]))
    return view


def scaling_view(
    service: ServiceRecord, scaling: dict[str, Any], placements: int
) -> dict[str, Any]:
    """A scaled service's ``scaling`` block: its bounds, whether it is pinned, and the
    placements that run replicas now (``active``)."""
    active = list(service.active or ())
    return {
        "min": scaling.get("min", 1),
        "max": scaling.get("max") or placements,
        "idle_timeout": scaling.get("idle_timeout"),
        "pinned": service.pinned,
        "active": active,
        "running": len(active),
        "last_decision_at": service.scaled_at,
        "woken_at": service.woken_at,
    }


def preview_view(preview: Preview) -> dict[str, Any]:
    """A preview: the specification as checked (completed), and the plan.

    ``suggested`` (the paths filled) and ``warnings`` are there only when not empty,
    so a complete specification's preview that warns of nothing is unchanged.
    """
    view = {"spec": unstructure(preview.specification), **preview.plan.to_json()}
    specification = preview.specification
    if specification.scaling is not None:
        # Capacity planning for max replicas: which candidates are held at the start, which
        # are planned (shown, not held), and whether max of them fit together.
        replicas = preview.plan.replicas
        together = sum(1 for r in replicas if r.fits)
        view["scaling"] = {
            "min": specification.min_replicas,
            "max": specification.max_replicas,
            "held": [r.index for r in replicas if r.held],
            "planned": [r.index for r in replicas if not r.held],
            "fit_together": together,
            "max_fits": together >= specification.max_replicas,
        }
    if preview.suggested:
        view["suggested"] = list(preview.suggested)
    if preview.warnings:
        view["warnings"] = list(preview.warnings)
    return view


def _spent(row: UsageTotals | CredentialUsage | UsageRecord) -> dict[str, Any]:
    """A usage row as JSON, its spend in the words of ``GET /api/v1/usage`` (``spend`` in
    units, ``spend_milli`` exact) beside ``cost`` (milli-units; deprecated, kept for the
    clients that read it)."""
    return {**attrs.asdict(row, filter=stored), "spend": row.cost / MILLI, "spend_milli": row.cost}


def usage_view(summary: UsageSummary) -> dict[str, Any]:
    """A service's usage: totals, per-credential totals and the latest requests."""
    return {
        "service_id": summary.service_id,
        "alias": summary.alias,
        "since": summary.since,
        "totals": _spent(summary.totals),
        "by_credential": [_spent(row) for row in summary.by_credential],
        "recent": [_spent(row) for row in summary.recent],
    }


def status_view(status: ServiceStatus) -> dict[str, Any]:
    """A service's per-replica status (see :mod:`ficc_core.inference.reconciliation.status`)."""
    return attrs.asdict(status)
