"""Copy an installation's SQLite store into an empty PostgreSQL database (``ficc admin
migrate-store``).

Blocking (a command-line tool's work; nothing here runs on an event loop). The source is
read in one read transaction (one snapshot, even while a controller writes); the
destination is migrated to the same schema and filled in ONE transaction, under the
store's write lock: a failure anywhere, or a destination that already holds data, leaves
it exactly as it was. Tables are copied parents first (their foreign keys' order), with
PostgreSQL's ``COPY``; row counts are checked after; identity columns (event and usage IDs)
continue past the highest ID the source ever handed out, so an ID is never reused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..base.errors import StoreError, StoreNotEmpty
from .migrations import MIGRATIONS
from .postgres import WRITE_LOCK, describe, migrate


def _tables_parents_first(src: sqlite3.Connection) -> list[str]:
    """The source's tables, each after the tables its foreign keys reference (ties in
    creation order)."""
    names = [
        row[0]
        for row in src.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            " ORDER BY rowid"
        )
    ]
    parents = {
        name: {row[2] for row in src.execute(f'PRAGMA foreign_key_list("{name}")')} - {name}
        for name in names
    }
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [n for n in names if n not in ordered and parents[n] <= set(ordered)]
        if not ready:
            raise StoreError(f"the source's foreign keys form a cycle: {sorted(parents)}")
        ordered.append(ready[0])
    return ordered


def _columns(src: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in src.execute(f'PRAGMA table_info("{table}")')]


def _dst_columns(dst: psycopg.Connection[Any], table: str) -> list[str]:
    rows = dst.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [row["column_name"] for row in rows]


def _one(cursor: psycopg.Cursor[Any]) -> Any:
    """The row of an aggregate query (no GROUP BY), which always returns one."""
    row = cursor.fetchone()
    assert row is not None
    return row


def _highest_ids(src: sqlite3.Connection) -> dict[str, int]:
    """AUTOINCREMENT's record of the highest ID each table ever handed out (a pruned
    event's ID is never reused)."""
    try:
        return {row[0]: int(row[1]) for row in src.execute("SELECT name, seq FROM sqlite_sequence")}
    except sqlite3.OperationalError:  # no AUTOINCREMENT table
        return {}


def migrate_store(
    source: Path, url: str, *, progress: Callable[[str, int], None] | None = None
) -> dict[str, int]:
    """Copy the SQLite store at ``source`` into the PostgreSQL database at ``url``;
    return the rows copied per table.

    :raises StoreNotEmpty: the destination holds data (nothing is written).
    :raises StoreError: the source is missing or at another schema version, the
        destination cannot be reached, or a row did not fit.
    """
    source = Path(source)
    if not source.is_file():
        raise StoreError(f"no SQLite database at {source}")
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        src.execute("BEGIN")  # one snapshot of the source for the whole copy
        version = src.execute("PRAGMA user_version").fetchone()[0]
        if version != len(MIGRATIONS):
            raise StoreError(
                f"{source} is at schema version {version}, this FICC writes {len(MIGRATIONS)}: "
                "copy it with the FICC version that wrote it, or open it once with this one "
                "(ficc serve, or any ficc admin command) to migrate it first",
                details={"schema_version": version, "supported": len(MIGRATIONS)},
            )
        tables = _tables_parents_first(src)
        try:
            dst = psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to the database {describe(url)}: {exc}") from None
        with dst:
            try:
                return _copy(src, dst, tables, progress)
            except psycopg.Error as exc:
                raise StoreError(
                    f"the copy to {describe(url)} failed and nothing was written: {exc}"
                ) from None
    finally:
        src.close()


def _copy(
    src: sqlite3.Connection,
    dst: psycopg.Connection[Any],
    tables: list[str],
    progress: Callable[[str, int], None] | None,
) -> dict[str, int]:
    copied: dict[str, int] = {}
    with dst.transaction():
        dst.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
        present = {
            row["table_name"]
            for row in dst.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema()"
            ).fetchall()
        }
        if present and "ficc_schema" not in present:
            raise StoreNotEmpty(
                f"the destination already holds data (tables FICC did not make: "
                f"{', '.join(sorted(present)[:5])}); migrate-store only fills an empty "
                "database: nothing was written",
                details={"tables": sorted(present)},
            )
        migrate(dst)  # an empty database gets the schema (a savepoint in this transaction)
        for table in tables:
            if dst.execute(f'SELECT 1 AS found FROM "{table}" LIMIT 1').fetchone() is not None:
                raise StoreNotEmpty(
                    f"the destination already holds data (table {table}); migrate-store only "
                    "fills an empty database: nothing was written",
                    details={"table": table},
                )
        for table in tables:
            columns = _columns(src, table)
            if sorted(columns) != sorted(_dst_columns(dst, table)):
                raise StoreError(f"table {table} has other columns in the destination")
            names = ", ".join(f'"{c}"' for c in columns)
            count = 0
            with dst.cursor().copy(f'COPY "{table}" ({names}) FROM STDIN') as copy:
                for row in src.execute(f'SELECT {names} FROM "{table}"'):
                    copy.write_row(row)
                    count += 1
            copied[table] = count
            if progress is not None:
                progress(table, count)
        for table, count in copied.items():
            held = _one(dst.execute(f'SELECT count(*) AS n FROM "{table}"'))["n"]
            if held != count:
                raise StoreError(f"table {table}: {count} rows copied, {held} in the destination")
        highest = _highest_ids(src)
        identities = dst.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND is_identity = 'YES'"
        ).fetchall()
        for row in identities:
            table, column = row["table_name"], row["column_name"]
            top = dst.execute(f'SELECT COALESCE(MAX("{column}"), 0) AS top FROM "{table}"')
            after = max(int(_one(top)["top"]), highest.get(table, 0))
            dst.execute(
                "SELECT setval(pg_get_serial_sequence(%s, %s), %s, false)",
                (f'"{table}"', column, after + 1),
            )
    return copied
