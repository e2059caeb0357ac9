"""The usage package's SQL, as functions of a :class:`Transaction`: writing usage rows
(``inference_usage``) and a service's usage summary.

They take and return the records of :mod:`~ficc_core.usage.records`; what the usage
report reads (:mod:`.report`) lives beside its records there. The SQL is what SQLite and
PostgreSQL both run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any

import attrs

from ..store import Transaction
from .records import CredentialUsage, UsageRecord, UsageSummary, UsageTotals, stored

#: The columns of an ``inference_usage`` row, in the order :func:`insert_usage_rows` takes:
#: the stored fields of :class:`UsageRecord`, in its order (the record is their one list).
USAGE_FIELDS = tuple(field.name for field in attrs.fields(UsageRecord) if stored(field, None))
_USAGE_COLUMNS = ", ".join(USAGE_FIELDS)
_USAGE_INSERT = (
    f"INSERT INTO inference_usage ({_USAGE_COLUMNS})"
    f" VALUES ({', '.join('?' for _ in USAGE_FIELDS)})"
)
#: A usage writer's row: :data:`USAGE_FIELDS` then its ``record_id``, written once.
_USAGE_RECORD_INSERT = (
    f"INSERT INTO inference_usage ({_USAGE_COLUMNS}, record_id)"
    f" VALUES ({', '.join('?' for _ in USAGE_FIELDS)}, ?)"
    " ON CONFLICT (record_id) DO NOTHING"
)


def insert_usage(tx: Transaction, entries: Iterable[UsageRecord]) -> None:
    """Record finished requests' usage (and summary rows)."""
    insert_usage_rows(tx, map(attrgetter(*USAGE_FIELDS), entries))


def insert_usage_rows(tx: Transaction, rows: Iterable[Sequence[Any]]) -> None:
    """Record usage rows given as values in :data:`USAGE_FIELDS` order, in one batch."""
    tx.execute_many(_USAGE_INSERT, rows)


def insert_usage_records(tx: Transaction, rows: Iterable[Sequence[Any]]) -> None:
    """Record usage rows given as values in :data:`USAGE_FIELDS` order then a
    ``record_id``; a row whose ``record_id`` is already stored is skipped (a replayed
    spool's, see :mod:`.spool`)."""
    tx.execute_many(_USAGE_RECORD_INSERT, rows)


def usage_summary(
    tx: Transaction, service_id: str, since: float | None, recent: int
) -> UsageSummary:
    """What the service's requests finished since ``since`` used, and the latest of them
    (a row may sum several requests: see :mod:`.ledger`)."""
    start = 0.0 if since is None else since
    totals = tx.fetch_one(
        "SELECT COALESCE(SUM(requests), 0) AS requests,"
        " SUM(CASE WHEN outcome NOT IN ('ok', 'cancelled') THEN requests ELSE 0 END) AS errors,"
        " COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,"
        " COALESCE(SUM(completion_tokens), 0) AS completion_tokens,"
        # Means of the requests that reached a replica (a refusal's replica is ""); none
        # is NULL (NULLIF: PostgreSQL refuses a division by zero, SQLite gives NULL).
        " SUM(ttfb * requests) / NULLIF(SUM(CASE WHEN ttfb IS NULL THEN 0 ELSE requests END), 0)"
        " AS mean_ttfb, SUM(CASE WHEN replica = '' THEN 0 ELSE duration * requests END)"
        " / NULLIF(SUM(CASE WHEN replica = '' THEN 0 ELSE requests END), 0) AS mean_duration,"
        " COALESCE(SUM(cost), 0) AS cost"
        " FROM inference_usage WHERE service_id = ? AND finished_at >= ?",
        (service_id, start),
    )
    assert totals is not None  # an aggregate always has one row
    by_credential = tx.fetch_all(
        "SELECT g.*, c.name, COALESCE(u.username, su.username) AS username FROM ("
        " SELECT credential_id, SUM(requests) AS requests,"
        " SUM(CASE WHEN outcome NOT IN ('ok', 'cancelled') THEN requests ELSE 0 END) AS errors,"
        " COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,"
        " COALESCE(SUM(completion_tokens), 0) AS completion_tokens,"
        " COALESCE(SUM(cost), 0) AS cost"
        " FROM inference_usage WHERE service_id = ? AND finished_at >= ?"
        " GROUP BY credential_id) g"
        " LEFT JOIN credentials c ON c.id = g.credential_id"
        " LEFT JOIN users u ON u.id = c.user_id"
        " LEFT JOIN sessions s ON s.id = g.credential_id"
        " LEFT JOIN users su ON su.id = s.user_id"
        " ORDER BY g.credential_id",
        (service_id, start),
    )
    latest = tx.fetch_all(
        f"SELECT {_USAGE_COLUMNS} FROM inference_usage"
        " WHERE service_id = ? AND finished_at >= ? ORDER BY id DESC LIMIT ?",
        (service_id, start, recent),
    )
    alias = tx.fetch_one("SELECT alias FROM inference_services WHERE id = ?", (service_id,))
    return UsageSummary(
        service_id=service_id,
        since=since,
        alias=None if alias is None else alias["alias"],
        totals=UsageTotals(**{**totals, "errors": totals["errors"] or 0}),
        by_credential=tuple(CredentialUsage(**row) for row in by_credential),
        recent=tuple(UsageRecord(**row) for row in latest),
    )
