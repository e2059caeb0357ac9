"""All SQL about contributor nodes: ``nodes``, ``node_attempts`` and ``node_assignments``.

Plain functions over a :class:`~ficc_core.store.Transaction`, so a caller composes
several in one transaction; they take and return the records of :mod:`.records`
and nothing else leaves this module as a row. The SQL is the portable subset
(``?`` placeholders, ``INSERT ... ON CONFLICT``, no JSON functions) that the
PostgreSQL backend also runs. JSON columns (labels, snapshot, inputs, GPU shares)
are encoded and decoded here.

Three reads look at other packages' tables because the node view, the blob
route and node removal need them: the inference reservations on a node, whether
a blob is verified and referenced by a model, and the replicas that name a node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..store import Row, Transaction
from .records import (
    ENDED_STATES,
    Assignment,
    AssignmentReason,
    GpuShare,
    Node,
    NodeAttempt,
    NodeAttemptState,
    NodeCredential,
    NodeReservation,
    NodeState,
)

_NODE_COLUMNS = (
    "id, name, state, labels, credential_id, connection_id, last_heartbeat, snapshot,"
    " created_at, revoked_at"
)
_ASSIGNMENT_COLUMNS = (
    "node_id, attempt_id, generation, plan_digest, provider, wanted, reason, updated_at, inputs"
)

# -- nodes ------------------------------------------------------------------------------------


def name_taken(tx: Transaction, name: str) -> bool:
    """Whether a node has ``name`` as its ID or its name."""
    return tx.fetch_one("SELECT id FROM nodes WHERE id = ? OR name = ?", (name, name)) is not None


def insert_node(
    tx: Transaction,
    *,
    name: str,
    labels: Mapping[str, str],
    credential_id: str,
    secret_hash: str,
    created_at: float,
) -> None:
    """Register node ``name`` (its ID is its name) as ``registered``."""
    tx.execute(
        "INSERT INTO nodes (id, name, labels, credential_id, secret_hash, state, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            name,
            name,
            json.dumps(dict(labels), sort_keys=True),
            credential_id,
            secret_hash,
            NodeState.REGISTERED.value,
            created_at,
        ),
    )


def fetch_node(tx: Transaction, node_id: str) -> Node | None:
    """One node with its reported attempts and its reservations, or None."""
    row = tx.fetch_one(f"SELECT {_NODE_COLUMNS} FROM nodes WHERE id = ?", (node_id,))
    return None if row is None else _node(tx, row)


def list_nodes(tx: Transaction) -> list[Node]:
    """Every node by name, each with its reported attempts and reservations."""
    return [
        _node(tx, row) for row in tx.fetch_all(f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY name")
    ]


def fetch_credential(tx: Transaction, credential_id: str) -> NodeCredential | None:
    """What checks node credential ``credential_id``, or None when no node has it."""
    row = tx.fetch_one(
        "SELECT id, secret_hash, revoked_at FROM nodes WHERE credential_id = ?", (credential_id,)
    )
    if row is None:
        return None
    return NodeCredential(
        credential_id=credential_id,
        node_id=row["id"],
        secret_hash=row["secret_hash"],
        revoked_at=row["revoked_at"],
    )


def mark_revoked(tx: Transaction, node_id: str, now: float) -> None:
    """Revoke the node's credential; it has no connection any more."""
    tx.execute(
        "UPDATE nodes SET revoked_at = ?, state = ?, connection_id = NULL WHERE id = ?",
        (now, NodeState.REVOKED.value, node_id),
    )
    tx.execute("DELETE FROM node_links WHERE node_id = ?", (node_id,))


def delete_node(tx: Transaction, node_id: str) -> None:
    """Remove the node: its record and credential, what it reported and was assigned."""
    for table in ("node_assignments", "node_attempts", "node_links"):
        tx.execute(f"DELETE FROM {table} WHERE node_id = ?", (node_id,))
    tx.execute("DELETE FROM nodes WHERE id = ?", (node_id,))


def set_connection(
    tx: Transaction, node_id: str, connection_id: str, controller_id: str = ""
) -> None:
    """Record the node's newest connection to ``controller_id`` (older ones to it are
    fenced out; a node keeps one to each controller sharing the store)."""
    tx.execute("UPDATE nodes SET connection_id = ? WHERE id = ?", (connection_id, node_id))
    tx.execute(
        "INSERT INTO node_links (node_id, controller_id, connection_id) VALUES (?, ?, ?) "
        "ON CONFLICT (node_id, controller_id) DO UPDATE SET connection_id = excluded.connection_id",
        (node_id, controller_id, connection_id),
    )


def link_connection(tx: Transaction, node_id: str, controller_id: str = "") -> str | None:
    """The node's newest connection to ``controller_id``, or None."""
    row = tx.fetch_one(
        "SELECT connection_id FROM node_links WHERE node_id = ? AND controller_id = ?",
        (node_id, controller_id),
    )
    return None if row is None else row["connection_id"]


