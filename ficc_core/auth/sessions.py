"""Browser sessions: a password login opens one in one project; logout ends it.

A session belongs to a user and to the one project chosen at login; its scopes are
the user's scopes in that project (every scope for an administrator).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import trio

from ..errors import Forbidden, Unauthenticated
from ..store import Store, Transaction
from . import repository
from . import secrets as sec
from .authority import Authority
from .principal import Principal, PrincipalKind
from .records import NewSession
from .scopes import ALL_SCOPES
from .throttle import LoginThrottle

SESSION_PREFIX = "fs_"


class Sessions:
    """Logins, session cookies and logouts, through the :class:`Store`."""

    def __init__(
        self,
        store: Store,
        authority: Authority,
        *,
        session_lifetime: float,
        login_throttle: LoginThrottle,
        password_limiter: trio.CapacityLimiter,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.authority = authority
        self.session_lifetime = session_lifetime
        self.login_throttle = login_throttle
        self._password_limiter = password_limiter
        self.clock = clock

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
            user = await self.store.read(partial(repository.user_login, username=username))
            stored = None if user is None else user.password_hash
            verified = await sec.verify_password(password, stored, self._password_limiter)
            record(verified)
        if not verified or user is None:
            raise Unauthenticated("the username or password is wrong", code="invalid_login")
        session_id, secret, csrf = sec.new_id(), sec.new_secret(), sec.new_secret()
        now = self.clock()

        def write(tx: Transaction) -> None:
            project = repository.require_project(tx, project_ref)
            if not user.is_admin and not repository.is_member(tx, user.id, project.id):
                raise Forbidden(
                    f"user {username!r} is not a member of project {project.name!r}",
                    code="not_a_member",
                    details={"project": project.name},
                )
            repository.delete_expired_sessions(tx, now)
            repository.insert_session(
                tx,
                NewSession(
                    id=session_id,
                    secret_hash=sec.hash_secret(secret),
                    csrf_hash=sec.hash_secret(csrf),
                    user_id=user.id,
                    project_id=project.id,
                    created_at=now,
                    expires_at=now + self.session_lifetime,
                ),
            )

        await self.store.write(write)
        cookie = sec.make_token(session_id, secret, SESSION_PREFIX)
        return await self.authenticate(cookie), cookie, csrf

    async def authenticate(self, cookie: str) -> Principal:
        """Return the principal of a session cookie, or raise :class:`Unauthenticated`
        (:class:`~ficc_core.errors.StoreUnavailable` when the store fails or is slow)."""
        parts = sec.split_token(cookie, SESSION_PREFIX)
        if parts is None:
            raise Unauthenticated("the session cookie is not valid", code="invalid_session")
        session_id, secret = parts
        # Bounded: a store that fails or hangs is 503 store_unavailable, never a 401.
        session = await self.authority.read_bounded(
            f"session {session_id}", partial(repository.stored_session, session_id=session_id)
        )
        if session is None or not sec.secret_matches(secret, session.secret_hash):
            raise Unauthenticated("the session is not valid; log in again", code="invalid_session")
        if session.expires_at <= self.clock():
            raise Unauthenticated("the session has expired; log in again", code="session_expired")
        return Principal(
            kind=PrincipalKind.SESSION,
            id=session.id,
            project_id=session.project_id,
            project_name=session.project_name,
            scopes=frozenset(ALL_SCOPES if session.is_admin else session.scopes),
            user_id=session.user_id,
            username=session.username,
            is_admin=session.is_admin,
            expires_at=session.expires_at,
            csrf_hash=session.csrf_hash,
            project_band=session.project_band,
        )

    async def logout(self, session_id: str) -> None:
        """End a session and revoke what it minted (responses streaming under them end too)."""
        now = self.clock()

        def write(tx: Transaction) -> list[str]:
            repository.delete_session(tx, session_id)
            minted = repository.minted_by(tx, session_id)
            repository.revoke(tx, minted, now)
            return minted

        for revoked in (session_id, *await self.store.write(write)):
            self.authority.mark_revoked(revoked)
