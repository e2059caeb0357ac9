"""Migration 12: reservations keyed by generation, replica and node, kept across it."""

from __future__ import annotations

import sqlite3

import pytest

from ficc_core.store.migrations import statements
from ficc_core.store.sqlite import migrate


def test_reservations_keep_their_rows_and_take_the_service_generation(tmp_path):
    conn = sqlite3.connect(tmp_path / "db.sqlite", isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    for version in range(1, 10):
        for statement in statements(version, "sqlite"):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 9")
    conn.execute("INSERT INTO projects (id, name, created_at) VALUES ('p', 'p', 0)")
    conn.execute(
        "INSERT INTO inference_services (id, project_id, alias, model_id, spec, revision,"
        " generation, desired, state, created_at, updated_at)"
        " VALUES ('s', 'p', 'a', 'm', '{}', 9, 4, 'running', 'ready', 0, 0)"
    )
    conn.execute(
        "INSERT INTO inference_reservations (service_id, replica, node_id, cpus, memory_bytes,"
        " disk_bytes, gpus, created_at) VALUES ('s', 0, 'n1', 1.5, 10, 0, '[[0, 5]]', 3)"
    )
    migrate(conn)
    rows = conn.execute(
        "SELECT service_id, generation, replica, node_id, cpus, gpus FROM inference_reservations"
    ).fetchall()
    assert rows == [("s", 4, 0, "n1", 1.5, "[[0, 5]]")]
    # The same replica may now hold one on another node (a move's target), or for the
    # next generation (a rollout), but not twice the same.
    insert = (
        "INSERT INTO inference_reservations (service_id, generation, replica, node_id, cpus,"
        " memory_bytes, disk_bytes, gpus, created_at) VALUES ('s', ?, 0, ?, 1, 1, 0, '[]', 4)"
    )
    conn.execute(insert, (4, "n2"))
    conn.execute(insert, (5, "n1"))
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(insert, (4, "n1"))
    # Removing the service still takes its reservations and its rollout with it.
    conn.execute(
        "INSERT INTO inference_rollouts (service_id, generation, spec, plan_digest, started_at,"
        " deadline) VALUES ('s', 5, '{}', 'sha256:x', 0, 1)"
    )
    conn.execute("DELETE FROM inference_services WHERE id = 's'")
    assert conn.execute("SELECT COUNT(*) FROM inference_reservations").fetchone() == (0,)
    assert conn.execute("SELECT COUNT(*) FROM inference_rollouts").fetchone() == (0,)
