"""Every SQL statement of the inference package, as functions of a :class:`Transaction`.

The domain code composes these inside one ``store.read``/``store.write`` so that a
check and the write it guards happen in one transaction. They take and return the
records of :mod:`~ficc_core.inference.records` (with the placements'
:class:`~ficc_core.inference.records.Reservation` and ``PlacementNode``); nothing outside
this module sees a row. The SQL is what SQLite and PostgreSQL both run.

Tables: ``inference_services``, ``inference_attempts``, ``inference_reservations``,
``inference_rollouts`` (``inference_usage`` is :mod:`ficc_core.usage.repository`'s).
The contributors' tables (``nodes``, ``node_assignments``) are theirs: what placement
reads of a node, and telling nodes to drop given-up attempts, go through the statements
:mod:`ficc_core.contributors` offers other packages, in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import contributors
from ..contributors.records import AssignmentReason
from ..store import Transaction
from .records import (
    AttemptRecord,
    PlacementNode,
    Reservation,
    RolloutRecord,
    ServiceDetail,
    ServiceRecord,
)

_SERVICE_COLUMNS = (
    "id, project_id, alias, model_id, spec, revision, generation, desired, state, reason,"
    " plan_digest, drain_deadline, created_at, updated_at, active, pinned, scaled_at,"
    " woken_at"
)
_ATTEMPT_COLUMNS = (
    "attempt_id, service_id, replica, generation, number, node_id, provider, plan_digest,"
    " workload, state, reason, message, released, created_at, updated_at, pid, exit_code,"
    " signal, started_at, health, health_at, ready_at"
)
_RESERVATION_COLUMNS = (
    "service_id, generation, replica, node_id, cpus, memory_bytes, disk_bytes, gpus, created_at"
)


# -- services --------------------------------------------------------------------------------


def _service(row: Mapping[str, Any]) -> ServiceRecord:
    return ServiceRecord(**row)


def service(tx: Transaction, service_id: str) -> ServiceRecord | None:
    """The service ``service_id``, or None."""
    row = tx.fetch_one(
        f"SELECT {_SERVICE_COLUMNS} FROM inference_services WHERE id = ?", (service_id,)
    )
    return None if row is None else _service(row)


def service_ids(tx: Transaction, project_id: str | None = None) -> list[str]:
    """The ids of every service (of ``project_id`` when given), oldest first."""
    if project_id is None:
        rows = tx.fetch_all("SELECT id FROM inference_services ORDER BY created_at, id")
    else:
        rows = tx.fetch_all(
            "SELECT id FROM inference_services WHERE project_id = ? ORDER BY created_at, id",
            (project_id,),
        )
    return [row["id"] for row in rows]


def service_versions(tx: Transaction) -> dict[str, tuple[int, float]]:
    """Each service's revision and last change, by id: what a leader compares to notice
    services created or changed through another controller."""
    rows = tx.fetch_all("SELECT id, revision, updated_at FROM inference_services")
    return {row["id"]: (int(row["revision"]), float(row["updated_at"])) for row in rows}


def alias_holder(
    tx: Transaction, project_id: str, alias: str, *, other_than: str = ""
) -> str | None:
    """The id of the project's service called ``alias`` (other than ``other_than``), or None."""
    row = tx.fetch_one(
        "SELECT id FROM inference_services WHERE project_id = ? AND alias = ? AND id != ?",
        (project_id, alias, other_than),
    )
    return None if row is None else row["id"]


def insert_service(tx: Transaction, record: ServiceRecord) -> None:
    """Record a new service."""
    tx.execute(
        f"INSERT INTO inference_services ({_SERVICE_COLUMNS})"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.id,
            record.project_id,
            record.alias,
            record.model_id,
            record.spec,
            record.revision,
            record.generation,
            str(record.desired),
            str(record.state),
            record.reason,
            record.plan_digest,
            record.drain_deadline,
            record.created_at,
            record.updated_at,
            _active_json(record.active),
            int(record.pinned),
            record.scaled_at,
            record.woken_at,
        ),
    )


