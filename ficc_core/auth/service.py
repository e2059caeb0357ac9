"""Projects, users, bearer credentials and browser sessions.

A bearer credential belongs to exactly one project and carries its own scopes.
A browser session belongs to a user and to the one project chosen at login; its
scopes are the user's scopes in that project (every scope for an administrator).

Every credential is minted by :meth:`AuthService.create_credential`, the one place
that bounds its lifetime (never past ``token_max_lifetime``, never past its issuer's
expiry) and records its issuer, so revoking an issuer revokes what it minted.
"""

from __future__ import annotations

import hmac
import json
import math
import time
from collections import OrderedDict
from functools import partial
from typing import Any, Literal

import attrs
import trio

from ..errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated
from ..store import Store, Transaction
from . import secrets as sec
from .scopes import ADMIN, ALL_SCOPES, PROJECT_SCOPES, check_scopes
from .throttle import LoginThrottle

SESSION_PREFIX = "fs_"
#: Seconds a verified bearer credential is served from memory (see ``authenticate_bearer``).
CREDENTIAL_CACHE_SECONDS = 5.0
#: Credentials kept in that cache, least recently used dropped first.
CREDENTIAL_CACHE_SIZE = 10_000


def revocation_statement() -> str:
    """What a revocation written by another process does; docs/api.md and docs/gateway.md
    both carry this sentence (a test compares them with it)."""
    seconds = f"{CREDENTIAL_CACHE_SECONDS:g}"
    return (
        "A credential revoked by another process sharing the database (`ficc admin "
        f"revoke-token`) stops working within {seconds} s: its new requests are refused "
        f"and the responses it has streaming end (the controller looks for new "
        f"revocations every {seconds} s)."
    )


@attrs.frozen
class Principal:
    """Who is making a request, in which project, with which scopes."""

    kind: Literal["credential", "session"]
    id: str
    project_id: str
    project_name: str
    scopes: frozenset[str]
    user_id: str | None = None
    username: str | None = None
    is_admin: bool = False
    expires_at: float | None = None
    csrf_hash: str | None = attrs.field(default=None, repr=False)
    #: For a service-bound invoke credential, the one inference service it may invoke.
    service_id: str | None = None

    def may_invoke(self, service_id: str) -> bool:
        """Whether this principal may invoke inference service ``service_id``."""
        return "inference:invoke" in self.scopes and self.service_id in (None, service_id)

    def describe(self) -> dict[str, Any]:
        """Return the public description of this principal (``GET /whoami``)."""
        return {
            "kind": self.kind,
            "id": self.id,
            "user": None
            if self.user_id is None
            else {"id": self.user_id, "username": self.username, "admin": self.is_admin},
            "project": {"id": self.project_id, "name": self.project_name},
            "scopes": sorted(self.scopes),
            "expires_at": self.expires_at,
            "service_id": self.service_id,
        }


def _revoked_since(since: float, tx: Transaction) -> list[dict[str, Any]]:
    return tx.fetch_all("SELECT id, revoked_at FROM credentials WHERE revoked_at >= ?", (since,))


def _project_row(tx: Transaction, ref: str) -> dict[str, Any]:
    row = tx.fetch_one("SELECT * FROM projects WHERE id = ? OR name = ?", (ref, ref))
    if row is None:
        raise NotFound(f"no project {ref!r}", code="project_not_found", details={"project": ref})
    return row


def _installation_level(row: dict[str, Any]) -> bool:
    # A credential holding ``admin`` (the first run's, say) acts beyond its project:
    # only administrators see or revoke it.
    return ADMIN in json.loads(row["scopes"])


def _minted_by(tx: Transaction, issuer_id: str) -> list[str]:
    """Every credential minted by ``issuer_id``, and by those, transitively."""
    rows = tx.fetch_all(
        "WITH RECURSIVE minted(id) AS ("
        " SELECT id FROM credentials WHERE issuer_id = ?"
        " UNION SELECT c.id FROM credentials c JOIN minted m ON c.issuer_id = m.id)"
        " SELECT id FROM minted",
        (issuer_id,),
    )
    return [row["id"] for row in rows]


def _revoke(tx: Transaction, ids: list[str], now: float) -> None:
    for credential_id in ids:
        tx.execute(
            "UPDATE credentials SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
            (now, credential_id),
        )


