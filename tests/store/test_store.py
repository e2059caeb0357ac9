"""The store on both backends: migrations on open, transactions, off-loop execution.

Every test with ``store_backend`` runs against a real SQLite file and a real PostgreSQL
database (tests/support/pg_support.py); the backend-specific ones follow.
"""

from __future__ import annotations

import sqlite3
import threading

import pytest
import trio

from ficc_core.base.errors import StoreError, StoreUnavailable
from ficc_core.store import open_sqlite_store
from ficc_core.store.migrations import MIGRATIONS

from ..conftest import open_same_store


def _insert_project(id_: str, name: str, created_at: float = 1.0):
    return lambda tx: tx.execute(
        "INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?)", (id_, name, created_at)
    )


async def test_open_migrates_to_the_newest_schema(store_backend):
    assert store_backend.schema_version == len(MIGRATIONS)
    count = await store_backend.read(lambda tx: tx.fetch_one("SELECT count(*) AS n FROM users"))
    assert count == {"n": 0}


async def test_reopening_keeps_data_and_does_not_rerun_migrations(store_backend):
    await store_backend.write(_insert_project("p1", "kept"))
    again = await open_same_store(store_backend)
    try:
        assert again.schema_version == len(MIGRATIONS)
        row = await again.read(lambda tx: tx.fetch_one("SELECT name FROM projects"))
        assert row == {"name": "kept"}
    finally:
        await again.aclose()


async def test_a_failing_write_leaves_nothing_behind(store_backend):
    def two_rows_then_fail(tx):
        tx.execute("INSERT INTO projects (id, name, created_at) VALUES ('a', 'a', 1)")
        tx.execute("INSERT INTO projects (id, name, created_at) VALUES ('b', 'b', 1)")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await store_backend.write(two_rows_then_fail)
    count = await store_backend.read(lambda tx: tx.fetch_one("SELECT count(*) AS n FROM projects"))
    assert count == {"n": 0}
    # The connection is usable again after the rollback.
    await store_backend.write(_insert_project("c", "c"))


async def test_after_commit_runs_once_committed_and_never_after_a_rollback(store_backend):
    ran: list[str] = []

    def committed(tx):
        tx.execute("INSERT INTO projects (id, name, created_at) VALUES ('a', 'a', 1)")
        tx.after_commit(lambda: ran.append("committed"))
        tx.after_commit(lambda: 1 / 0)  # logged; the transaction stands
        tx.after_commit(lambda: ran.append("after a failing callback"))

    def rolled_back(tx):
        tx.after_commit(lambda: ran.append("rolled back"))
        raise RuntimeError("boom")

    await store_backend.write(committed)
    with pytest.raises(RuntimeError):
        await store_backend.write(rolled_back)
    assert ran == ["committed", "after a failing callback"]
    row = await store_backend.read(lambda tx: tx.fetch_one("SELECT id FROM projects"))
    assert row == {"id": "a"}


async def test_store_calls_run_in_worker_threads_not_on_the_event_loop(store_backend):
    loop_thread = threading.get_ident()
    read_thread = await store_backend.read(lambda tx: threading.get_ident())
    write_thread = await store_backend.write(lambda tx: threading.get_ident())
    assert loop_thread not in (read_thread, write_thread)


@pytest.mark.deadline(70)
async def test_concurrent_read_modify_write_transactions_do_not_lose_updates(store_backend):
    await store_backend.write(_insert_project("c", "counter", 0))

    def increment(tx):
        value = tx.fetch_one("SELECT created_at FROM projects WHERE id = 'c'")["created_at"]
        tx.execute("UPDATE projects SET created_at = ? WHERE id = 'c'", (value + 1,))

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(store_backend.write, increment)
    row = await store_backend.read(lambda tx: tx.fetch_one("SELECT created_at FROM projects"))
    assert row["created_at"] == 50


@pytest.mark.deadline(40)
async def test_a_read_sees_one_snapshot_while_a_write_commits_beside_it(store_backend):
    await store_backend.write(_insert_project("a", "a"))
    first_read, written = threading.Event(), threading.Event()

    def read_twice(tx):
        before = tx.fetch_one("SELECT count(*) AS n FROM projects")["n"]
        first_read.set()
        assert written.wait(30)
        return before, tx.fetch_one("SELECT count(*) AS n FROM projects")["n"]

    counts = []

    async def reader():
        counts.append(await store_backend.read(read_twice))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.to_thread.run_sync(first_read.wait)
            await store_backend.write(_insert_project("b", "b"))
            written.set()
    assert counts == [(1, 1)]
    after = await store_backend.read(lambda tx: tx.fetch_one("SELECT count(*) AS n FROM projects"))
    assert after == {"n": 2}


