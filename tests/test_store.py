"""The SQLite store: WAL, migrations on open, transactions, off-loop execution."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import trio

from ficc_core.errors import StoreError
from ficc_core.store import open_sqlite_store
from ficc_core.store.migrations import MIGRATIONS


async def test_open_creates_the_database_in_wal_mode_at_the_newest_schema(tmp_path):
    path = tmp_path / "deep" / "ficc.sqlite3"
    store = await open_sqlite_store(path)
    try:
        assert store.schema_version == len(MIGRATIONS)
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"projects", "users", "credentials", "sessions", "memberships"} <= tables
        conn.close()
    finally:
        await store.aclose()


async def test_reopening_keeps_data_and_does_not_rerun_migrations(tmp_path):
    path = tmp_path / "ficc.sqlite3"
    store = await open_sqlite_store(path)
    await store.write(
        lambda tx: tx.execute(
            "INSERT INTO projects (id, name, created_at) VALUES ('p1', 'kept', 1.0)"
        )
    )
    await store.aclose()
    store = await open_sqlite_store(path)
    try:
        row = await store.read(lambda tx: tx.fetch_one("SELECT name FROM projects"))
        assert row == {"name": "kept"}
    finally:
        await store.aclose()


async def test_a_database_from_a_newer_ficc_is_refused_untouched(tmp_path):
    path = tmp_path / "ficc.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this FICC"):
        await open_sqlite_store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) + 5
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    conn.close()


async def test_a_failing_write_leaves_nothing_behind(tmp_path):
    store = await open_sqlite_store(tmp_path / "ficc.sqlite3")
    try:

        def two_rows_then_fail(tx):
            tx.execute("INSERT INTO projects (id, name, created_at) VALUES ('a', 'a', 1)")
            tx.execute("INSERT INTO projects (id, name, created_at) VALUES ('b', 'b', 1)")
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            await store.write(two_rows_then_fail)
        count = await store.read(lambda tx: tx.fetch_one("SELECT count(*) AS n FROM projects"))
        assert count == {"n": 0}
    finally:
        await store.aclose()


async def test_store_calls_run_in_worker_threads_not_on_the_event_loop(tmp_path):
    store = await open_sqlite_store(tmp_path / "ficc.sqlite3")
    try:
        loop_thread = threading.get_ident()
        read_thread = await store.read(lambda tx: threading.get_ident())
        write_thread = await store.write(lambda tx: threading.get_ident())
        assert loop_thread not in (read_thread, write_thread)
    finally:
        await store.aclose()


async def test_concurrent_read_modify_write_transactions_do_not_lose_updates(tmp_path):
    store = await open_sqlite_store(tmp_path / "ficc.sqlite3")
    try:
        await store.write(
            lambda tx: tx.execute(
                "INSERT INTO projects (id, name, created_at) VALUES ('c', 'counter', 0)"
            )
        )

        def increment(tx):
            value = tx.fetch_one("SELECT created_at FROM projects WHERE id = 'c'")["created_at"]
            tx.execute("UPDATE projects SET created_at = ? WHERE id = 'c'", (value + 1,))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(store.write, increment)
        row = await store.read(lambda tx: tx.fetch_one("SELECT created_at FROM projects"))
        assert row["created_at"] == 50
    finally:
        await store.aclose()