def _active_json(active: tuple[int, ...] | None) -> str | None:
    return None if active is None else json.dumps(list(active))


def set_scale(
    tx: Transaction,
    service_id: str,
    active: tuple[int, ...] | None,
    now: float,
    *,
    decided: bool = True,
    woken: bool = False,
    bump: bool = True,
) -> None:
    """Record the placements a scaled service runs now and, when ``decided``, that a
    scaling decision was made now (its cooldown), or, when ``woken``, that a request
    woke the idle service now (no cooldown); the service moves to its next revision
    unless ``bump`` is false (the transaction's other write of the service moves it)."""
    decided = decided and not woken
    tx.execute(
        "UPDATE inference_services SET revision = revision + ?, updated_at = ?, active = ?,"
        " scaled_at = CASE WHEN ? = 1 THEN ? ELSE scaled_at END,"
        " woken_at = CASE WHEN ? = 1 THEN ? ELSE woken_at END WHERE id = ?",
        (int(bump), now, _active_json(active), int(decided), now, int(woken), now, service_id),
    )


def set_pinned(tx: Transaction, service_id: str, pinned: bool, now: float) -> None:
    """Pin (never scale to zero) or unpin the service; it moves to its next revision."""
    tx.execute(
        "UPDATE inference_services SET revision = revision + 1, updated_at = ?, pinned = ?"
        " WHERE id = ?",
        (now, int(pinned), service_id),
    )


def update_service(tx: Transaction, record: ServiceRecord, now: float) -> None:
    """Write ``record``'s changeable fields and move the service to its next revision."""
    tx.execute(
        "UPDATE inference_services SET revision = revision + 1, updated_at = ?, alias = ?,"
        " model_id = ?, spec = ?, generation = ?, desired = ?, state = ?, reason = ?,"
        " plan_digest = ?, drain_deadline = ? WHERE id = ?",
        (
            now,
            record.alias,
            record.model_id,
            record.spec,
            record.generation,
            str(record.desired),
            str(record.state),
            record.reason,
            record.plan_digest,
            record.drain_deadline,
            record.id,
        ),
    )


def bump(tx: Transaction, service_id: str, now: float) -> None:
    """Move the service to its next revision (one of its attempts changed)."""
    tx.execute(
        "UPDATE inference_services SET revision = revision + 1, updated_at = ? WHERE id = ?",
        (now, service_id),
    )


def delete_service(tx: Transaction, service_id: str) -> None:
    """Forget a removed service (its attempts and reservations go with it)."""
    tx.execute("DELETE FROM inference_services WHERE id = ?", (service_id,))


def detail(tx: Transaction, service_id: str) -> ServiceDetail | None:
    """The service with its attempts and reservations, or None."""
    record = service(tx, service_id)
    if record is None:
        return None
    return ServiceDetail(
        service=record,
        attempts=tuple(attempts(tx, service_id)),
        reservations=tuple(reservations(tx, service_id)),
    )


# -- attempts --------------------------------------------------------------------------------


def attempts(tx: Transaction, service_id: str) -> list[AttemptRecord]:
    """The service's attempts, by replica, generation and number."""
    return [
        AttemptRecord(**row)
        for row in tx.fetch_all(
            f"SELECT {_ATTEMPT_COLUMNS} FROM inference_attempts WHERE service_id = ?"
            " ORDER BY replica, generation, number",
            (service_id,),
        )
    ]


def unreleased_attempts(tx: Transaction, service_id: str) -> list[AttemptRecord]:
    """The service's attempts whose end the executor has not confirmed (nor was given up)."""
    return [a for a in attempts(tx, service_id) if not a.released]


def attempt(tx: Transaction, attempt_id: str) -> AttemptRecord | None:
    """The attempt ``attempt_id``, or None."""
    row = tx.fetch_one(
        f"SELECT {_ATTEMPT_COLUMNS} FROM inference_attempts WHERE attempt_id = ?", (attempt_id,)
    )
    return None if row is None else AttemptRecord(**row)


