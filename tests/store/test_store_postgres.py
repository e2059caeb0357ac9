"""The PostgreSQL store's own guarantees, against a real server (tests/support/pg_support.py):
writes of two controllers serialise, a busy pool or a stopped server is a 503 with
Retry-After (never a hang), the pool reconnects, migrations run once and refuse a newer
database."""

from __future__ import annotations

import threading

import psycopg
import pytest
import trio

from ficc_core.api.app import create_app
from ficc_core.base.errors import StoreError, StoreUnavailable
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.store import open_store
from ficc_core.store.migrations import MIGRATIONS
from ficc_core.store.postgres import RETRY_BUSY, WRITE_LOCK, open_postgres_store

from ..conftest import bearer, issue_token


def _waiting_for_the_write_lock(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND objid = %s",
            (WRITE_LOCK,),
        ).fetchone()[0]


@pytest.mark.deadline(40)
async def test_two_controllers_racing_for_the_last_slice_exactly_one_wins(pg_url):
    """Two stores (two pools: two controllers) run the same read-check-insert: the
    second's check waits for the first's commit, sees its row, and refuses."""
    first, second = await open_postgres_store(pg_url), await open_postgres_store(pg_url)
    first_checked, second_waits = threading.Event(), threading.Event()

    def claim(tx, hold: bool) -> bool:
        taken = tx.fetch_one("SELECT count(*) AS n FROM events WHERE subject_id = 'last-slice'")
        if taken["n"]:
            return False
        if hold:  # checked and found it free: hold until the other one is at the lock
            first_checked.set()
            assert second_waits.wait(30)
        tx.execute(
            "INSERT INTO events (at, kind, subject, subject_id) VALUES (1, 'reserved', 's',"
            " 'last-slice')"
        )
        return True

    results: dict[str, bool] = {}

    async def run(name, store, hold):
        results[name] = await store.write(lambda tx: claim(tx, hold))

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "first", first, True)
                await trio.to_thread.run_sync(first_checked.wait)
                nursery.start_soon(run, "second", second, False)
                while await trio.to_thread.run_sync(_waiting_for_the_write_lock, pg_url) < 1:  # noqa: ASYNC110  (polling pg_locks: nothing to wait on)
                    await trio.sleep(0.02)
                second_waits.set()
        assert results == {"first": True, "second": False}
        rows = await second.read(
            lambda tx: tx.fetch_all("SELECT id FROM events WHERE subject_id = 'last-slice'")
        )
        assert len(rows) == 1
    finally:
        await first.aclose()
        await second.aclose()


@pytest.mark.deadline(40)
async def test_reads_do_not_wait_for_a_write_in_progress(pg_url):
    store = await open_postgres_store(pg_url)
    writing, done = threading.Event(), threading.Event()

    def slow_write(tx):
        tx.execute("INSERT INTO projects (id, name, created_at) VALUES ('a', 'a', 1)")
        writing.set()
        assert done.wait(30)

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.write, slow_write)
                await trio.to_thread.run_sync(writing.wait)
                row = await store.read(
                    lambda tx: tx.fetch_one("SELECT count(*) AS n FROM projects")
                )
                assert row == {"n": 0}  # the uncommitted row is not seen, and nothing waited
                done.set()
    finally:
        await store.aclose()


@pytest.mark.deadline(40)
async def test_every_connection_busy_past_the_pool_timeout_is_a_503_with_retry_after(pg_url):
    store = await open_postgres_store(pg_url, pool_size=2, pool_timeout=0.5)
    started, release = threading.Semaphore(0), threading.Event()

    def hold(tx):
        started.release()
        assert release.wait(30)

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.read, hold)
                nursery.start_soon(store.read, hold)
                for _ in range(2):
                    await trio.to_thread.run_sync(started.acquire)
                before = trio.current_time()
                with pytest.raises(StoreUnavailable) as caught:
                    await store.read(lambda tx: tx.fetch_one("SELECT 1 AS one"))
                assert trio.current_time() - before < 5
                release.set()
        error = caught.value
        assert error.status == 503 and error.code == "store_unavailable"
        assert error.headers["Retry-After"] == str(RETRY_BUSY)
        assert error.details["retry_after"] == RETRY_BUSY
        # Once released, the pool serves again.
        assert await store.read(lambda tx: tx.fetch_one("SELECT 1 AS one")) == {"one": 1}
    finally:
        await store.aclose()


