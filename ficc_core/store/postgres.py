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
:class:`~ficc_core.base.errors.StoreUnavailable` (503 with ``Retry-After``). The pool checks a
connection before handing it out and replaces broken ones, so the store works again once
the server is back.

**Every wait is bounded** (docs/operations.md, "A database that hangs"), so no lost
peer can hold the installation. Each connection is made with libpq TCP keepalives and
``tcp_user_timeout`` (a lost server or a lost path is noticed within seconds, not Linux's
two hours) and with server-side limits: ``lock_timeout`` (``store_lock_timeout``: a write
that cannot have the write lock in time fails, 503 ``store_unavailable``),
``statement_timeout`` (``store_read_timeout`` for reads, ``store_write_timeout`` for
writes) and ``idle_in_transaction_session_timeout`` (``store_lock_timeout`` too: the
backend of a controller frozen inside a transaction, a paused VM or a SIGSTOP, is ended
by the server and its lock released). On top of those, every call has a client-side
deadline (the pool wait plus the statement bound plus a second): a call still running then
(a server that stopped answering without closing the connection, where no TCP timer
fires) is answered 503 at once and its connection shut down under it, so its thread ends
and the pool replaces the connection; threads never pile up behind a hung server.

**The leader lease has a lock of its own** (:meth:`PostgresStore.lease_write`,
``LEASE_LOCK``): claiming and renewing it never queues behind ordinary writes, so a
standby takes over within ``leader_lease`` + ``leader_renew_interval`` whatever the old
leader was doing, and a claim that cannot be made within its own short bound fails and
is tried again at the next renewal.

Migrations run in one transaction under the same lock, so two controllers starting
together migrate once; the version is kept in ``ficc_schema``.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
import trio
from psycopg.adapt import Loader
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ..base.errors import StoreError, StoreUnavailable
from . import dialect
from .migrations import MIGRATIONS, check_newer, compatible_from, statements

T = TypeVar("T")

log = logging.getLogger("ficc.store")

#: The advisory lock every write transaction (and a migration) holds: "FICC" in ASCII.
WRITE_LOCK = 0x46494343
#: The advisory lock the leader lease's claims hold instead: "FICL" in ASCII.
LEASE_LOCK = 0x4649434C

#: libpq TCP keepalives: first probe after this many idle seconds, then one every
#: KEEPALIVE_INTERVAL, the peer given up after KEEPALIVE_COUNT unanswered probes.
KEEPALIVE_IDLE = 5
KEEPALIVE_INTERVAL = 2
KEEPALIVE_COUNT = 3
#: What a client-side deadline adds to the server's own bounds, in seconds.
DEADLINE_SLACK = 1.0

#: How long a client should wait before retrying when every connection was busy, and when
#: the server could not be reached or failed.
RETRY_BUSY = 1
RETRY_DOWN = 2

#: The longest the pool goes on retrying one failed connection (see PostgresStore).
RECONNECT_WITHIN = 2.0

#: The server ended this session because it sat idle inside a transaction (this
#: process was frozen mid-write): class 25, not an OperationalError.
_ENDED_IDLE = psycopg.errors.IdleInTransactionSessionTimeout
_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError, _ENDED_IDLE)


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


class _Call:
    """One store call's connection, so a call past its deadline can be ended from outside
    its thread (:meth:`abandon`)."""

    __slots__ = ("abandoned", "conn", "lock")

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self.abandoned = False
        self.lock = threading.Lock()

    def attach(self, conn: psycopg.Connection[Any]) -> None:
        with self.lock:
            self.conn = conn
            if self.abandoned:
                _shut_down(conn)

    def detach(self) -> None:
        with self.lock:
            self.conn = None

    def abandon(self) -> None:
        """The caller gave up: shut the connection's socket down under the thread, so
        whatever it waits for ends now with an error (the pool then replaces it)."""
        with self.lock:
            self.abandoned = True
            if self.conn is not None:
                _shut_down(self.conn)


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    # shutdown(2), not close(2): the fd stays libpq's, and a wait on it wakes at once.
    try:
        sock = socket.socket(fileno=conn.pgconn.socket)
    except (OSError, psycopg.Error):
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


