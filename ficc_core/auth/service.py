"""Authentication as one service: the directory, credentials, sessions and live authority.

A bearer credential belongs to exactly one project and carries its own scopes
(:mod:`.credentials`); a browser session belongs to a user and to the one project
chosen at login (:mod:`.sessions`); projects and users are the :mod:`.directory`;
:mod:`.authority` verifies bearer tokens and knows what was revoked. Every SQL
statement is in :mod:`.repository`; the records it returns are in :mod:`.records`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ..errors import NotFound
from ..store import Store
from . import secrets as sec
from .authority import CREDENTIAL_CACHE_SECONDS, Authority
from .credentials import Credentials
from .directory import Directory
from .principal import Principal
from .records import Credential, Project, Revocation, User
from .scopes import ALL_SCOPES, PROJECT_SCOPES
from .sessions import Sessions
from .throttle import LoginThrottle


class AuthService:
    """Authentication and the records behind it, all through the :class:`Store`.

    :param clock: wall-clock seconds: creation times, expiries and revocations
        (injected in tests, which move it instead of sleeping).
    :param credential_cache_seconds: how long a verified bearer credential is
        served from memory, and how often other processes' revocations are read.
    """

    def __init__(
        self,
        store: Store,
        *,
        session_lifetime: float = 12 * 3600.0,
        token_max_lifetime: float = 90 * 86400.0,
        login_throttle: LoginThrottle | None = None,
        clock: Callable[[], float] = time.time,
        credential_cache_seconds: float = CREDENTIAL_CACHE_SECONDS,
    ) -> None:
        self.store = store
        self.clock = clock
        # Each argon2 hash holds 64 MiB for a moment: at most two at once.
        limiter = trio.CapacityLimiter(2)
        self.authority = Authority(store, clock=clock, cache_seconds=credential_cache_seconds)
        self.directory = Directory(store, password_limiter=limiter, clock=clock)
        self.credentials = Credentials(
            store, self.authority, token_max_lifetime=token_max_lifetime, clock=clock
        )
        self.sessions = Sessions(
            store,
            self.authority,
            session_lifetime=session_lifetime,
            login_throttle=login_throttle or LoginThrottle(),
            password_limiter=limiter,
            clock=clock,
        )

    # -- the directory --------------------------------------------------------------------------

    async def create_project(self, name: str) -> Project:
        """Create a project; a taken name is a conflict (``project_exists``)."""
        return await self.directory.create_project(name)

    async def list_projects(self) -> list[Project]:
        """Every project, oldest first."""
        return await self.directory.list_projects()

    async def get_project(self, ref: str) -> Project:
        """A project by id or name (``project_not_found`` if none)."""
        return await self.directory.get_project(ref)

    async def create_user(
        self,
        username: str,
        password: str,
        *,
        admin: bool = False,
        projects: Mapping[str, frozenset[str]] | None = None,
    ) -> User:
        """Create a user with an argon2 password hash and memberships (project ref -> scopes)."""
        return await self.directory.create_user(username, password, admin=admin, projects=projects)

    async def list_users(self) -> list[User]:
        """Every user with their memberships (never a password hash)."""
        return await self.directory.list_users()

    async def set_membership(self, user_id: str, project_ref: str, scopes: frozenset[str]) -> User:
        """Set a user's scopes in a project (an empty set removes the membership)."""
        return await self.directory.set_membership(user_id, project_ref, scopes)

    async def has_users(self) -> bool:
        """Whether any user exists (first-run bootstrap checks this)."""
        return await self.directory.has_users()

    # -- bearer credentials ---------------------------------------------------------------------

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
    ) -> tuple[Credential, str]:
        """Create a credential; return it and the token, which is shown only once.

        When ``issuer`` is given, the new credential may carry only scopes the
        issuer holds, and only in the issuer's own project. With ``service_id``, it
        is bound to that one inference service (only ``inference:invoke`` makes sense).

        Its lifetime is capped, never refused: at ``token_max_lifetime``, and at the
        issuer's remaining lifetime (an absent ``lifetime`` asks for the longest
        allowed). When capped, the credential says so in ``capped`` (``requested``,
        ``granted`` seconds and ``by``: ``token_max_lifetime`` or ``issuer_expiry``).
        The issuer is recorded: revoking it revokes this credential too.
        """
        return await self.credentials.create(
            project_ref,
            name=name,
            scopes=scopes,
            user_id=user_id,
            lifetime=lifetime,
            issuer=issuer,
            service_id=service_id,
        )

    async def list_credentials(
        self, project_id: str, *, installation: bool = True
    ) -> list[Credential]:
        """The project's credentials (never their secrets).

        Without ``installation`` (a caller lacking ``admin``), credentials that hold
        ``admin`` are left out: they are not the project's to manage.
        """
        return await self.credentials.list(project_id, installation=installation)

    async def get_credential(
        self, project_id: str, credential_id: str, *, installation: bool = True
    ) -> Credential:
        """One credential of the project; another project's is not found.

        Without ``installation``, neither is one that holds ``admin``.
        """
        return await self.credentials.get(project_id, credential_id, installation=installation)

    async def revoke_credential(
        self, project_id: str | None, credential_id: str, *, installation: bool = True
    ) -> Revocation:
        """Revoke a credential (of ``project_id``, or any project when it is ``None``).

        Every credential it minted, and those they minted, is revoked with it in the
        same transaction (``also_revoked``). Without ``installation``, a credential
        holding ``admin`` is not found.
        """
        return await self.credentials.revoke(project_id, credential_id, installation=installation)

    # -- live authority (the request path re-checks it while a response streams) --------------

    async def authenticate_bearer(self, token: str) -> Principal:
        """The principal of a bearer token, or :class:`~ficc_core.errors.Unauthenticated`."""
        return await self.authority.authenticate_bearer(token)

    def still_valid(self, principal: Principal, now: float | None = None) -> bool:
        """Whether ``principal`` is still authorised (not revoked here, not expired)."""
        return self.authority.still_valid(principal, now)

    def check_valid(self, principal: Principal) -> None:
        """Raise :class:`~ficc_core.errors.Unauthenticated` unless :meth:`still_valid` holds."""
        self.authority.check_valid(principal)

    async def watch_revocations(
        self,
        period: float | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Learn revocations written by other processes (``ficc admin revoke-token``), forever."""
        await self.authority.watch_revocations(period, task_status=task_status)

    # -- browser sessions -----------------------------------------------------------------------

    async def login(
        self, username: str, password: str, project_ref: str, *, address: str = ""
    ) -> tuple[Principal, str, str]:
        """Check a password and open a session: the principal, its cookie and CSRF token."""
        return await self.sessions.login(username, password, project_ref, address=address)

    async def authenticate_session(self, cookie: str) -> Principal:
        """The principal of a session cookie, or :class:`~ficc_core.errors.Unauthenticated`."""
        return await self.sessions.authenticate(cookie)

    async def logout(self, session_id: str) -> None:
        """End a session and revoke what it minted."""
        await self.sessions.logout(session_id)

    # -- first run ------------------------------------------------------------------------------

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
            "admin", password, admin=True, projects={project.id: frozenset(PROJECT_SCOPES)}
        )
        credential, token = await self.create_credential(
            project.id, name="bootstrap", scopes=frozenset(ALL_SCOPES), user_id=user.id
        )
        return {
            "project": project.name,
            "username": "admin",
            "password": password,
            "token": token,
            "expires_at": credential.expires_at,
        }