def _credential_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        "project_id": row["project_id"],
        "user_id": row["user_id"],
        "scopes": json.loads(row["scopes"]),
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
        "revoked_at": row["revoked_at"],
        "service_id": row["service_id"],
        "issuer_id": row["issuer_id"],
    }


def _user_view(row: dict[str, Any], memberships: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "username": row["username"],
        "admin": bool(row["is_admin"]),
        "created_at": row["created_at"],
        "projects": [
            {"project_id": m["project_id"], "scopes": json.loads(m["scopes"])} for m in memberships
        ],
    }


class AuthService:
    """Authentication and the records behind it, all through the :class:`Store`."""

    def __init__(
        self,
        store: Store,
        *,
        session_lifetime: float = 12 * 3600.0,
        token_max_lifetime: float = 90 * 86400.0,
        login_throttle: LoginThrottle | None = None,
    ) -> None:
        self.store = store
        self.session_lifetime = session_lifetime
        self.token_max_lifetime = token_max_lifetime
        self.login_throttle = login_throttle or LoginThrottle()
        self._password_limiter = trio.CapacityLimiter(2)
        # Credential and session IDs revoked (or logged out) in this process, so a
        # streaming response can re-check its authority per chunk without SQLite.
        self._revoked: set[str] = set()
        # Recently verified credentials: id -> (secret hash, principal, monotonic time).
        self._credentials: OrderedDict[str, tuple[str, Principal, float]] = OrderedDict()

    # -- projects -------------------------------------------------------------

    async def create_project(self, name: str) -> dict[str, Any]:
        """Create a project; a taken name is a conflict."""
        record = {"id": sec.new_id(), "name": name, "created_at": time.time()}

        def insert(tx: Transaction) -> dict[str, Any]:
            if tx.fetch_one("SELECT id FROM projects WHERE name = ?", (name,)):
                raise Conflict(
                    f"a project named {name!r} already exists",
                    code="project_exists",
                    details={"name": name},
                )
            tx.execute(
                "INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?)",
                (record["id"], name, record["created_at"]),
            )
            return record

        return await self.store.write(insert)

    async def list_projects(self) -> list[dict[str, Any]]:
        """Return every project, oldest first."""
        return await self.store.read(
            lambda tx: tx.fetch_all("SELECT * FROM projects ORDER BY created_at, name")
        )

    async def get_project(self, ref: str) -> dict[str, Any]:
        """Return a project by id or name."""
        return await self.store.read(lambda tx: _project_row(tx, ref))

    # -- users ----------------------------------------------------------------

    async def create_user(
        self,
        username: str,
        password: str,
        *,
        admin: bool = False,
        projects: dict[str, frozenset[str]] | None = None,
    ) -> dict[str, Any]:
        """Create a user with an argon2 password hash and project memberships."""
        if len(password) < 8:
            raise InvalidRequest(
                "a password needs at least 8 characters",
                details={"errors": [{"path": "$.password", "message": "too short"}]},
            )
        grants = {ref: check_scopes(scopes) - {ADMIN} for ref, scopes in (projects or {}).items()}
        password_hash = await sec.hash_password(password, self._password_limiter)
        user_id, now = sec.new_id(), time.time()

        def insert(tx: Transaction) -> dict[str, Any]:
            if tx.fetch_one("SELECT id FROM users WHERE username = ?", (username,)):
                raise Conflict(
                    f"a user named {username!r} already exists",
                    code="user_exists",
                    details={"username": username},
                )
            tx.execute(
                "INSERT INTO users (id, username, password_hash, is_admin, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (user_id, username, password_hash, int(admin), now),
            )
            for ref, scopes in grants.items():
                project = _project_row(tx, ref)
                tx.execute(
                    "INSERT INTO memberships (user_id, project_id, scopes) VALUES (?, ?, ?)",
                    (user_id, project["id"], json.dumps(sorted(scopes))),
                )
            return self._user(tx, user_id)

        return await self.store.write(insert)

    @staticmethod
    def _user(tx: Transaction, user_id: str) -> dict[str, Any]:
        row = tx.fetch_one("SELECT * FROM users WHERE id = ?", (user_id,))
        if row is None:
            raise NotFound(f"no user {user_id!r}", code="user_not_found")
        memberships = tx.fetch_all(
            "SELECT project_id, scopes FROM memberships WHERE user_id = ? ORDER BY project_id",
            (user_id,),
        )
        return _user_view(row, memberships)

    async def list_users(self) -> list[dict[str, Any]]:
        """Return every user with their memberships (never a password hash)."""

        def read(tx: Transaction) -> list[dict[str, Any]]:
            ids = tx.fetch_all("SELECT id FROM users ORDER BY created_at, username")
            return [self._user(tx, row["id"]) for row in ids]

        return await self.store.read(read)

    async def set_membership(
        self, user_id: str, project_ref: str, scopes: frozenset[str]
    ) -> dict[str, Any]:
        """Set a user's scopes in a project (an empty set removes the membership)."""
        scopes = check_scopes(scopes) - {ADMIN}

        def write(tx: Transaction) -> dict[str, Any]:
            self._user(tx, user_id)
            project = _project_row(tx, project_ref)
            tx.execute(
                "DELETE FROM memberships WHERE user_id = ? AND project_id = ?",
                (user_id, project["id"]),
            )
            if scopes:
                tx.execute(
                    "INSERT INTO memberships (user_id, project_id, scopes) VALUES (?, ?, ?)",
                    (user_id, project["id"], json.dumps(sorted(scopes))),
                )
            return self._user(tx, user_id)

        return await self.store.write(write)

    async def has_users(self) -> bool:
        """Whether any user exists (first-run bootstrap checks this)."""
        return await self.store.read(
            lambda tx: tx.fetch_one("SELECT 1 AS found FROM users LIMIT 1") is not None
        )

    # -- bearer credentials ---------------------------------------------------

    async def create_credential(
        self,
        project_ref: str,
        *,
        name: str,
        scopes: frozenset[str],
        user_id: str | None = None,
        lifetime: float | None = None,
        issuer: Principal | None = None,
        service_id: str | None = None,
    ) -> tuple[dict[str, Any], str]:
        """Create a credential; return its record and the token, which is shown only once.

        When ``issuer`` is given, the new credential may carry only scopes the
        issuer holds, and only in the issuer's own project. With ``service_id``, it
        is bound to that one inference service (only ``inference:invoke`` makes sense).

        Its lifetime is capped, never refused: at ``token_max_lifetime``, and at the
        issuer's remaining lifetime (an absent ``lifetime`` asks for the longest
        allowed). When capped, the record says so in ``capped`` (``requested``,
        ``granted`` seconds and ``by``: ``token_max_lifetime`` or ``issuer_expiry``).
        The issuer is recorded: revoking it revokes this credential too.
        """
        scopes = check_scopes(scopes)
        if not scopes:
            raise InvalidRequest(
                "a credential needs at least one scope",
                details={"errors": [{"path": "$.scopes", "message": "empty"}]},
            )
        if issuer is not None:
            beyond = sorted(scopes - issuer.scopes)
            if beyond:
                raise Forbidden(
                    f"you cannot grant scopes you do not hold: {', '.join(beyond)}",
                    code="scope_escalation",
                    details={"scopes": beyond},
                )
        credential_id, secret, now = sec.new_id(), sec.new_secret(), time.time()
        expires_at, capped = self._expiry(lifetime, issuer, now)
        issuer_id = None if issuer is None else issuer.id

        def insert(tx: Transaction) -> dict[str, Any]:
            project = _project_row(tx, project_ref)
            tx.execute(
                "INSERT INTO credentials (id, secret_hash, project_id, user_id, name, scopes,"
                " created_at, expires_at, service_id, issuer_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    credential_id,
                    sec.hash_secret(secret),
                    project["id"],
                    user_id,
                    name,
                    json.dumps(sorted(scopes)),
                    now,
                    expires_at,
                    service_id,
                    issuer_id,
                ),
            )
            row = tx.fetch_one("SELECT * FROM credentials WHERE id = ?", (credential_id,))
            return _credential_view(row)

        record = await self.store.write(insert)
        if capped is not None:
            record["capped"] = capped
        return record, sec.make_token(credential_id, secret)

    def _expiry(
        self, lifetime: float | None, issuer: Principal | None, now: float
    ) -> tuple[float, dict[str, Any] | None]:
        """The expiry of a credential asked to live ``lifetime`` seconds, and the cap if any."""
        if lifetime is not None and not (math.isfinite(lifetime) and lifetime > 0):
            raise InvalidRequest(
                "a credential lifetime must be a positive, finite number of seconds",
                details={"errors": [{"path": "$.lifetime", "message": "must be positive"}]},
            )
        expires_at, by = now + self.token_max_lifetime, "token_max_lifetime"
        if issuer is not None and issuer.expires_at is not None:
            if issuer.expires_at <= now:
                raise Unauthenticated("the credential has expired", code="credential_expired")
            if issuer.expires_at < expires_at:
                expires_at, by = issuer.expires_at, "issuer_expiry"
        if lifetime is not None and now + lifetime <= expires_at:
            return now + lifetime, None
        return expires_at, {"requested": lifetime, "granted": expires_at - now, "by": by}

    async def list_credentials(
        self, project_id: str, *, installation: bool = True
    ) -> list[dict[str, Any]]:
        """Return the project's credentials (never their secrets).

        Without ``installation`` (a caller lacking ``admin``), credentials that hold
        ``admin`` are left out: they are not the project's to manage.
        """
        rows = await self.store.read(
            lambda tx: tx.fetch_all(
                "SELECT * FROM credentials WHERE project_id = ? ORDER BY created_at, id",
                (project_id,),
            )
        )
        return [
            _credential_view(row) for row in rows if installation or not _installation_level(row)
        ]

    async def get_credential(
        self, project_id: str, credential_id: str, *, installation: bool = True
    ) -> dict[str, Any]:
        """Return one credential of the project; another project's is not found.

        Without ``installation``, neither is one that holds ``admin``.
        """
        row = await self.store.read(
            lambda tx: tx.fetch_one(
                "SELECT * FROM credentials WHERE id = ? AND project_id = ?",
                (credential_id, project_id),
            )
        )
        if row is None or not (installation or not _installation_level(row)):
            raise NotFound(
                f"no credential {credential_id!r} in this project",
                code="credential_not_found",
                details={"id": credential_id},
            )
        return _credential_view(row)

    async def revoke_credential(
        self, project_id: str | None, credential_id: str, *, installation: bool = True
    ) -> dict[str, Any]:
        """Revoke a credential (of ``project_id``, or any project when it is ``None``).

        Every credential it minted, and those they minted, is revoked with it in the
        same transaction; the record lists them in ``also_revoked``. Without
        ``installation``, a credential holding ``admin`` is not found.
        """
        now = time.time()

        def write(tx: Transaction) -> tuple[dict[str, Any], list[str]]:
            row = tx.fetch_one("SELECT * FROM credentials WHERE id = ?", (credential_id,))
            if (
                row is None
                or (project_id is not None and row["project_id"] != project_id)
                or not (installation or not _installation_level(row))
            ):
                raise NotFound(
                    f"no credential {credential_id!r} in this project",
                    code="credential_not_found",
                    details={"id": credential_id},
                )
            minted = _minted_by(tx, credential_id)
            _revoke(tx, [credential_id, *minted], now)
            record = tx.fetch_one("SELECT * FROM credentials WHERE id = ?", (credential_id,))
            return _credential_view(record), minted

        record, minted = await self.store.write(write)
        for revoked in (credential_id, *minted):
            self._mark_revoked(revoked)
        return {**record, "also_revoked": minted}

    # -- live authority (the request path re-checks it while a response streams) --------

    def _mark_revoked(self, principal_id: str) -> None:
        self._revoked.add(principal_id)
        self._credentials.pop(principal_id, None)

    async def watch_revocations(
        self,
        period: float = CREDENTIAL_CACHE_SECONDS,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Learn revocations written by other processes (``ficc admin revoke``), forever.

        Every ``period`` seconds one query finds credentials revoked since the last
        look; they join the in-process revocations, so responses streaming for them
        end too, not only their next requests.
        """
        since = time.time()
        task_status.started()
        while True:
            await trio.sleep(period)
            rows = await self.store.read(
                partial(
                    _revoked_since,
                    since,
                )
            )
            for row in rows:
                if row["id"] not in self._revoked:
                    self._mark_revoked(row["id"])
                since = max(since, row["revoked_at"])

    def still_valid(self, principal: Principal, now: float | None = None) -> bool:
        """Whether ``principal`` is still authorised, without touching the store.

        False once its credential was revoked (or its session logged out) in this
        process, or once it expired. Cheap enough to call for every chunk of a response.
        """
        if principal.id in self._revoked:
            return False
        expires_at = principal.expires_at
        return expires_at is None or expires_at > (time.time() if now is None else now)

    def check_valid(self, principal: Principal) -> None:
        """Raise :class:`Unauthenticated` unless :meth:`still_valid` holds."""
        if principal.id in self._revoked:
            raise Unauthenticated("the credential has been revoked", code="credential_revoked")
        if principal.expires_at is not None and principal.expires_at <= time.time():
            raise Unauthenticated("the credential has expired", code="credential_expired")

    async def authenticate_bearer(self, token: str) -> Principal:
        """Return the principal of a bearer token, or raise :class:`Unauthenticated`.

        A credential verified in the last :data:`CREDENTIAL_CACHE_SECONDS` is checked
        in memory (its secret's hash, revocation here, expiry): the request path does
        not read SQLite for every request. Revocations through this controller take
        effect at once; those written by another process within the cache period.
        """
        parts = sec.split_token(token)
        if parts is None:
            raise Unauthenticated(
                "the bearer token is not a FICC credential", code="invalid_credential"
            )
        credential_id, secret = parts
        presented = sec.hash_secret(secret)
        now = time.monotonic()
        cached = self._credentials.get(credential_id)
        if cached is not None and now - cached[2] < CREDENTIAL_CACHE_SECONDS:
            secret_hash, principal, _ = cached
            if hmac.compare_digest(presented, secret_hash):
                self._credentials.move_to_end(credential_id)
                self.check_valid(principal)
                return principal

        def read(tx: Transaction) -> dict[str, Any] | None:
            return tx.fetch_one(
                "SELECT c.*, p.name AS project_name, u.username, u.is_admin"
                " FROM credentials c JOIN projects p ON p.id = c.project_id"
                " LEFT JOIN users u ON u.id = c.user_id WHERE c.id = ?",
                (credential_id,),
            )

        row = await self.store.read(read)
        if row is None or not hmac.compare_digest(presented, row["secret_hash"]):
            raise Unauthenticated("the bearer credential is not valid", code="invalid_credential")
        if row["revoked_at"] is not None:
            raise Unauthenticated(
                "the bearer credential has been revoked", code="credential_revoked"
            )
        if row["expires_at"] is not None and row["expires_at"] <= time.time():
            raise Unauthenticated("the bearer credential has expired", code="credential_expired")
        principal = Principal(
            kind="credential",
            id=row["id"],
            project_id=row["project_id"],
            project_name=row["project_name"],
            scopes=frozenset(json.loads(row["scopes"])),
            user_id=row["user_id"],
            username=row["username"],
            is_admin=bool(row["is_admin"]),
            expires_at=row["expires_at"],
            service_id=row["service_id"],
        )
        self._credentials[credential_id] = (row["secret_hash"], principal, now)
        self._credentials.move_to_end(credential_id)
        while len(self._credentials) > CREDENTIAL_CACHE_SIZE:
            self._credentials.popitem(last=False)
        return principal

    # -- browser sessions -----------------------------------------------------

    async def login(
        self, username: str, password: str, project_ref: str, *, address: str = ""
    ) -> tuple[Principal, str, str]:
        """Check a password and open a session in one project.

        Return the principal, the session cookie value and the CSRF token. Failed
        logins are bounded per user and client ``address`` (see :mod:`.throttle`):
        past the limits this raises :class:`~.throttle.LoginThrottled` before the
        password is checked.
        """
        with self.login_throttle.attempt(username, address) as record:
            row = await self.store.read(
                lambda tx: tx.fetch_one("SELECT * FROM users WHERE username = ?", (username,))
            )
            stored = row["password_hash"] if row else None
            verified = await sec.verify_password(password, stored, self._password_limiter)
            record(verified)
        if not verified:
            raise Unauthenticated("the username or password is wrong", code="invalid_login")
        session_id, secret, csrf = sec.new_id(), sec.new_secret(), sec.new_secret()
        now = time.time()
        expires_at = now + self.session_lifetime

        def write(tx: Transaction) -> None:
            project = _project_row(tx, project_ref)
            if not row["is_admin"] and not tx.fetch_one(
                "SELECT 1 AS found FROM memberships WHERE user_id = ? AND project_id = ?",
                (row["id"], project["id"]),
            ):
                raise Forbidden(
                    f"user {username!r} is not a member of project {project['name']!r}",
                    code="not_a_member",
                    details={"project": project["name"]},
                )
            tx.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))
            tx.execute(
                "INSERT INTO sessions (id, secret_hash, csrf_hash, user_id, project_id,"
                " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    sec.hash_secret(secret),
                    sec.hash_secret(csrf),
                    row["id"],
                    project["id"],
                    now,
                    expires_at,
                ),
            )

        await self.store.write(write)
        cookie = sec.make_token(session_id, secret, SESSION_PREFIX)
        return await self.authenticate_session(cookie), cookie, csrf

    async def authenticate_session(self, cookie: str) -> Principal:
        """Return the principal of a session cookie, or raise :class:`Unauthenticated`."""
        parts = sec.split_token(cookie, SESSION_PREFIX)
        if parts is None:
            raise Unauthenticated("the session cookie is not valid", code="invalid_session")
        session_id, secret = parts

        def read(tx: Transaction) -> tuple[dict[str, Any] | None, list[str]]:
            row = tx.fetch_one(
                "SELECT s.*, p.name AS project_name, u.username, u.is_admin"
                " FROM sessions s JOIN projects p ON p.id = s.project_id"
                " JOIN users u ON u.id = s.user_id WHERE s.id = ?",
                (session_id,),
            )
            if row is None:
                return None, []
            membership = tx.fetch_one(
                "SELECT scopes FROM memberships WHERE user_id = ? AND project_id = ?",
                (row["user_id"], row["project_id"]),
            )
            return row, json.loads(membership["scopes"]) if membership else []

        row, scopes = await self.store.read(read)
        if row is None or not sec.secret_matches(secret, row["secret_hash"]):
            raise Unauthenticated("the session is not valid; log in again", code="invalid_session")
        if row["expires_at"] <= time.time():
            raise Unauthenticated("the session has expired; log in again", code="session_expired")
        is_admin = bool(row["is_admin"])
        return Principal(
            kind="session",
            id=row["id"],
            project_id=row["project_id"],
            project_name=row["project_name"],
            scopes=frozenset(ALL_SCOPES if is_admin else scopes),
            user_id=row["user_id"],
            username=row["username"],
            is_admin=is_admin,
            expires_at=row["expires_at"],
            csrf_hash=row["csrf_hash"],
        )

    async def logout(self, session_id: str) -> None:
        """End a session and revoke what it minted (responses streaming under them end too)."""
        now = time.time()

        def write(tx: Transaction) -> list[str]:
            tx.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            minted = _minted_by(tx, session_id)
            _revoke(tx, minted, now)
            return minted

        for revoked in (session_id, *await self.store.write(write)):
            self._mark_revoked(revoked)

    # -- first run --------------------------------------------------------------

    async def bootstrap(self) -> dict[str, Any] | None:
        """On an empty store, create the ``default`` project, an ``admin`` user and token.

        Return the generated password and token (to hand over once) and the token's
        ``expires_at``, or ``None`` when users already exist. The token holds ``admin``,
        so project token managers neither see nor revoke it.
        """
        if await self.has_users():
            return None
        try:
            project = await self.get_project("default")
        except NotFound:
            project = await self.create_project("default")
        password = sec.new_secret()[:24]
        user = await self.create_user(
            "admin", password, admin=True, projects={project["id"]: frozenset(PROJECT_SCOPES)}
        )
        record, token = await self.create_credential(
            project["id"], name="bootstrap", scopes=frozenset(ALL_SCOPES), user_id=user["id"]
        )
        return {
            "project": project["name"],
            "username": "admin",
            "password": password,
            "token": token,
            "expires_at": record["expires_at"],
        }