#: The call the current worker thread runs (the pool's check runs in it too).
_current = threading.local()


def _run(conn: psycopg.Connection[Any], begin: str, fn: Callable[[Any], T]) -> T:
    with conn.cursor() as cursor:
        tx = _PgTransaction(cursor)
        try:
            cursor.execute(begin)
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
        # A migration may take long on a large database, and a controller started beside
        # one that migrates waits for it: no statement or lock bound here (a frozen
        # holder's session is still ended by idle_in_transaction_session_timeout).
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute("SET LOCAL lock_timeout = 0")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS ficc_schema (version BIGINT NOT NULL)")
        # Expand-then-contract (ficc_core.store.migrations): the oldest schema version
        # whose FICC runs on this database, so a controller one release older than the
        # one that migrated keeps working beside it during a rolling upgrade.
        conn.execute("ALTER TABLE ficc_schema ADD COLUMN IF NOT EXISTS compatible_from BIGINT")
        row = conn.execute("SELECT version, compatible_from FROM ficc_schema").fetchone()
        current = 0 if row is None else int(row["version"])
        if current > newest:
            assert row is not None  # a version above 0 was read from it
            compatible = row["compatible_from"]
            check_newer(
                current, newest, None if compatible is None else int(compatible), "database"
            )
            log.info(
                "the database is at schema version %d (this FICC knows %d), marked "
                "compatible from %s: running on it without migrating",
                current,
                newest,
                compatible,
            )
            return newest
        for version in range(current + 1, newest + 1):
            for statement in statements(version, "postgresql"):
                conn.execute(dialect.translate_ddl(statement))
        compatible = compatible_from(newest)
        if row is None:
            conn.execute(
                "INSERT INTO ficc_schema (version, compatible_from) VALUES (%s, %s)",
                (newest, compatible),
            )
        else:
            conn.execute(
                "UPDATE ficc_schema SET version = %s, compatible_from = %s",
                (newest, compatible),
            )
    return newest


