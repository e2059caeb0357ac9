"""The store (docs/operations.md#store): SQLite readers, or the PostgreSQL pool."""

from __future__ import annotations

import attrs

from .fields import setting


def _database_url(url: str) -> None:
    """Refuse a database URL that is neither empty (SQLite) nor a PostgreSQL one."""
    if url and not url.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            "database_url: expected empty (the SQLite file in data_dir) or a "
            "postgresql://... URL, got a URL of another kind"
        )


@attrs.frozen(slots=False)
class StoreSettings:
    """The store (a section of Config)."""

    store_read_threads: int = setting(
        4,
        "SQLite reader connections, each used from a worker thread off the event loop.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    database_url: str = setting(
        "",
        "Where the store lives. Empty: the SQLite file in data_dir (one controller, one "
        "machine). A libpq URL, postgresql://USER:PASSWORD@HOST:PORT/DBNAME?sslmode=..., "
        "is that PostgreSQL database: the store of an installation with several controllers, "
        "which all name the same one.",
        kind="str",
        validator=lambda _i, _a, value: _database_url(value),
    )
    store_pool_size: int = setting(
        10,
        "PostgreSQL connections this controller keeps at most, each used by one transaction "
        "at a time from a worker thread. Writes queue for one database-wide lock anyway, so "
        "more connections only help reads; every controller holds its own, and the server's "
        "max_connections (100 by default) bounds their sum.",
        kind="int",
        validator=attrs.validators.ge(1),
    )
    store_pool_timeout: float = setting(
        5.0,
        "How long a request waits for a PostgreSQL connection (every one busy, or the server "
        "unreachable: also the connect timeout) before it is answered 503 store_unavailable "
        "with Retry-After, rather than holding its client (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    store_read_timeout: float = setting(
        5.0,
        "PostgreSQL: the longest one read statement may run (the server's "
        "statement_timeout for reads); a read past it, or one whose database stopped "
        "answering, is answered 503 store_unavailable (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    store_write_timeout: float = setting(
        15.0,
        "PostgreSQL: the longest one write statement may run, its wait for the write lock "
        "included (the server's statement_timeout for writes); past it the write is rolled "
        "back and answered 503 store_unavailable (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
    store_lock_timeout: float = setting(
        5.0,
        "PostgreSQL: how long a write waits for the database-wide write lock (lock_timeout) "
        "before it is answered 503 store_unavailable with Retry-After; also how long a "
        "controller may sit idle inside a transaction before the server ends its session "
        "and releases its locks (idle_in_transaction_session_timeout: a frozen or lost "
        "controller holds nothing longer). Keep it below leader_lease (duration).",
        kind="duration",
        validator=attrs.validators.gt(0),
    )