async def test_the_portable_sql_reads_the_same_on_both_backends(store_backend):
    """What the dialect translates (placeholders, INSERT OR IGNORE, a literal % and ?,
    bool parameters) and the types the schema's columns must hold on both."""
    big = 3 * 2**40  # a file size past 2^31 (INTEGER is BIGINT on PostgreSQL)
    at = 1_765_432_109.123456  # a timestamp keeps its fraction (REAL is DOUBLE PRECISION)

    def write(tx):
        tx.execute(
            "INSERT INTO users (id, username, password_hash, is_admin, created_at)"
            " VALUES (?, ?, 'x', ?, ?)",
            ("u1", "admin", True, at),
        )
        inserted = tx.execute(
            "INSERT OR IGNORE INTO projects (id, name, created_at) VALUES (?, ?, 0)", ("p", "p")
        )
        ignored = tx.execute(
            "INSERT OR IGNORE INTO projects (id, name, created_at) VALUES (?, ?, 0)", ("p", "p")
        )
        tx.execute(
            "INSERT INTO blobs (sha256, size, state, updated_at) VALUES (?, ?, 'partial', ?)",
            ("s" * 64, big, at),
        )
        return inserted, ignored

    assert await store_backend.write(write) == (1, 0)

    def read(tx):
        return (
            tx.fetch_one("SELECT username FROM users WHERE is_admin = ?", (True,)),
            tx.fetch_one("SELECT '100%?' AS text, ? AS param", ("50%",)),
            tx.fetch_one("SELECT size, updated_at FROM blobs"),
            tx.fetch_one("SELECT SUM(size) AS total, COUNT(*) AS n FROM blobs"),
            tx.fetch_one("SELECT created_at FROM users"),
        )

    admin, literal, blob, total, user = await store_backend.read(read)
    assert admin == {"username": "admin"}
    assert literal == {"text": "100%?", "param": "50%"}
    assert blob == {"size": big, "updated_at": at}
    assert total == {"total": big, "n": 1}
    assert type(total["total"]) is int
    assert user == {"created_at": at}


async def test_event_ids_grow_and_are_never_reused_after_a_prune(store_backend):
    def add(tx) -> int:
        return tx.fetch_one(
            "INSERT INTO events (at, kind, subject, subject_id) VALUES (1, 'k', 's', 'x')"
            " RETURNING id"
        )["id"]

    first = await store_backend.write(add)
    second = await store_backend.write(add)
    await store_backend.write(lambda tx: tx.execute("DELETE FROM events"))
    third = await store_backend.write(add)
    assert first < second < third


# -- SQLite ---------------------------------------------------------------------------


async def test_sqlite_opens_the_database_in_wal_mode(tmp_path):
    path = tmp_path / "deep" / "ficc.sqlite3"
    store = await open_sqlite_store(path)
    try:
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"projects", "users", "credentials", "sessions", "memberships"} <= tables
        conn.close()
    finally:
        await store.aclose()


@pytest.mark.deadline(60)
async def test_a_sqlite_database_from_a_newer_ficc_is_refused_untouched(tmp_path):
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


async def test_sqlite_that_cannot_be_had_now_is_a_503_and_a_wrong_statement_is_not(tmp_path):
    store = await open_sqlite_store(tmp_path / "ficc.sqlite3")

    def locked(tx):
        raise sqlite3.OperationalError("database is locked")

    try:
        with pytest.raises(StoreUnavailable) as caught:
            await store.write(locked)
        assert caught.value.headers["Retry-After"] and caught.value.status == 503
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store.read(lambda tx: tx.fetch_one("SELECT * FROM nowhere"))
        await store.write(_insert_project("a", "a"))  # rolled back cleanly both times
    finally:
        await store.aclose()


async def test_sqlite_reads_after_or_across_a_close_raise_instead_of_waiting_for_ever(tmp_path):
    """A read held up (an authority read waiting out a hung store, a busy reader pool)
    reaches the store after it closed: it raises at once. It waited for ever for a
    reader connection the close had taken, and the test run hung at a teardown."""
    store = await open_sqlite_store(tmp_path / "ficc.sqlite3", readers=1)
    busy, release = threading.Event(), threading.Event()

    def hold(tx):
        busy.set()
        release.wait(10)
        return tx.fetch_one("SELECT count(*) AS n FROM projects")

    results: list[object] = []

    async def read(fn):
        try:
            results.append(await store.read(fn))
        except StoreError as exc:
            results.append(exc.message)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, hold)  # takes the one reader connection
            await trio.to_thread.run_sync(busy.wait)
            # This one waits for the reader while the store closes, then takes its turn.
            nursery.start_soon(read, lambda tx: tx.fetch_one("SELECT 1 AS one"))
            await trio.sleep(0.05)
            await store.aclose()
            release.set()
        with pytest.raises(StoreError, match="closed"):
            await store.read(lambda tx: tx.fetch_one("SELECT 1 AS one"))
    assert results == [{"n": 0}, "the store is closed"]
