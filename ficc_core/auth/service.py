"""Authentication as one service: the directory, credentials, sessions and live authority.

A bearer credential belongs to exactly one project and carries its own scopes
(:mod:`.credentials`); a browser session belongs to a user and to the one project
chosen at login (:mod:`.sessions`); projects and users are the :mod:`.directory`;
signup, approval, password resets, personal keys and shares are :mod:`.people`;
:mod:`.authority` verifies bearer tokens and knows what was revoked. Every SQL
statement is in :mod:`.repository`; the records it returns are in :mod:`.records`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import trio

from ..base.errors import NotFound
from ..routing.bands import BandTable
from ..store import Store
from . import secrets as sec
from .authority import CREDENTIAL_CACHE_SECONDS, REJECTED_CACHE_SECONDS, Authority
from .credentials import Credentials
from .directory import Directory
from .people import People
from .scopes import ALL_SCOPES, PROJECT_SCOPES
from .sessions import Sessions
from .throttle import LoginThrottle


class AuthService:
    """Authentication and the records behind it, all through the :class:`Store`.

    :param clock: wall-clock seconds: creation times, expiries and revocations
        (injected in tests, which move it instead of sleeping).
    :param credential_cache_seconds: how long a verified bearer credential is
        served from memory, and how often other processes' revocations are read.
    :param rejected_cache_seconds: how long a rejected bearer token is refused from memory.
    :param bands: the configured priority bands (a credential's or project's band is
        one of them; default: the default bands).
    :param signup_open: serve signup (``signup_open``); ``signup_throttle`` bounds it.
    :param personal_disabled: refuse personal keys and sessions (``personal_disabled``).
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
        rejected_cache_seconds: float = REJECTED_CACHE_SECONDS,
        bands: BandTable | None = None,
        signup_open: bool = False,
        signup_throttle: LoginThrottle | None = None,
        personal_disabled: bool = False,
    ) -> None:
        self.store = store
        self.clock = clock
        # Each argon2 hash holds 64 MiB for a moment: at most two at once.
        limiter = trio.CapacityLimiter(2)
        self.bands = BandTable() if bands is None else bands
        self.authority = Authority(
            store,
            clock=clock,
            cache_seconds=credential_cache_seconds,
            rejected_seconds=rejected_cache_seconds,
            personal_disabled=personal_disabled,
        )
        self.directory = Directory(store, password_limiter=limiter, clock=clock, bands=self.bands)
        self.credentials = Credentials(
            store,
            self.authority,
            token_max_lifetime=token_max_lifetime,
            clock=clock,
            bands=self.bands,
        )
        self.sessions = Sessions(
            store,
            self.authority,
            session_lifetime=session_lifetime,
            login_throttle=login_throttle or LoginThrottle(),
            password_limiter=limiter,
            clock=clock,
            personal_disabled=personal_disabled,
        )
        self.people = People(
            store,
            directory=self.directory,
            credentials=self.credentials,
            sessions=self.sessions,
            authority=self.authority,
            password_limiter=limiter,
            clock=clock,
            signup_throttle=signup_throttle or LoginThrottle(),
            signup_open=signup_open,
            personal_disabled=personal_disabled,
        )
        # The surface callers use, each name bound to the concern that implements it.
        self.create_project = self.directory.create_project
        self.list_projects = self.directory.list_projects
        self.get_project = self.directory.get_project
        self.set_project_band = self.directory.set_project_band
        self.create_user = self.directory.create_user
        self.list_users = self.directory.list_users
        self.set_membership = self.directory.set_membership
        self.has_users = self.directory.has_users
        self.create_credential = self.credentials.create
        self.list_credentials = self.credentials.list
        self.get_credential = self.credentials.get
        self.revoke_credential = self.credentials.revoke
        self.authenticate_bearer = self.authority.authenticate_bearer
        self.still_valid = self.authority.still_valid
        self.check_valid = self.authority.check_valid
        self.watch_revocations = self.authority.watch_revocations
        self.login = self.sessions.login
        self.authenticate_session = self.sessions.authenticate
        self.logout = self.sessions.logout

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
            project.id,
            name="bootstrap",
            scopes=frozenset(ALL_SCOPES),
            user_id=user.id,
            generated_name=True,
        )
        return {
            "project": project.name,
            "username": "admin",
            "password": password,
            "token": token,
            "expires_at": credential.expires_at,
        }
