"""Browser sessions: a password login opens one in one project; logout ends it.

A session belongs to a user and to the one project chosen at login; its scopes are
the user's scopes in that project (every scope for an administrator). A login naming
no project opens a *personal* session: in the reserved personal project, with no scope
at all (an administrator's included), for what a person does on their own
(``/api/v1/me/tokens``). A pending account cannot log in (``account_pending``, said
only to whoever gave its right password).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import trio

from ..base.errors import Forbidden, StoreUnavailable, Unauthenticated
from ..store import Store, Transaction
from . import repository
from . import secrets as sec
from .authority import Authority
from .principal import Principal, PrincipalKind
from .records import PERSONAL_PROJECT, NewSession, UserStatus
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
        personal_disabled: bool = False,
    ) -> None:
        self.store = store
        self.authority = authority
        self.session_lifetime = session_lifetime
        self.login_throttle = login_throttle
        self._password_limiter = password_limiter
        self.clock = clock
        self.personal_disabled = personal_disabled

    async def login(
        self, username: str, password: str, project_ref: str | None, *, address: str = ""
    ) -> tuple[Principal, str, str]:
        """Check a password and open a session in one project (None: a personal session).

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
        if user.status == UserStatus.PENDING:
            raise Forbidden(
                f"the account {username!r} is pending an administrator's approval",
                code="account_pending",
            )
        if project_ref is None and self.personal_disabled:
            raise Forbidden(
                "personal use is disabled on this installation (personal_disabled): "
                "log in to a project",
                code="personal_disabled",
            )
        session_id, secret, csrf = sec.new_id(), sec.new_secret(), sec.new_secret()
        now = self.clock()

        def write(tx: Transaction) -> None:
            if project_ref is None:
                repository.ensure_personal_project(tx)
                project_id = PERSONAL_PROJECT
            else:
                project_id = self._member_project(tx, user.id, user.is_admin, username, project_ref)
            repository.delete_expired_sessions(tx, now)
            repository.insert_session(
                tx,
                NewSession(
                    id=session_id,
                    secret_hash=sec.hash_secret(secret),
                    csrf_hash=sec.hash_secret(csrf),
                    user_id=user.id,
                    project_id=project_id,
                    created_at=now,
                    expires_at=now + self.session_lifetime,
                ),
            )

        await self.store.write(write)
        cookie = sec.make_token(session_id, secret, SESSION_PREFIX)
        return await self.authenticate(cookie), cookie, csrf

    @staticmethod
    def _member_project(
        tx: Transaction, user_id: str, is_admin: bool, username: str, project_ref: str
    ) -> str:
        """The id of the project a login names, if the user may work there."""
        project = repository.require_project(tx, project_ref)
        if not is_admin and not repository.is_member(tx, user_id, project.id):
            raise Forbidden(
                f"user {username!r} is not a member of project {project.name!r}",
                code="not_a_member",
                details={"project": project.name},
            )
        return project.id

    async def authenticate(self, cookie: str) -> Principal:
        """Return the principal of a session cookie, or raise :class:`Unauthenticated`
        (:class:`~ficc_core.base.errors.StoreUnavailable` when the store fails or is slow)."""
        parts = sec.split_token(cookie, SESSION_PREFIX)
        if parts is None:
            raise Unauthenticated("the session cookie is not valid", code="invalid_session")
        session_id, secret = parts
        # Bounded: a store that fails or hangs is 503 store_unavailable, never a 401; a
        # session verified before is served from memory meanwhile.
        try:
            session = await self.authority.read_bounded(
                f"session {session_id}", partial(repository.stored_session, session_id=session_id)
            )
        except StoreUnavailable:
            remembered = self.authority.remembered_session(session_id, sec.hash_secret(secret))
            if remembered is None:
                raise
            return remembered
        if session is None:
            self.authority.mark_revoked(session_id)  # ended (elsewhere): never served again
        if session is None or not sec.secret_matches(secret, session.secret_hash):
            raise Unauthenticated("the session is not valid; log in again", code="invalid_session")
        if session.expires_at <= self.clock():
            raise Unauthenticated("the session has expired; log in again", code="session_expired")
        if session.project_id == PERSONAL_PROJECT:
            scopes: frozenset[str] = frozenset()  # a personal session: no project's scopes
        else:
            scopes = frozenset(ALL_SCOPES if session.is_admin else session.scopes)
        principal = Principal(
            kind=PrincipalKind.SESSION,
            id=session.id,
            project_id=session.project_id,
            project_name=session.project_name,
            scopes=scopes,
            user_id=session.user_id,
            username=session.username,
            is_admin=session.is_admin,
            expires_at=session.expires_at,
            csrf_hash=session.csrf_hash,
            project_band=session.project_band,
        )
        self.authority.remember_session(session.secret_hash, principal)
        return principal

    async def logout(self, session_id: str) -> None:
        """End a session and revoke what it minted (responses streaming under them end too)."""
        await self.end(lambda _tx: [session_id])

    async def end(self, sessions: Callable[[Transaction], list[str]]) -> list[str]:
        """End the sessions ``sessions(tx)`` names, in one transaction, as a logout does
        each (what they minted is revoked); return their ids."""
        now = self.clock()

        def write(tx: Transaction) -> tuple[list[str], list[str]]:
            ended, minted = sessions(tx), []
            for session_id in ended:
                repository.delete_session(tx, session_id)
                minted += repository.minted_by(tx, session_id)
            repository.revoke(tx, minted, now)
            return ended, minted

        ended, minted = await self.store.write(write)
        for revoked in (*ended, *minted):
            self.authority.mark_revoked(revoked)
        return ended
