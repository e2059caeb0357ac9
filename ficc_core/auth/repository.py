"""Every SQL statement of authentication: projects, users, credentials, sessions.

Plain functions over a :class:`~ficc_core.store.Transaction`, taking and returning
the records of :mod:`.records`. Scopes are stored as a sorted JSON list.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..base.errors import NotFound
from ..store import Transaction
from .records import (
    PERSONAL_PROJECT,
    Credential,
    Membership,
    NewSession,
    Project,
    Shares,
    StoredCredential,
    StoredSession,
    User,
    UserLogin,
    UserStatus,
)


def _scopes(stored: str) -> tuple[str, ...]:
    return tuple(json.loads(stored))


def _stored_scopes(scopes: Iterable[str]) -> str:
    return json.dumps(sorted(scopes))


# -- projects ------------------------------------------------------------------------------


def _project(row: dict[str, Any]) -> Project:
    return Project(id=row["id"], name=row["name"], created_at=row["created_at"], band=row["band"])


def find_project(tx: Transaction, ref: str) -> Project | None:
    """The project whose id or name is ``ref`` (never the reserved personal one)."""
    row = tx.fetch_one(
        "SELECT id, name, created_at, band FROM projects WHERE (id = ? OR name = ?) AND id != ?",
        (ref, ref, PERSONAL_PROJECT),
    )
    return None if row is None else _project(row)


def require_project(tx: Transaction, ref: str) -> Project:
    """The project whose id or name is ``ref``, or :class:`NotFound` (``project_not_found``)."""
    project = find_project(tx, ref)
    if project is None:
        raise NotFound(f"no project {ref!r}", code="project_not_found", details={"project": ref})
    return project


def project_name_taken(tx: Transaction, name: str) -> bool:
    """Whether a project is named ``name`` (the reserved personal project's name is taken)."""
    if name == PERSONAL_PROJECT:
        return True
    return tx.fetch_one("SELECT id FROM projects WHERE name = ?", (name,)) is not None


def ensure_personal_project(tx: Transaction) -> None:
    """Write the reserved personal project's row if it is not there yet."""
    tx.execute(
        "INSERT OR IGNORE INTO projects (id, name, created_at) VALUES (?, ?, 0)",
        (PERSONAL_PROJECT, PERSONAL_PROJECT),
    )


def insert_project(tx: Transaction, project: Project) -> None:
    """Store a new project."""
    tx.execute(
        "INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?)",
        (project.id, project.name, project.created_at),
    )


def list_projects(tx: Transaction) -> list[Project]:
    """Every project, oldest first (not the reserved personal one)."""
    rows = tx.fetch_all(
        "SELECT id, name, created_at, band FROM projects WHERE id != ? ORDER BY created_at, name",
        (PERSONAL_PROJECT,),
    )
    return [_project(row) for row in rows]


def set_project_band(tx: Transaction, project_id: str, band: str | None) -> None:
    """Set (``None``: clear) the project's priority band."""
    tx.execute("UPDATE projects SET band = ? WHERE id = ?", (band, project_id))


# -- users and memberships -------------------------------------------------------------------


def username_taken(tx: Transaction, username: str) -> bool:
    """Whether a user is named ``username``."""
    return tx.fetch_one("SELECT id FROM users WHERE username = ?", (username,)) is not None


def has_users(tx: Transaction) -> bool:
    """Whether any user exists."""
    return tx.fetch_one("SELECT 1 AS found FROM users LIMIT 1") is not None


def insert_user(
    tx: Transaction,
    user_id: str,
    username: str,
    password_hash: str,
    *,
    is_admin: bool,
    created_at: float,
    status: UserStatus = UserStatus.ACTIVE,
) -> None:
    """Store a new user (memberships are added with :func:`insert_membership`)."""
    tx.execute(
        "INSERT INTO users (id, username, password_hash, is_admin, created_at, status)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (user_id, username, password_hash, int(is_admin), created_at, str(status)),
    )


def find_user(tx: Transaction, user_id: str) -> User | None:
    """A user with their memberships (ordered by project id)."""
    row = tx.fetch_one(
        "SELECT id, username, is_admin, created_at, status FROM users WHERE id = ?", (user_id,)
    )
    if row is None:
        return None
    memberships = tx.fetch_all(
        "SELECT project_id, scopes FROM memberships WHERE user_id = ? ORDER BY project_id",
        (user_id,),
    )
    return User(
        id=row["id"],
        username=row["username"],
        is_admin=bool(row["is_admin"]),
        created_at=row["created_at"],
        projects=tuple(Membership(m["project_id"], _scopes(m["scopes"])) for m in memberships),
        status=UserStatus(row["status"]),
    )


def find_user_ref(tx: Transaction, ref: str) -> User | None:
    """The user whose id or username is ``ref``."""
    row = tx.fetch_one("SELECT id FROM users WHERE id = ? OR username = ?", (ref, ref))
    return None if row is None else find_user(tx, row["id"])


def set_user_status(tx: Transaction, user_id: str, status: UserStatus) -> None:
    """Set the user's status."""
    tx.execute("UPDATE users SET status = ? WHERE id = ?", (str(status), user_id))


def set_password_hash(tx: Transaction, user_id: str, password_hash: str) -> None:
    """Replace the user's password hash."""
    tx.execute("UPDATE users SET password_hash = ? WHERE id = ?", (password_hash, user_id))


def list_users(tx: Transaction) -> list[User]:
    """Every user with their memberships, oldest first."""
    rows = tx.fetch_all("SELECT id FROM users ORDER BY created_at, username")
    return [user for row in rows if (user := find_user(tx, row["id"])) is not None]


def user_login(tx: Transaction, username: str) -> UserLogin | None:
    """What a login by ``username`` checks, if there is such a user."""
    row = tx.fetch_one(
        "SELECT id, is_admin, password_hash, status FROM users WHERE username = ?", (username,)
    )
    if row is None:
        return None
    return UserLogin(
        id=row["id"],
        is_admin=bool(row["is_admin"]),
        password_hash=row["password_hash"],
        status=UserStatus(row["status"]),
    )


def insert_membership(
    tx: Transaction, user_id: str, project_id: str, scopes: Iterable[str]
) -> None:
    """Give the user ``scopes`` in the project (which they are not a member of yet)."""
    tx.execute(
        "INSERT INTO memberships (user_id, project_id, scopes) VALUES (?, ?, ?)",
        (user_id, project_id, _stored_scopes(scopes)),
    )


def delete_membership(tx: Transaction, user_id: str, project_id: str) -> None:
    """Remove the user from the project."""
    tx.execute(
        "DELETE FROM memberships WHERE user_id = ? AND project_id = ?", (user_id, project_id)
    )


def is_member(tx: Transaction, user_id: str, project_id: str) -> bool:
    """Whether the user has a membership in the project."""
    return (
        tx.fetch_one(
            "SELECT 1 AS found FROM memberships WHERE user_id = ? AND project_id = ?",
            (user_id, project_id),
        )
        is not None
    )


# -- credentials ---------------------------------------------------------------------------

_CREDENTIAL_COLUMNS = (
    "c.id, c.name, c.project_id, c.user_id, c.scopes, c.created_at, c.expires_at,"
    " c.revoked_at, c.service_id, c.issuer_id, c.band"
)


def _credential(row: dict[str, Any]) -> Credential:
    return Credential(
        last_used_at=row.get("last_used_at"),
        id=row["id"],
        name=row["name"],
        project_id=row["project_id"],
        user_id=row["user_id"],
        scopes=_scopes(row["scopes"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        service_id=row["service_id"],
        issuer_id=row["issuer_id"],
        band=row["band"],
    )


def insert_credential(tx: Transaction, credential: Credential, secret_hash: str) -> None:
    """Store a new credential with its secret's hash."""
    tx.execute(
        "INSERT INTO credentials (id, secret_hash, project_id, user_id, name, scopes,"
        " created_at, expires_at, service_id, issuer_id, band)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            credential.id,
            secret_hash,
            credential.project_id,
            credential.user_id,
            credential.name,
            _stored_scopes(credential.scopes),
            credential.created_at,
            credential.expires_at,
            credential.service_id,
            credential.issuer_id,
            credential.band,
        ),
    )


def find_credential(tx: Transaction, credential_id: str) -> Credential | None:
    """One credential of any project."""
    row = tx.fetch_one(
        f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials c WHERE c.id = ?", (credential_id,)
    )
    return None if row is None else _credential(row)


def list_credentials(tx: Transaction, project_id: str) -> list[Credential]:
    """The project's credentials, oldest first, with when each was last used."""
    rows = tx.fetch_all(
        f"SELECT {_CREDENTIAL_COLUMNS}, (SELECT MAX(u.finished_at) FROM inference_usage u"
        " WHERE u.credential_id = c.id) AS last_used_at"
        " FROM credentials c WHERE c.project_id = ?"
        " ORDER BY c.created_at, c.id",
        (project_id,),
    )
    return [_credential(row) for row in rows]


def credentials_named(
    tx: Transaction, name: str, project_id: str | None, user_id: str | None = None
) -> list[Credential]:
    """The credentials called ``name`` (of ``project_id`` and ``user_id`` when given),
    those not revoked first, then newest first."""
    sql = f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials c WHERE c.name = ?"
    args: list[Any] = [name]
    if project_id is not None:
        sql += " AND c.project_id = ?"
        args.append(project_id)
    if user_id is not None:
        sql += " AND c.user_id = ?"
        args.append(user_id)
    sql += " ORDER BY CASE WHEN c.revoked_at IS NULL THEN 0 ELSE 1 END, c.created_at DESC, c.id"
    return [_credential(row) for row in tx.fetch_all(sql, args)]


def name_holder(
    tx: Transaction, project_id: str, name: str, user_id: str | None, now: float
) -> Credential | None:
    """The live credential (neither revoked nor expired) of the project called ``name``;
    in the personal project, only ``user_id``'s (each person's names are their own)."""
    holders = credentials_named(
        tx, name, project_id, user_id if project_id == PERSONAL_PROJECT else None
    )
    return next(
        (
            c
            for c in holders
            if c.revoked_at is None and (c.expires_at is None or c.expires_at > now)
        ),
        None,
    )


def list_personal_credentials(tx: Transaction, user_id: str) -> list[Credential]:
    """The person's personal keys, oldest first."""
    rows = tx.fetch_all(
        f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials c WHERE c.project_id = ?"
        " AND c.user_id = ? ORDER BY c.created_at, c.id",
        (PERSONAL_PROJECT, user_id),
    )
    return [_credential(row) for row in rows]


def stored_credential(tx: Transaction, credential_id: str) -> StoredCredential | None:
    """A credential with its secret's hash, project name and user, for authentication
    (a personal key's with the services shared with its person)."""
    row = tx.fetch_one(
        f"SELECT {_CREDENTIAL_COLUMNS}, c.secret_hash, p.name AS project_name, u.username,"
        " u.is_admin, p.band AS project_band, u.status AS user_status"
        " FROM credentials c JOIN projects p ON p.id = c.project_id"
        " LEFT JOIN users u ON u.id = c.user_id WHERE c.id = ?",
        (credential_id,),
    )
    if row is None:
        return None
    personal = row["project_id"] == PERSONAL_PROJECT and row["user_id"] is not None
    return StoredCredential(
        credential=_credential(row),
        secret_hash=row["secret_hash"],
        project_name=row["project_name"],
        username=row["username"],
        is_admin=bool(row["is_admin"]),
        project_band=row["project_band"],
        user_status=None if row["user_status"] is None else UserStatus(row["user_status"]),
        shared=shared_with(tx, row["user_id"]) if personal else frozenset(),
    )


def minted_by(tx: Transaction, issuer_id: str) -> list[str]:
    """The ids of every credential minted by ``issuer_id``, and by those, transitively."""
    rows = tx.fetch_all(
        "WITH RECURSIVE minted(id) AS ("
        " SELECT id FROM credentials WHERE issuer_id = ?"
        " UNION SELECT c.id FROM credentials c JOIN minted m ON c.issuer_id = m.id)"
        " SELECT id FROM minted",
        (issuer_id,),
    )
    return [row["id"] for row in rows]


def revoke(tx: Transaction, credential_ids: Iterable[str], now: float) -> None:
    """Mark the credentials revoked at ``now`` (those already revoked keep their time)."""
    for credential_id in credential_ids:
        tx.execute(
            "UPDATE credentials SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (now, credential_id),
        )


def revoked_since(tx: Transaction, since: float) -> list[tuple[str, float]]:
    """``(id, revoked_at)`` of every credential revoked at or after ``since``."""
    rows = tx.fetch_all("SELECT id, revoked_at FROM credentials WHERE revoked_at >= ?", (since,))
    return [(row["id"], row["revoked_at"]) for row in rows]


# -- sessions ------------------------------------------------------------------------------


def insert_session(tx: Transaction, session: NewSession) -> None:
    """Store a new session."""
    tx.execute(
        "INSERT INTO sessions (id, secret_hash, csrf_hash, user_id, project_id,"
        " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            session.id,
            session.secret_hash,
            session.csrf_hash,
            session.user_id,
            session.project_id,
            session.created_at,
            session.expires_at,
        ),
    )


def delete_expired_sessions(tx: Transaction, now: float) -> None:
    """Forget sessions that expired by ``now``."""
    tx.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))