def insert_attempt(tx: Transaction, record: AttemptRecord) -> None:
    """Record a new attempt."""
    tx.execute(
        f"INSERT INTO inference_attempts ({_ATTEMPT_COLUMNS}) VALUES ({', '.join('?' * 22)})",
        (
            record.attempt_id,
            record.service_id,
            record.replica,
            record.generation,
            record.number,
            record.node_id,
            record.provider,
            record.plan_digest,
            record.workload,
            str(record.state),
            record.reason,
            record.message,
            int(record.released),
            record.created_at,
            record.updated_at,
            *_engine_fields(record),
        ),
    )


def _engine_fields(record: AttemptRecord) -> tuple[Any, ...]:
    """The engine's columns, in ``_ATTEMPT_COLUMNS`` order."""
    return (
        record.pid,
        record.exit_code,
        record.signal,
        record.started_at,
        record.health,
        record.health_at,
        record.ready_at,
    )


def update_attempt(tx: Transaction, record: AttemptRecord, now: float) -> None:
    """Write ``record``'s changeable fields."""
    tx.execute(
        "UPDATE inference_attempts SET plan_digest = ?, workload = ?, state = ?, reason = ?,"
        " message = ?, released = ?, updated_at = ?, pid = ?, exit_code = ?, signal = ?,"
        " started_at = ?, health = ?, health_at = ?, ready_at = ? WHERE attempt_id = ?",
        (
            record.plan_digest,
            record.workload,
            str(record.state),
            record.reason,
            record.message,
            int(record.released),
            now,
            *_engine_fields(record),
            record.attempt_id,
        ),
    )


def give_up_attempts(
    tx: Transaction, service_id: str, reason: AssignmentReason, now: float
) -> None:
    """Release every unreleased attempt of the service, and tell their nodes to drop them
    (each assignment takes ``reason``, even one its node's loss already unwanted)."""
    for record in unreleased_attempts(tx, service_id):
        contributors.set_unwanted(tx, record.node_id, record.attempt_id, reason, now)
    tx.execute(
        "UPDATE inference_attempts SET released = 1, reason = ?, updated_at = ?"
        " WHERE service_id = ? AND released = 0",
        (reason.value, now, service_id),
    )


# -- reservations ------------------------------------------------------------------------------


def _reservation(row: Mapping[str, Any]) -> Reservation:
    return Reservation(
        service_id=row["service_id"],
        replica=row["replica"],
        node_id=row["node_id"],
        cpus=row["cpus"],
        memory_bytes=row["memory_bytes"],
        disk_bytes=row["disk_bytes"],
        gpus=tuple((int(i), int(m)) for i, m in json.loads(row["gpus"])),
        generation=row["generation"],
    )


def reservations(tx: Transaction, service_id: str) -> list[Reservation]:
    """What the service's replicas hold, by replica, generation and node."""
    return [
        _reservation(row)
        for row in tx.fetch_all(
            f"SELECT {_RESERVATION_COLUMNS} FROM inference_reservations WHERE service_id = ?"
            " ORDER BY replica, generation, node_id",
            (service_id,),
        )
    ]


def reservations_but(tx: Transaction, service_id: str) -> list[Reservation]:
    """What every other service holds (what ``service_id`` is planned beside)."""
    return [
        _reservation(row)
        for row in tx.fetch_all(
            f"SELECT {_RESERVATION_COLUMNS} FROM inference_reservations WHERE service_id != ?",
            (service_id,),
        )
    ]


def insert_reservations(tx: Transaction, held: Iterable[Reservation], now: float) -> None:
    """Record what each replica holds."""
    for reservation in held:
        tx.execute(
            f"INSERT INTO inference_reservations ({_RESERVATION_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                reservation.service_id,
                reservation.generation,
                reservation.replica,
                reservation.node_id,
                reservation.cpus,
                reservation.memory_bytes,
                reservation.disk_bytes,
                json.dumps([list(gpu) for gpu in reservation.gpus]),
                now,
            ),
        )


