"""Every SQL statement of quotas: limit records and the counters processes share.

Each function takes an open :class:`~ficc_core.store.Transaction` and runs in the
store's worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..store import Row, Transaction
from .meters import Pending
from .records import NONE, Limits, merge_limits

_UPSERT = (
    "INSERT INTO quota_counters (subject, kind, window_start, requests, tokens, spend) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (subject, kind, window_start) DO UPDATE SET "
    "requests = quota_counters.requests + excluded.requests, "
    "tokens = quota_counters.tokens + excluded.tokens, "
    "spend = quota_counters.spend + excluded.spend"
)


def limits_of(row: Row) -> Limits:
    return Limits(rpm=row["rpm"], tpm=row["tpm"], budget=row["budget"], period=row["period"])


def all_limits(tx: Transaction) -> list[Row]:
    """Every scope's limit record."""
    return tx.fetch_all("SELECT scope, subject, rpm, tpm, budget, period FROM quota_limits")


def change_limits(
    tx: Transaction, scope: str, subject: str, change: Mapping[str, Any], now: float
) -> Limits:
    """Apply ``change`` to the stored limits of ``scope`` ``subject`` (read in the same
    transaction, so two processes' changes do not lose each other's fields)."""
    row = tx.fetch_one(
        "SELECT rpm, tpm, budget, period FROM quota_limits WHERE scope = ? AND subject = ?",
        (scope, subject),
    )
    limits = merge_limits(NONE if row is None else limits_of(row), change)
    if limits.empty:
        tx.execute("DELETE FROM quota_limits WHERE scope = ? AND subject = ?", (scope, subject))
        return limits
    tx.execute(
        "INSERT INTO quota_limits (scope, subject, rpm, tpm, budget, period, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (scope, subject) DO UPDATE SET "
        "rpm = excluded.rpm, tpm = excluded.tpm, budget = excluded.budget, "
        "period = excluded.period, updated_at = excluded.updated_at",
        (scope, subject, limits.rpm, limits.tpm, limits.budget, limits.period, now),
    )
    return limits


def current_counters(tx: Transaction, minute: int, day: int, month: int) -> list[Row]:
    """The counters that still decide: this minute's and the last, this day's and month's."""
    return tx.fetch_all(
        "SELECT subject, kind, window_start, requests, tokens, spend FROM quota_counters "
        "WHERE (kind = 'minute' AND window_start >= ?) OR (kind = 'day' AND window_start = ?) "
        "OR (kind = 'month' AND window_start = ?)",
        (minute - 60, day, month),
    )


def sync(
    tx: Transaction, pending: Pending, minute: int, day: int, month: int
) -> tuple[list[Row], list[Row]]:
    """Add this process's ``pending`` counts, drop windows that no longer decide, and
    return the totals that do and every limit record (one transaction)."""
    for (subject, kind, start), (requests, tokens, spend) in pending.items():
        tx.execute(_UPSERT, (subject, kind, start, requests, tokens, spend))
    tx.execute(
        "DELETE FROM quota_counters WHERE (kind = 'minute' AND window_start < ?) "
        "OR (kind = 'day' AND window_start < ?) OR (kind = 'month' AND window_start < ?)",
        (minute - 60, day, month),
    )
    return current_counters(tx, minute, day, month), all_limits(tx)