class PostgresStore:
    """The :class:`~ficc_core.store.Store` backed by a PostgreSQL database."""

    backend = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        pool_timeout: float = 5.0,
        read_timeout: float = 5.0,
        write_timeout: float = 15.0,
        lock_timeout: float = 5.0,
    ) -> None:
        self.url = url
        self.pool_size = pool_size
        self.pool_timeout = pool_timeout
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.lock_timeout = lock_timeout
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
            check=_check,
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
        limits = {
            "statement_timeout": _ms(self.read_timeout),
            "lock_timeout": _ms(self.lock_timeout),
            "idle_in_transaction_session_timeout": _ms(self.lock_timeout),
        }
        options: dict[str, Any] = {"application_name": "ficc"}
        try:  # an application_name in the URL (a controller's own, say) is kept
            if "application_name" in psycopg.conninfo.conninfo_to_dict(self.url):
                options = {}
        except psycopg.ProgrammingError:
            pass  # open_sync says what is wrong with the URL
        return {
            **options,
            "connect_timeout": max(2, math.ceil(self.pool_timeout)),
            "keepalives": 1,
            "keepalives_idle": KEEPALIVE_IDLE,
            "keepalives_interval": KEEPALIVE_INTERVAL,
            "keepalives_count": KEEPALIVE_COUNT,
            # Unacknowledged data given up on after the longest statement bound.
            "tcp_user_timeout": _ms(max(self.write_timeout, self.read_timeout) + DEADLINE_SLACK),
            "options": " ".join(f"-c {name}={value}" for name, value in limits.items()),
        }

    def _begin_write(self, lock: int, timeout: float, lock_timeout: float) -> str:
        # One round trip: simple-query protocol runs the statements in order, in one go.
        return (
            "BEGIN ISOLATION LEVEL READ COMMITTED; "
            f"SET LOCAL statement_timeout = {_ms(timeout)}; "
            f"SET LOCAL lock_timeout = {_ms(lock_timeout)}; "
            f"SELECT pg_advisory_xact_lock({int(lock)})"
        )

    def _call(self, call: _Call, begin: str, fn: Callable[[Any], T]) -> T:
        if not self._open:
            raise StoreError("the store is closed")
        started = time.monotonic()
        _current.call = call
        try:
            with self._pool.connection(timeout=self.pool_timeout) as conn:
                call.attach(conn)
                try:
                    return _run(conn, begin, fn)
                finally:
                    call.detach()
        except PoolTimeout:
            waited = time.monotonic() - started
            raise StoreUnavailable(
                f"no connection to the database {describe(self.url)} within {waited:.1f} s; "
                "it is unreachable or slow to accept connections",
                retry_after=RETRY_DOWN,
            ) from None
        except psycopg.errors.LockNotAvailable:
            raise StoreUnavailable(
                f"another write held the database's write lock for over {self.lock_timeout:g} s "
                "(store_lock_timeout); retry soon",
                retry_after=RETRY_BUSY,
                details={"waited": "write_lock"},
            ) from None
        except _ENDED_IDLE:
            raise StoreUnavailable(
                "the database ended this controller's session: it sat idle inside a "
                f"transaction for over {self.lock_timeout:g} s (store_lock_timeout; was the "
                "process paused?); the transaction was rolled back, retry",
                retry_after=RETRY_BUSY,
                details={"waited": "idle_in_transaction"},
            ) from None
        except psycopg.errors.QueryCanceled:
            raise StoreUnavailable(
                f"the database {describe(self.url)} did not finish a statement within its "
                "bound (store_read_timeout, store_write_timeout); retry soon",
                retry_after=RETRY_DOWN,
                details={"waited": "statement"},
            ) from None
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(
                f"the database {describe(self.url)} failed: {str(exc).strip() or type(exc)}",
                retry_after=RETRY_DOWN,
            ) from None
        finally:
            _current.call = None

    async def _in_thread(self, begin: str, fn: Callable[[_PgTransaction], T], bound: float) -> T:
        """Run ``fn`` in a worker thread, answering 503 once ``bound`` passed (see the
        module docs): the thread is abandoned, its connection shut down under it."""
        call = _Call()
        deadline = self.pool_timeout + bound + DEADLINE_SLACK
        with trio.move_on_after(deadline):
            return await trio.to_thread.run_sync(
                self._call,
                call,
                begin,
                fn,
                # trio documents the limiter as any object with its two methods (what
                # _BoundedLimiter has); its annotation names only CapacityLimiter.
                limiter=self._limiter,  # type: ignore[arg-type]
                abandon_on_cancel=True,
            )
        call.abandon()
        raise StoreUnavailable(
            f"the database {describe(self.url)} did not answer within {deadline:g} s; "
            "it is unreachable or hung",
            retry_after=RETRY_DOWN,
            details={"waited": "deadline"},
        )

    async def read(self, fn: Callable[[_PgTransaction], T]) -> T:
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        return await self._in_thread(begin, fn, self.read_timeout)

    async def write(self, fn: Callable[[_PgTransaction], T]) -> T:
        begin = self._begin_write(WRITE_LOCK, self.write_timeout, self.lock_timeout)
        return await self._in_thread(begin, fn, self.write_timeout)

    async def lease_write(self, fn: Callable[[_PgTransaction], T], bound: float) -> T:
        """A small write under the lease's own lock (never behind ordinary writes), every
        wait of it bounded by ``bound``: the leader lease's claims and release."""
        begin = self._begin_write(LEASE_LOCK, bound, bound)
        return await self._in_thread(begin, fn, bound)

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            await trio.to_thread.run_sync(self._pool.close)


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _check(conn: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection before handing it out, which runs in the
    calling thread: the call can shut the connection down should the check hang."""
    call = getattr(_current, "call", None)
    if call is not None:
        call.attach(conn)
    try:
        ConnectionPool.check_connection(conn)
    finally:
        if call is not None:
            call.detach()


async def open_postgres_store(url: str, **settings: Any) -> PostgresStore:
    """Open (migrating if needed) the PostgreSQL store at the libpq ``url`` (``settings``:
    :class:`PostgresStore`'s keyword arguments)."""
    store = PostgresStore(url, **settings)
    await trio.to_thread.run_sync(store.open_sync)
    return store
