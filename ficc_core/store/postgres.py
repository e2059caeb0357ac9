"""PostgreSQL store: the store of an installation with several controllers.

The same :class:`~ficc_core.store.Store` as SQLite's, over psycopg 3 and a bounded
connection pool (``store_pool_size`` connections). Every call runs in a worker thread
(``trio.to_thread``) under a limiter the size of the pool, never on the event loop.

**Writes serialise as SQLite's ``BEGIN IMMEDIATE`` does, across every controller.** A
write transaction runs at READ COMMITTED and starts with
``SELECT pg_advisory_xact_lock(WRITE_LOCK)``: one writer at a time in the whole database,
and since READ COMMITTED takes a fresh snapshot for each statement, every statement after
the lock sees everything committed before it was granted. So the repositories'
read-check-insert code written for SQLite (placing the last GPU slice, advancing a durable
offset, minting a unique name) stays correct with two controllers: the second submit for
the last slice reads the first one's reservation and is refused. (SERIALIZABLE would give
the same guarantee by aborting one of the two, which every caller would then have to
retry; the store's writes are short, so waiting is the simpler contract.) The lock is the
database's own: installations in other databases of one server do not wait for each other.

**Reads** run at REPEATABLE READ READ ONLY: every statement of one read sees one snapshot,
as an SQLite read transaction does, and a read never waits for the write lock.

**Failures.** No connection within ``store_pool_timeout`` (every connection busy, or the
server unreachable: connections are made with a bounded ``connect_timeout``), or the server
failing under a statement (``psycopg.OperationalError`` and friends), raises
:class:`~ficc_core.errors.StoreUnavailable` (503 with ``Retry-After``). The pool checks a
connection before handing it out and replaces broken ones, so the store works again once
the server is back.

Migrations run in one transaction under the same lock, so two controllers starting
together migrate once; the version is kept in ``ficc_schema``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
import trio
from psycopg.adapt import Loader
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import StoreError, StoreUnavailable
from . import dialect
from .migrations import MIGRATIONS, newer_schema, statements

T = TypeVar("T")

log = logging.getLogger("ficc.store")

#: The advisory lock every write transaction (and a migration) holds: "FICC" in ASCII.
WRITE_LOCK = 0x46494343

#: How long a client should wait before retrying when every connection was busy, and when
#: the server could not be reached or failed.
RETRY_BUSY = 1
RETRY_DOWN = 2

#: The longest the pool goes on retrying one failed connection (see PostgresStore).
RECONNECT_WITHIN = 2.0

_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError)


class _NumberLoader(Loader):
    """NUMERIC as SQLite's numbers: ``SUM`` of BIGINT columns is NUMERIC in PostgreSQL,
    an ``int`` in SQLite; integral values load as ``int``, others as ``float``."""

    def load(self, data: Any) -> int | float:
        value = Decimal(bytes(data).decode())
        exponent = value.as_tuple().exponent
        if isinstance(exponent, int) and exponent >= 0:
            return int(value)
        return float(value)


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.adapters.register_loader("numeric", _NumberLoader)


class _PgTransaction:
    __slots__ = ("_cursor", "committed")

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor
        self.committed: list[Callable[[], None]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._cursor.execute(dialect.translate(sql), dialect.params(params))
        return self._cursor.rowcount

    def execute_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._cursor.executemany(dialect.translate(sql), (dialect.params(row) for row in rows))

    def fetch_one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        self._cursor.execute(dialect.translate(sql), dialect.params(params))
        row = self._cursor.fetchone()
        return dict(row) if row is not None else None

    def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        self._cursor.execute(dialect.translate(sql), dialect.params(params))
        return [dict(row) for row in self._cursor.fetchall()]

    def after_commit(self, fn: Callable[[], None]) -> None:
        self.committed.append(fn)


class _BoundedLimiter:
    """A limiter (``trio.to_thread``'s protocol) whose wait is bounded: a caller that
    cannot have a slot within ``timeout`` gets :class:`StoreUnavailable`."""

    def __init__(self, total: int, timeout: float) -> None:
        self._limiter = trio.CapacityLimiter(total)
        self._timeout = timeout

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        with trio.move_on_after(self._timeout):
            await self._limiter.acquire_on_behalf_of(borrower)
            return
        raise StoreUnavailable(
            f"every database connection stayed busy for {self._timeout:g} s; retry soon",
            retry_after=RETRY_BUSY,
        )

    def release_on_behalf_of(self, borrower: object) -> None:
        self._limiter.release_on_behalf_of(borrower)


def describe(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the configured database"
    host = info.get("host") or "localhost"
    return f"{info.get('dbname') or info.get('user') or ''} on {host}:{info.get('port') or 5432}"


def _run(conn: psycopg.Connection[Any], begin: str, fn: Callable[[Any], T], write: bool) -> T:
    with conn.cursor() as cursor:
        cursor.execute(begin)
        if write:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
        tx = _PgTransaction(cursor)
        try:
            result = fn(tx)
        except BaseException:
            try:
                conn.rollback()
            except _UNAVAILABLE:
                pass  # the connection is gone; the server rolls the transaction back
            raise
        cursor.execute("COMMIT")
    for committed in tx.committed:
        try:
            committed()
        except Exception:
            log.exception("a callback after a committed transaction failed")
    return result


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Bring the schema to the newest version, under the write lock; return that version."""
    newest = len(MIGRATIONS)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS ficc_schema (version BIGINT NOT NULL)")
        row = conn.execute("SELECT version FROM ficc_schema").fetchone()
        current = 0 if row is None else int(row["version"])
        if current > newest:
            raise newer_schema(current, newest, "database")
        for version in range(current + 1, newest + 1):
            for statement in statements(version, "postgresql"):
                conn.execute(dialect.translate_ddl(statement))  # type: ignore[arg-type]
        if row is None:
            conn.execute("INSERT INTO ficc_schema (version) VALUES (%s)", (newest,))
        elif current != newest:
            conn.execute("UPDATE ficc_schema SET version = %s", (newest,))
    return newest


class PostgresStore:
    """The :class:`~ficc_core.store.Store` backed by a PostgreSQL database."""

    backend = "postgresql"

    def __init__(self, url: str, *, pool_size: int = 10, pool_timeout: float = 5.0) -> None:
        self.url = url
        self.pool_size = pool_size
        self.pool_timeout = pool_timeout
        self.schema_version = 0
        self._limiter = _BoundedLimiter(pool_size, pool_timeout)
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            timeout=pool_timeout,
            open=False,
            kwargs={"autocommit": True, "row_factory": dict_row, **self._connect_options()},
            configure=_configure,
            check=ConnectionPool.check_connection,
            # The pool retries a failed connection with a doubling delay until this bound,
            # then gives up until the next request asks: a short bound keeps the retries
            # close together, so the store is back within seconds of the server.
            reconnect_timeout=RECONNECT_WITHIN,
            name="ficc-store",
        )
        self._open = False

    def open_sync(self) -> None:
        """Connect, run migrations, then open the pool (blocking; call from a thread).

        The first connection is made alone, so a refusal names its reason (no such
        database, a wrong password, TLS required) rather than a pool timeout.
        """
        where = describe(self.url)
        try:
            psycopg.conninfo.conninfo_to_dict(self.url)
        except psycopg.ProgrammingError as exc:
            raise StoreError(f"database_url is not a valid libpq URL: {exc}") from None
        try:
            with psycopg.connect(
                self.url, autocommit=True, row_factory=dict_row, **self._connect_options()
            ) as conn:
                self.schema_version = migrate(conn)
        except psycopg.OperationalError as exc:
            raise StoreError(
                f"cannot connect to the database {where}: {str(exc).strip()}",
                details={"database": where},
            ) from None
        except psycopg.Error as exc:
            raise StoreError(f"cannot migrate the database {where}: {exc}") from None
        try:
            self._pool.open(wait=True, timeout=self.pool_timeout)
        except PoolTimeout:
            self._pool.close()
            raise StoreError(
                f"cannot connect to the database {where} within {self.pool_timeout:g} s",
                details={"database": where},
            ) from None
        self._open = True
        log.info(
            "store: PostgreSQL database %s at schema version %s, up to %s connections",
            where,
            self.schema_version,
            self.pool_size,
        )

    def _connect_options(self) -> dict[str, Any]:
        # libpq counts whole seconds and reads anything below 2 as 2.
        return {
            "connect_timeout": max(2, math.ceil(self.pool_timeout)),
            "application_name": "ficc",
        }

    def _call(self, begin: str, fn: Callable[[Any], T], write: bool) -> T:
        if not self._open:
            raise StoreError("the store is closed")
        started = time.monotonic()
        try:
            with self._pool.connection(timeout=self.pool_timeout) as conn:
                return _run(conn, begin, fn, write)
        except PoolTimeout:
            waited = time.monotonic() - started
            raise StoreUnavailable(
                f"no connection to the database {describe(self.url)} within {waited:.1f} s; "
                "it is unreachable or slow to accept connections",
                retry_after=RETRY_DOWN,
            ) from None
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(
                f"the database {describe(self.url)} failed: {str(exc).strip() or type(exc)}",
                retry_after=RETRY_DOWN,
            ) from None

    async def read(self, fn: Callable[[_PgTransaction], T]) -> T:
        return await trio.to_thread.run_sync(
            self._call,
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            fn,
            False,
            limiter=self._limiter,
        )

    async def write(self, fn: Callable[[_PgTransaction], T]) -> T:
        return await trio.to_thread.run_sync(
            self._call, "BEGIN ISOLATION LEVEL READ COMMITTED", fn, True, limiter=self._limiter
        )

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            await trio.to_thread.run_sync(self._pool.close)


async def open_postgres_store(
    url: str, *, pool_size: int = 10, pool_timeout: float = 5.0
) -> PostgresStore:
    """Open (migrating if needed) the PostgreSQL store at the libpq ``url``."""
    store = PostgresStore(url, pool_size=pool_size, pool_timeout=pool_timeout)
    await trio.to_thread.run_sync(store.open_sync)
    return store