@pytest.mark.deadline(70)
async def test_a_stopped_server_is_a_503_not_a_hang_and_the_store_recovers(pg_own_server):
    server = pg_own_server
    name = server.create_database()
    store = await open_postgres_store(server.url(name), pool_size=3, pool_timeout=1)
    try:
        await store.write(lambda tx: tx.execute("INSERT INTO projects VALUES ('a', 'a', 1, NULL)"))
        await trio.to_thread.run_sync(server.stop)
        with trio.fail_after(30):
            # Requests go on failing fast for a while (the pool's retries back off).
            for call in (store.read, store.write) * 3:
                before = trio.current_time()
                with pytest.raises(StoreUnavailable) as caught:
                    await call(lambda tx: tx.fetch_one("SELECT count(*) AS n FROM projects"))
                assert trio.current_time() - before < 4  # the pool timeout, and a margin
                assert caught.value.headers["Retry-After"]
        await trio.to_thread.run_sync(server.start)
        back = trio.current_time()
        with trio.fail_after(30):
            while True:  # the pool replaces its broken connections; poll until it has
                try:
                    row = await store.read(
                        lambda tx: tx.fetch_one("SELECT count(*) AS n FROM projects")
                    )
                    break
                except StoreUnavailable:
                    await trio.sleep(0.1)
        assert row == {"n": 1}
        assert trio.current_time() - back < 6, "the store came back long after the server"
        await store.write(lambda tx: tx.execute("INSERT INTO projects VALUES ('b', 'b', 1, NULL)"))
    finally:
        await store.aclose()


@pytest.mark.deadline(30)
async def test_opening_an_unreachable_server_fails_within_the_pool_timeout(pg_own_server):
    url = pg_own_server.url()
    await trio.to_thread.run_sync(pg_own_server.stop)
    with trio.fail_after(20), pytest.raises(StoreError, match="cannot connect"):
        await open_postgres_store(url, pool_timeout=1)


@pytest.mark.deadline(30)
async def test_a_refused_connection_at_start_says_why(pg_server):
    missing = pg_server.url("no_such_database")
    with trio.fail_after(20), pytest.raises(StoreError, match='"no_such_database" does not exist'):
        await open_postgres_store(missing)
    with pytest.raises(StoreError, match="not a valid libpq URL"):
        await open_postgres_store("postgresql://u@h/db?nonsense=1")


@pytest.mark.deadline(40)
async def test_two_controllers_starting_together_migrate_once(pg_url):
    stores = []

    async def open_one():
        stores.append(await open_postgres_store(pg_url))

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(open_one)
        assert [store.schema_version for store in stores] == [len(MIGRATIONS)] * 3
        rows = await stores[0].read(lambda tx: tx.fetch_all("SELECT version FROM ficc_schema"))
        assert rows == [{"version": len(MIGRATIONS)}]
    finally:
        for store in stores:
            await store.aclose()


@pytest.mark.deadline(60)
async def test_a_postgresql_database_from_a_newer_ficc_is_refused_untouched(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ficc_schema (version BIGINT NOT NULL)")
        conn.execute("INSERT INTO ficc_schema VALUES (%s)", (len(MIGRATIONS) + 5,))
    with pytest.raises(StoreError, match="newer than this FICC"):
        await open_postgres_store(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        version = conn.execute("SELECT version FROM ficc_schema").fetchone()[0]
    assert tables == [("ficc_schema",)]
    assert version == len(MIGRATIONS) + 5


async def test_open_store_picks_the_backend_from_database_url(backend_config):
    store = await open_store(backend_config)
    try:
        expected = "postgresql" if backend_config.database_url else "sqlite"
        assert store.backend == expected
        assert store.schema_version == len(MIGRATIONS)
    finally:
        await store.aclose()


@pytest.mark.deadline(70)
async def test_a_busy_pool_answers_an_unknown_token_503_never_401(tmp_path, pg_url):
    """Through the real app: with every connection held, a token the controller has not
    verified cannot be judged, so it is a 503 with Retry-After, not a 401."""
    config = load_config(
        overrides={
            "data_dir": str(tmp_path / "data"),
            "database_url": pg_url,
            "store_pool_size": 1,
            "store_pool_timeout": "300ms",
        },
        environ={},
    )
    holding, release = threading.Event(), threading.Event()

    def hold(tx):
        holding.set()
        assert release.wait(30)

    with trio.fail_after(60):
        async with open_service(config) as service:
            await service.auth.bootstrap()
            token = await issue_token(service, name="unseen")  # not verified yet: not cached
            client = create_app(service).test_client()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(service.store.read, hold)
                await trio.to_thread.run_sync(holding.wait)
                response = await client.get("/api/v1/whoami", headers=bearer(token))
                assert response.status_code == 503
                assert response.headers["Retry-After"]
                body = await response.get_json()
                assert body["error"]["code"] == "store_unavailable"
                release.set()
            response = await client.get("/api/v1/whoami", headers=bearer(token))
            assert response.status_code == 200
