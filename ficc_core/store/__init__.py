"""The one storage interface: transactions run off the event loop, on SQLite or PostgreSQL.

Everything durable goes through a :class:`Store`. Callers hand it a plain
function that receives a :class:`Transaction`; the store runs that function in a
worker thread (never on the trio event loop) inside one transaction: all of it
commits, or none of it does. SQL is written with ``?`` placeholders and the
portable subset of SQL that both backends read: SQLite (:mod:`.sqlite`, the embedded
default) and PostgreSQL (:mod:`.postgres`, for several controllers; :mod:`.dialect` holds
the few translations). :func:`open_store` picks one from the ``database_url`` setting.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..config import Config

T = TypeVar("T")

Row = dict[str, Any]


class Transaction(Protocol):
    """One open transaction; only valid inside the function the store runs."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; return the number of rows it changed."""

    def execute_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per row of parameters (a batch of inserts)."""

    def fetch_one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        """Run a query; return its first row as a dict, or ``None``."""

    def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run a query; return every row as a dict."""

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once this transaction committed (never when it rolls back).

        It runs in the store's worker thread, right after the commit; what it raises
        is logged, and the committed transaction stands.
        """


class Store(Protocol):
    """Transactional storage; every call runs off the event loop."""

    async def read(self, fn: Callable[[Transaction], T]) -> T:
        """Run ``fn`` in a read-only transaction and return its result."""

    async def write(self, fn: Callable[[Transaction], T]) -> T:
        """Run ``fn`` in a write transaction (all or nothing) and return its result."""

    async def lease_write(self, fn: Callable[[Transaction], T], bound: float) -> T:
        """Run ``fn`` in a write transaction that never queues behind ordinary writes,
        every wait of it bounded by ``bound`` seconds (the leader lease's claims)."""

    async def aclose(self) -> None:
        """Close every connection."""


from .sqlite import SQLiteStore, open_sqlite_store  # noqa: E402

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database (a libpq URL)."""
    return url.startswith(POSTGRES_SCHEMES)


def redact_url(url: str) -> str:
    """``url`` with its password (in the authority or a ``password=`` parameter) shown
    as ``***``, for ``ficc config`` and messages."""
    if not is_postgres_url(url):
        return url
    scheme, _, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    user, at, host = authority.rpartition("@")
    if at and ":" in user:
        authority = f"{user.split(':', 1)[0]}:***@{host}"
    tail = re.sub(r"(?i)(^|[?&])password=[^&]*", r"\1password=***", tail)
    return f"{scheme}://{authority}{slash}{tail}"


async def open_store(config: Config) -> Store:
    """Open the store ``config`` names: ``database_url`` empty is the SQLite file in
    ``data_dir``; a ``postgresql://`` URL is that PostgreSQL database."""
    url = config.database_url
    if is_postgres_url(url):
        # Imported here: an installation on SQLite alone never loads psycopg.
        from .postgres import open_postgres_store

        return await open_postgres_store(
            url,
            pool_size=config.store_pool_size,
            pool_timeout=config.store_pool_timeout,
            read_timeout=config.store_read_timeout,
            write_timeout=config.store_write_timeout,
            lock_timeout=config.store_lock_timeout,
        )
    return await open_sqlite_store(config.database_path, readers=config.store_read_threads)


__all__ = [
    "Row",
    "SQLiteStore",
    "Store",
    "Transaction",
    "is_postgres_url",
    "open_sqlite_store",
    "open_store",
    "redact_url",
]