def delete_session(tx: Transaction, session_id: str) -> None:
    """Forget one session."""
    tx.execute("DELETE FROM sessions WHERE id = ?", (session_id,))


def user_session_ids(tx: Transaction, user_id: str) -> list[str]:
    """The ids of the user's browser sessions."""
    rows = tx.fetch_all("SELECT id FROM sessions WHERE user_id = ?", (user_id,))
    return [row["id"] for row in rows]


def stored_session(tx: Transaction, session_id: str) -> StoredSession | None:
    """A session with its user, project and the user's scopes there, for authentication."""
    row = tx.fetch_one(
        "SELECT s.id, s.secret_hash, s.csrf_hash, s.user_id, s.project_id, s.expires_at,"
        " p.name AS project_name, p.band AS project_band, u.username, u.is_admin"
        " FROM sessions s JOIN projects p ON p.id = s.project_id"
        " JOIN users u ON u.id = s.user_id WHERE s.id = ?",
        (session_id,),
    )
    if row is None:
        return None
    membership = tx.fetch_one(
        "SELECT scopes FROM memberships WHERE user_id = ? AND project_id = ?",
        (row["user_id"], row["project_id"]),
    )
    return StoredSession(
        id=row["id"],
        secret_hash=row["secret_hash"],
        csrf_hash=row["csrf_hash"],
        user_id=row["user_id"],
        username=row["username"],
        is_admin=bool(row["is_admin"]),
        project_id=row["project_id"],
        project_name=row["project_name"],
        expires_at=row["expires_at"],
        scopes=() if membership is None else _scopes(membership["scopes"]),
        project_band=row["project_band"],
    )