def record_heartbeat(
    tx: Transaction,
    node_id: str,
    *,
    now: float,
    snapshot: str,
    attempts: Sequence[NodeAttempt],
) -> None:
    """The node is connected; ``snapshot`` (canonical JSON) and ``attempts`` replace the last."""
    tx.execute(
        "UPDATE nodes SET state = ?, last_heartbeat = ?, snapshot = ? WHERE id = ?",
        (NodeState.CONNECTED.value, now, snapshot, node_id),
    )
    tx.execute("DELETE FROM node_attempts WHERE node_id = ?", (node_id,))
    for attempt in attempts:
        tx.execute(
            "INSERT INTO node_attempts (node_id, attempt_id, generation, plan_digest, provider,"
            " state, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                node_id,
                attempt.attempt_id,
                attempt.generation,
                attempt.plan_digest,
                attempt.provider,
                attempt.state.value,
                attempt.updated_at,
            ),
        )


def set_state(tx: Transaction, node_id: str, state: NodeState) -> None:
    """Set the node's state (the sweep's unreachable and lost)."""
    tx.execute("UPDATE nodes SET state = ? WHERE id = ?", (state.value, node_id))


def silent_node_ids(
    tx: Transaction, *, now: float, silent_for: float, states: Iterable[NodeState]
) -> list[str]:
    """The nodes in one of ``states`` whose last heartbeat is ``silent_for`` seconds old or more."""
    wanted = [state.value for state in states]
    rows = tx.fetch_all(
        f"SELECT id FROM nodes WHERE state IN ({_placeholders(wanted)})"
        " AND last_heartbeat IS NOT NULL AND ? - last_heartbeat >= ? ORDER BY id",
        (*wanted, now, silent_for),
    )
    return [row["id"] for row in rows]


def mark_attempts_unknown(tx: Transaction, node_id: str, now: float) -> None:
    """Every attempt the node reported that had not ended becomes ``unknown``."""
    ended = sorted(state.value for state in ENDED_STATES)
    tx.execute(
        "UPDATE node_attempts SET state = ?, updated_at = ?"
        f" WHERE node_id = ? AND state NOT IN ({_placeholders(ended)})",
        (NodeAttemptState.UNKNOWN.value, now, node_id, *ended),
    )


def _node(tx: Transaction, row: Row) -> Node:
    attempts = tx.fetch_all(
        "SELECT attempt_id, generation, plan_digest, provider, state, updated_at"
        " FROM node_attempts WHERE node_id = ? ORDER BY attempt_id",
        (row["id"],),
    )
    reservations = tx.fetch_all(
        "SELECT service_id, replica, cpus, memory_bytes, disk_bytes, gpus"
        " FROM inference_reservations WHERE node_id = ? ORDER BY service_id, replica",
        (row["id"],),
    )
    return Node(
        id=row["id"],
        name=row["name"],
        state=NodeState(row["state"]),
        labels=json.loads(row["labels"]),
        credential_id=row["credential_id"],
        connection_id=row["connection_id"],
        last_heartbeat=row["last_heartbeat"],
        snapshot=json.loads(row["snapshot"]) if row["snapshot"] else None,
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
        attempts=tuple(
            NodeAttempt(
                attempt_id=a["attempt_id"],
                generation=a["generation"],
                plan_digest=a["plan_digest"],
                provider=a["provider"],
                state=NodeAttemptState(a["state"]),
                updated_at=a["updated_at"],
            )
            for a in attempts
        ),
        reservations=tuple(
            NodeReservation(
                service_id=r["service_id"],
                replica=r["replica"],
                cpus=r["cpus"],
                memory_bytes=r["memory_bytes"],
                disk_bytes=r["disk_bytes"],
                gpus=tuple(GpuShare(index, memory) for index, memory in json.loads(r["gpus"])),
            )
            for r in reservations
        ),
    )


# -- assignments ------------------------------------------------------------------------------


def put_assignment(tx: Transaction, assignment: Assignment) -> None:
    """Record ``assignment``, replacing an earlier one of the same node and attempt."""
    tx.execute(
        f"INSERT INTO node_assignments ({_ASSIGNMENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (node_id, attempt_id) DO UPDATE SET generation = excluded.generation,"
        " plan_digest = excluded.plan_digest, provider = excluded.provider,"
        " wanted = excluded.wanted, reason = excluded.reason,"
        " updated_at = excluded.updated_at, inputs = excluded.inputs",
        (
            assignment.node_id,
            assignment.attempt_id,
            assignment.generation,
            assignment.plan_digest,
            assignment.provider,
            1 if assignment.wanted else 0,
            None if assignment.reason is None else assignment.reason.value,
            assignment.updated_at,
            json.dumps(sorted(set(assignment.inputs))),
        ),
    )


