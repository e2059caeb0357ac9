"""All SQL about events: the ``events`` table.

Plain functions over a :class:`~ficc_core.store.Transaction`, in the portable
subset (``?`` placeholders, ``INSERT ... RETURNING``, no JSON functions): the
details are encoded and decoded here. IDs only grow (the store has one writer, so
they also follow the commit order): a reader pages on with ``after``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..store import Row, Transaction
from .records import Event, Subject

_COLUMNS = (
    "id, at, kind, subject, subject_id, service_id, project_id, node_id, attempt_id, replica,"
    " reason, message, details"
)


def insert(tx: Transaction, event: Event) -> Event:
    """Write ``event`` (its ``id`` is ignored); return it with the ID it was given."""
    row = tx.fetch_one(
        "INSERT INTO events (at, kind, subject, subject_id, service_id, project_id, node_id,"
        " attempt_id, replica, reason, message, details)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            event.at,
            event.kind.value,
            event.subject.value,
            event.subject_id,
            event.service_id,
            event.project_id,
            event.node_id,
            event.attempt_id,
            event.replica,
            event.reason,
            event.message,
            json.dumps(event.details, sort_keys=True, separators=(",", ":")),
        ),
    )
    assert row is not None
    return attrs.evolve(event, id=row["id"])


def _page(
    tx: Transaction,
    where: str,
    params: Sequence[Any],
    after: int | None,
    limit: int,
    before: int | None = None,
) -> list[Event]:
    """The first ``limit`` events after ``after``, or (without it) the newest ``limit``
    (before ``before`` when given: the page older than one already read); oldest first
    either way."""
    if after is not None:
        rows = tx.fetch_all(
            f"SELECT {_COLUMNS} FROM events WHERE id > ? AND ({where}) ORDER BY id LIMIT ?",
            (after, *params, limit),
        )
    elif before is not None:
        rows = tx.fetch_all(
            f"SELECT {_COLUMNS} FROM events WHERE id < ? AND ({where}) ORDER BY id DESC LIMIT ?",
            (before, *params, limit),
        )
        rows.reverse()
    else:
        rows = tx.fetch_all(
            f"SELECT {_COLUMNS} FROM events WHERE {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        rows.reverse()
    return [_event(row) for row in rows]


def for_service(
    tx: Transaction,
    service_id: str,
    *,
    node_ids: Sequence[str] = (),
    nodes_since: float = 0.0,
    after: int | None = None,
    before: int | None = None,
    limit: int,
) -> list[Event]:
    """The service's events, with the node events (since ``nodes_since``) of ``node_ids``.

    Two reads, each on its own index, merged: one ``OR`` would scan every node event.
    """
    found = _page(tx, "service_id = ?", (service_id,), after, limit, before)
    if not node_ids:
        return found
    marks = ", ".join("?" for _ in node_ids)
    found += _page(
        tx,
        f"node_id IN ({marks}) AND subject = ? AND at >= ?",
        (*node_ids, Subject.NODE.value, nodes_since),
        after,
        limit,
        before,
    )
    found.sort(key=lambda event: event.id)
    return found[:limit] if after is not None else found[-limit:]


def for_node(tx: Transaction, node_id: str, *, after: int | None = None, limit: int) -> list[Event]:
    """The node's own events (its state changes)."""
    return _page(tx, "node_id = ? AND subject = ?", (node_id, Subject.NODE.value), after, limit)


def prune(tx: Transaction, *, before: float, keep: int) -> int:
    """Delete events older than ``before``, and all but the newest ``keep`` of each
    service (and of each node's own events); return how many went."""
    deleted = tx.execute("DELETE FROM events WHERE at < ?", (before,))
    crowded = tx.fetch_all(
        "SELECT service_id FROM events WHERE service_id IS NOT NULL"
        " GROUP BY service_id HAVING COUNT(*) > ?",
        (keep,),
    )
    for row in crowded:
        deleted += _keep_newest(tx, "service_id = ?", (row["service_id"],), keep)
    crowded = tx.fetch_all(
        "SELECT node_id FROM events WHERE service_id IS NULL AND node_id IS NOT NULL"
        " GROUP BY node_id HAVING COUNT(*) > ?",
        (keep,),
    )
    for row in crowded:
        deleted += _keep_newest(tx, "service_id IS NULL AND node_id = ?", (row["node_id"],), keep)
    return deleted


def _keep_newest(tx: Transaction, where: str, params: Sequence[Any], keep: int) -> int:
    oldest_kept = tx.fetch_one(
        f"SELECT id FROM events WHERE {where} ORDER BY id DESC LIMIT 1 OFFSET ?",
        (*params, keep - 1),
    )
    if oldest_kept is None:
        return 0
    return tx.execute(
        f"DELETE FROM events WHERE ({where}) AND id < ?", (*params, oldest_kept["id"])
    )


def count(tx: Transaction) -> int:
    """How many events are kept."""
    row = tx.fetch_one("SELECT COUNT(*) AS n FROM events")
    return 0 if row is None else int(row["n"])


def _event(row: Mapping[str, Any] | Row) -> Event:
    return Event(
        id=row["id"],
        at=row["at"],
        kind=row["kind"],
        subject=row["subject"],
        subject_id=row["subject_id"],
        service_id=row["service_id"],
        project_id=row["project_id"],
        node_id=row["node_id"],
        attempt_id=row["attempt_id"],
        replica=row["replica"],
        reason=row["reason"],
        message=row["message"],
        details=json.loads(row["details"]),
    )


__all__ = ["count", "for_node", "for_service", "insert", "prune"]