# -- services shared with people ---------------------------------------------------------------


def set_shares(
    tx: Transaction, service_id: str, user_ids: Iterable[str], everyone: bool, now: float
) -> None:
    """Share the service with exactly ``user_ids`` (and everyone, when ``everyone``)."""
    tx.execute("DELETE FROM service_shares WHERE service_id = ?", (service_id,))
    for user_id in (*sorted(set(user_ids)), *([None] if everyone else [])):
        tx.execute(
            "INSERT INTO service_shares (service_id, user_id, created_at) VALUES (?, ?, ?)",
            (service_id, user_id, now),
        )


def shares_of(tx: Transaction, service_id: str) -> Shares:
    """Who the service is shared with, people by username."""
    rows = tx.fetch_all(
        "SELECT s.user_id, u.username FROM service_shares s"
        " LEFT JOIN users u ON u.id = s.user_id WHERE s.service_id = ? ORDER BY u.username",
        (service_id,),
    )
    return Shares(
        service_id=service_id,
        users=tuple((r["user_id"], r["username"]) for r in rows if r["user_id"] is not None),
        everyone=any(r["user_id"] is None for r in rows),
    )


def shared_with(tx: Transaction, user_id: str) -> frozenset[str]:
    """The ids of the services shared with the user or with everyone."""
    rows = tx.fetch_all(
        "SELECT service_id FROM service_shares WHERE user_id = ? OR user_id IS NULL", (user_id,)
    )
    return frozenset(row["service_id"] for row in rows)