def fetch_assignments(tx: Transaction, node_id: str) -> list[Assignment]:
    """Every assignment of ``node_id``, by attempt ID."""
    rows = tx.fetch_all(
        f"SELECT {_ASSIGNMENT_COLUMNS} FROM node_assignments WHERE node_id = ? ORDER BY attempt_id",
        (node_id,),
    )
    return [_assignment(row) for row in rows]


def fetch_assignment(tx: Transaction, node_id: str, attempt_id: str) -> Assignment | None:
    """One assignment, or None when the controller never assigned that attempt there."""
    row = tx.fetch_one(
        f"SELECT {_ASSIGNMENT_COLUMNS} FROM node_assignments WHERE node_id = ? AND attempt_id = ?",
        (node_id, attempt_id),
    )
    return None if row is None else _assignment(row)


def unwant(
    tx: Transaction, node_id: str, attempt_id: str, reason: AssignmentReason, now: float
) -> None:
    """The controller no longer wants the attempt (a no-op when it already did not)."""
    tx.execute(
        "UPDATE node_assignments SET wanted = 0, reason = ?, updated_at = ?"
        " WHERE node_id = ? AND attempt_id = ? AND wanted = 1",
        (reason.value, now, node_id, attempt_id),
    )


def set_unwanted(
    tx: Transaction, node_id: str, attempt_id: str, reason: AssignmentReason, now: float
) -> None:
    """The controller does not want the attempt, for ``reason``, wanted or not until now.

    Unlike :func:`unwant`, an assignment already unwanted takes the new reason too: an
    operator's acknowledgement (``acknowledged_unknown``) replaces the ``unknown`` that
    the node's loss left.
    """
    tx.execute(
        "UPDATE node_assignments SET wanted = 0, reason = ?, updated_at = ?"
        " WHERE node_id = ? AND attempt_id = ?",
        (reason.value, now, node_id, attempt_id),
    )


def unwant_all(tx: Transaction, node_id: str, reason: AssignmentReason, now: float) -> None:
    """The controller no longer wants anything it assigned to ``node_id``."""
    tx.execute(
        "UPDATE node_assignments SET wanted = 0, reason = ?, updated_at = ?"
        " WHERE node_id = ? AND wanted = 1",
        (reason.value, now, node_id),
    )


def wanted_inputs(tx: Transaction, node_id: str) -> set[str]:
    """The hex digests of every input of the attempts still wanted on ``node_id``.

    One indexed query (the assignments' primary key starts with the node); the
    lists are decoded here rather than in SQL, so no JSON function is needed.
    """
    rows = tx.fetch_all(
        "SELECT inputs FROM node_assignments WHERE node_id = ? AND wanted = 1", (node_id,)
    )
    return {digest for row in rows for digest in json.loads(row["inputs"])}


def _assignment(row: Row) -> Assignment:
    return Assignment(
        node_id=row["node_id"],
        attempt_id=row["attempt_id"],
        generation=row["generation"],
        plan_digest=row["plan_digest"],
        provider=row["provider"],
        wanted=bool(row["wanted"]),
        reason=None if row["reason"] is None else AssignmentReason(row["reason"]),
        updated_at=row["updated_at"],
        inputs=tuple(json.loads(row["inputs"])),
    )


# -- other packages' tables -------------------------------------------------------------------


def blob_published(tx: Transaction, sha256: str) -> bool:
    """Whether blob ``sha256`` (hex) is verified and a model references it."""
    row = tx.fetch_one(
        "SELECT 1 AS ok FROM blobs b WHERE b.sha256 = ? AND b.state = 'verified'"
        " AND EXISTS (SELECT 1 FROM model_files f WHERE f.sha256 = b.sha256)",
        (sha256,),
    )
    return row is not None


def replicas_on(tx: Transaction, node_id: str) -> list[dict[str, Any]]:
    """The replicas that name ``node_id``: each ``{service_id, alias, replica}`` once, of
    every service whose specification places a replica there or that has an attempt
    there not yet released (any project's)."""
    found: set[tuple[str, str, int]] = set()
    for row in tx.fetch_all("SELECT id, alias, spec FROM inference_services"):
        placements = json.loads(row["spec"]).get("placements", [])
        for index, placement in enumerate(placements):
            if isinstance(placement, dict) and placement.get("node_id") == node_id:
                found.add((row["id"], row["alias"], index))
    rows = tx.fetch_all(
        "SELECT a.service_id, s.alias, a.replica FROM inference_attempts a"
        " JOIN inference_services s ON s.id = a.service_id"
        " WHERE a.node_id = ? AND a.released = 0",
        (node_id,),
    )
    found.update((row["service_id"], row["alias"], row["replica"]) for row in rows)
    return [
        {"service_id": service_id, "alias": alias, "replica": replica}
        for service_id, alias, replica in sorted(found)
    ]


def _placeholders(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)
