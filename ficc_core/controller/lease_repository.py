"""All SQL of the leader lease: the ``controller_leader`` row and the ``controllers`` table.

Plain functions over a :class:`~ficc_core.store.Transaction`, in the portable subset;
:mod:`~ficc_core.controller.lease` composes them into a claim or a release inside one
lease write. Each write of the leader row is conditional on the row its caller read and
says whether it took effect (one row changed): under PostgreSQL's read-committed
isolation a concurrent claim blocks on the row and then finds it changed, so two
claimants can never both take one term.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lease_records import ControllerRow, LeaderRow, Role

if TYPE_CHECKING:
    from ..store import Row, Transaction


def _leader(row: Row | None) -> LeaderRow | None:
    if row is None:
        return None
    return LeaderRow(
        holder=row["holder"],
        url=row["url"],
        term=int(row["term"]),
        acquired_at=float(row["acquired_at"]),
        expires_at=float(row["expires_at"]),
    )


def read_leader(tx: Transaction) -> LeaderRow | None:
    """The leader row, or None before any controller ever took it."""
    return _leader(
        tx.fetch_one(
            "SELECT holder, url, term, acquired_at, expires_at FROM controller_leader WHERE id = 1"
        )
    )


def read_controllers(tx: Transaction) -> list[ControllerRow]:
    """Every controller seen on the store, by ID."""
    rows = tx.fetch_all(
        "SELECT id, url, role, term, started_at, seen_at FROM controllers ORDER BY id"
    )
    return [
        ControllerRow(
            id=row["id"],
            url=row["url"],
            role=row["role"],
            term=int(row["term"]),
            started_at=float(row["started_at"]),
            seen_at=float(row["seen_at"]),
        )
        for row in rows
    ]


def renew(tx: Transaction, me: str, url: str, term: int, now: float, until: float) -> bool:
    """Extend the lease ``me`` holds at ``term`` to ``until`` (and its URL), unless it ran
    out by ``now`` or names another holder or term."""
    return (
        tx.execute(
            "UPDATE controller_leader SET expires_at = ?, url = ? "
            "WHERE id = 1 AND holder = ? AND term = ? AND expires_at > ?",
            (until, url, me, term, now),
        )
        == 1
    )


def take_first(tx: Transaction, me: str, url: str, now: float, until: float) -> bool:
    """Write the first leader row (term 1) for ``me``, unless one exists by now."""
    return (
        tx.execute(
            "INSERT INTO controller_leader (id, holder, url, term, acquired_at, expires_at) "
            "VALUES (1, ?, ?, 1, ?, ?) ON CONFLICT (id) DO NOTHING",
            (me, url, now, until),
        )
        == 1
    )


def take_over(
    tx: Transaction, me: str, url: str, term: int, now: float, until: float, expired_term: int
) -> bool:
    """Take the lease for ``me`` at ``term`` from the claim of ``expired_term``, unless
    that claim was renewed or taken meanwhile."""
    return (
        tx.execute(
            "UPDATE controller_leader SET holder = ?, url = ?, term = ?, acquired_at = ?, "
            "expires_at = ? WHERE id = 1 AND term = ? AND expires_at <= ?",
            (me, url, term, now, until, expired_term, now),
        )
        == 1
    )


def expire(tx: Transaction, me: str, term: int, now: float) -> None:
    """End the lease now if ``me`` holds it at ``term``."""
    tx.execute(
        "UPDATE controller_leader SET expires_at = ? WHERE id = 1 AND holder = ? AND term = ?",
        (now, me, term),
    )


def seen(
    tx: Transaction, me: str, url: str, role: Role, term: int, started_at: float, now: float
) -> None:
    """Record ``me`` as seen now, in ``role`` at ``term``."""
    tx.execute(
        "INSERT INTO controllers (id, url, role, term, started_at, seen_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET url = excluded.url, "
        "role = excluded.role, term = excluded.term, started_at = excluded.started_at, "
        "seen_at = excluded.seen_at",
        (me, url, str(role), term, started_at, now),
    )


__all__ = [
    "expire",
    "read_controllers",
    "read_leader",
    "renew",
    "seen",
    "take_first",
    "take_over",
]
