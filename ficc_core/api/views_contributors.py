"""The JSON views of contributor nodes: what ``GET /api/v1/contributors`` and the CLI show."""

from __future__ import annotations

from typing import Any

from ..contributors import Node, NodeAttempt, NodeReservation


def node_view(node: Node) -> dict[str, Any]:
    """A node with its state, labels, last heartbeat, snapshot, reservations and attempts.

    The credential's secret hash and the connection ID are never shown.
    """
    return {
        "id": node.id,
        "name": node.name,
        "state": node.state.value,
        "labels": dict(node.labels),
        "credential_id": node.credential_id,
        "last_heartbeat": node.last_heartbeat,
        "created_at": node.created_at,
        "revoked_at": node.revoked_at,
        "snapshot": None if node.snapshot is None else dict(node.snapshot),
        "reservations": [_reservation_view(r) for r in node.reservations],
        "attempts": [_attempt_view(a) for a in node.attempts],
    }


def removal_view(node: Node) -> dict[str, Any]:
    """What removing ``node`` answers: which node it was and the state it was in."""
    return {"id": node.id, "name": node.name, "state": node.state.value, "removed": True}


def _reservation_view(reservation: NodeReservation) -> dict[str, Any]:
    return {
        "service_id": reservation.service_id,
        "replica": reservation.replica,
        "cpus": reservation.cpus,
        "memory_bytes": reservation.memory_bytes,
        "disk_bytes": reservation.disk_bytes,
        "gpus": [{"index": g.index, "memory_bytes": g.memory_bytes} for g in reservation.gpus],
    }


def _attempt_view(attempt: NodeAttempt) -> dict[str, Any]:
    return {
        "attempt_id": attempt.attempt_id,
        "generation": attempt.generation,
        "plan_digest": attempt.plan_digest,
        "provider": attempt.provider,
        "state": attempt.state.value,
        "updated_at": attempt.updated_at,
    }