def delete_reservations(tx: Transaction, service_id: str) -> None:
    """Drop every reservation of the service."""
    tx.execute("DELETE FROM inference_reservations WHERE service_id = ?", (service_id,))


def delete_reservation(tx: Transaction, service_id: str, replica: int) -> None:
    """Drop one replica's reservations (of every generation and node)."""
    for held in reservations(tx, service_id):
        if held.replica == replica:
            delete_reservation_key(tx, service_id, held.key)


def delete_reservation_key(tx: Transaction, service_id: str, key: tuple[int, int, str]) -> None:
    """Drop the service's reservation ``(generation, replica, node_id)``.

    One reservation per node carries the disk of the model's staged copy, which serves
    every replica of that generation there (placement's ``staged``). When that one goes
    and another stays on the node, the copy stays too: its disk passes to the replica
    with the lowest index there, so the node's disk is never counted short."""
    generation, replica, node_id = key
    where = " WHERE service_id = ? AND generation = ? AND node_id = ?"
    row = tx.fetch_one(
        "SELECT disk_bytes FROM inference_reservations" + where + " AND replica = ?",
        (service_id, generation, node_id, replica),
    )
    tx.execute(
        "DELETE FROM inference_reservations" + where + " AND replica = ?",
        (service_id, generation, node_id, replica),
    )
    if row is None or not row["disk_bytes"]:
        return
    heir = tx.fetch_one(
        "SELECT replica, disk_bytes FROM inference_reservations" + where
        + " ORDER BY disk_bytes DESC, replica LIMIT 1",
        (service_id, generation, node_id),
    )  # fmt: skip
    if heir is not None and not heir["disk_bytes"]:
        tx.execute(
            "UPDATE inference_reservations SET disk_bytes = ?" + where + " AND replica = ?",
            (row["disk_bytes"], service_id, generation, node_id, heir["replica"]),
        )


# -- rollouts ------------------------------------------------------------------------------------


def rollout(tx: Transaction, service_id: str) -> RolloutRecord | None:
    """The service's pending rollout, or None."""
    row = tx.fetch_one(
        "SELECT service_id, generation, spec, plan_digest, started_at, deadline, strategy, step"
        " FROM inference_rollouts WHERE service_id = ?",
        (service_id,),
    )
    return None if row is None else RolloutRecord(**row)


def insert_rollout(tx: Transaction, record: RolloutRecord) -> None:
    """Record a pending rollout (one per service)."""
    tx.execute(
        "INSERT INTO inference_rollouts (service_id, generation, spec, plan_digest, started_at,"
        " deadline, strategy, step) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.service_id,
            record.generation,
            record.spec,
            record.plan_digest,
            record.started_at,
            record.deadline,
            record.strategy,
            record.step,
        ),
    )


def set_rollout_step(tx: Transaction, service_id: str, generation: int, step: int) -> None:
    """A rolling rollout hands ``step`` replicas over to its next generation."""
    tx.execute(
        "UPDATE inference_rollouts SET step = ? WHERE service_id = ? AND generation = ?",
        (step, service_id, generation),
    )


def delete_rollout(tx: Transaction, service_id: str) -> None:
    """The rollout is over (cut over, or failed)."""
    tx.execute("DELETE FROM inference_rollouts WHERE service_id = ?", (service_id,))


# -- nodes (read in the transaction that places or launches on them) --------------------------


def placement_nodes(tx: Transaction, node_ids: Sequence[str]) -> dict[str, PlacementNode]:
    """The nodes of ``node_ids`` that are on record, as placement sees them."""
    found = {}
    for node_id in node_ids:
        node = contributors.fetch_node(tx, node_id)
        if node is not None:
            found[node_id] = PlacementNode.of(node)
    return found
