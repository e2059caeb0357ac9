"""SQLite (WAL) store: the embedded default.

One writer connection serialised by a limiter of one, and a few reader
connections; every call runs in a worker thread through ``trio.to_thread``.
Writes use ``BEGIN IMMEDIATE`` so two writers never interleave, and commit with
``synchronous=FULL`` so a committed row (a durable offset, say) survives power loss.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio

from ..base.errors import StoreError, StoreUnavailable
from .migrations import MIGRATIONS, newer_schema, statements

T = TypeVar("T")

log = logging.getLogger("ficc.store")

#: SQLite's errors that say the file cannot be had now (not that the SQL is wrong): a
#: request that meets one is answered 503 ``store_unavailable`` with Retry-After.
_UNAVAILABLE = ("database is locked", "disk i/o error", "unable to open", "disk is full")


def _unavailable(exc: sqlite3.OperationalError) -> StoreUnavailable | None:
    text = str(exc).lower()
    if any(marker in text for marker in _UNAVAILABLE):
        return StoreUnavailable(f"the SQLite database cannot be used now: {exc}")
    return None


class _SQLiteTransaction:
    __slots__ = ("_conn", "committed")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        #: What :meth:`after_commit` asked to run once the transaction committed.
        self.committed: list[Callable[[], None]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._conn.execute(sql, params).rowcount

    def execute_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    def fetch_one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        row = self._conn.execute(sql, params).fetchone()
        return dict(row) if row is not None else None

    def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return [dict(row) for row in self._conn.execute(sql, params).fetchall()]

    def after_commit(self, fn: Callable[[], None]) -> None:
        self.committed.append(fn)


def _create_private(path: Path) -> None:
    """Create the database file readable and writable by this user only (0600), unless
    it exists. SQLite gives the ``-wal`` and ``-shm`` files it creates the mode of the
    database file, so they are private too."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def _run_in_transaction(conn: sqlite3.Connection, begin: str, fn: Callable[[Any], T]) -> T:
    try:
        return _transaction(conn, begin, fn)
    except sqlite3.OperationalError as exc:
        unavailable = _unavailable(exc)
        if unavailable is None:
            raise
        raise unavailable from None


def _transaction(conn: sqlite3.Connection, begin: str, fn: Callable[[Any], T]) -> T:
    conn.execute(begin)
    tx = _SQLiteTransaction(conn)
    try:
        result = fn(tx)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    for committed in tx.committed:
        try:
            committed()
        except Exception:
            log.exception("a callback after a committed transaction failed")
    return result


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to the newest version; return that version."""
    newest = len(MIGRATIONS)
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > newest:
            raise newer_schema(current, newest, "data directory")
        for version in range(current + 1, newest + 1):
            for statement in statements(version, "sqlite"):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return newest


class SQLiteStore:
    """The :class:`~ficc_core.store.Store` backed by one SQLite file in WAL mode."""

    backend = "sqlite"

    def __init__(self, path: Path, *, readers: int = 4) -> None:
        self.path = Path(path)
        self._writer: sqlite3.Connection | None = None
        #: Idle reader connections; None once closed (every reader waiting or to come
        #: takes it, puts it back and raises, instead of waiting for ever).
        self._readers: queue.SimpleQueue[sqlite3.Connection | None] = queue.SimpleQueue()
        self._closed = False
        self._reader_count = readers
        self._write_limiter = trio.CapacityLimiter(1)
        self._read_limiter = trio.CapacityLimiter(readers)
        self.schema_version = 0

    def open_sync(self) -> None:
        """Open the connections and run migrations (blocking; call from a thread)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _create_private(self.path)
        except OSError as exc:
            raise StoreError(
                f"cannot create the database {self.path}: {exc.strerror or exc}",
                details={"path": str(self.path)},
            ) from None
        try:
            writer = _connect(self.path)
            mode = writer.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"SQLite refused WAL mode for {self.path} (got {mode})")
            self.schema_version = migrate(writer)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the database {self.path}: {exc}") from None
        self._writer = writer
        for _ in range(self._reader_count):
            self._readers.put(_connect(self.path))

    async def read(self, fn: Callable[[_SQLiteTransaction], T]) -> T:
        def run() -> T:
            conn = self._readers.get()
            if conn is None:
                self._readers.put(None)
                raise StoreError("the store is closed")
            try:
                return _run_in_transaction(conn, "BEGIN", fn)
            finally:
                if self._closed:
                    conn.close()  # closed meanwhile: not handed out again
                else:
                    self._readers.put(conn)

        if self._closed:
            raise StoreError("the store is closed")
        return await trio.to_thread.run_sync(run, limiter=self._read_limiter)

    async def write(self, fn: Callable[[_SQLiteTransaction], T]) -> T:
        writer = self._writer
        if writer is None:
            raise StoreError("the store is closed")
        return await trio.to_thread.run_sync(
            _run_in_transaction, writer, "BEGIN IMMEDIATE", fn, limiter=self._write_limiter
        )

    async def lease_write(self, fn: Callable[[_SQLiteTransaction], T], bound: float) -> T:
        """The leader lease's write: an ordinary write here (one file, one process's writer
        queue; the bound is PostgreSQL's concern, see :mod:`.postgres`)."""
        del bound
        return await self.write(fn)

    async def aclose(self) -> None:
        def close() -> None:
            self._closed = True
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            while True:
                try:
                    conn = self._readers.get_nowait()
                except queue.Empty:
                    break
                if conn is not None:
                    conn.close()
            # A read still to take a connection (one that started before the close and
            # waited for its thread) finds this and raises rather than waiting for ever.
            self._readers.put(None)

        async with self._write_limiter:
            await trio.to_thread.run_sync(close)


async def open_sqlite_store(path: Path, *, readers: int = 4) -> SQLiteStore:
    """Open (creating and migrating if needed) the SQLite store at ``path``."""
    store = SQLiteStore(path, readers=readers)
    await trio.to_thread.run_sync(store.open_sync)
    return store
