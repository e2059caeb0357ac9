"""Live authority: bearer authentication with a short in-memory cache, and revocations.

The request path re-checks a principal's authority while its response streams
(:meth:`Authority.still_valid`, per chunk, without the store). Revocations made in
this process apply at once; those written by another process sharing the database
(``ficc admin revoke-token``) are learnt by :meth:`Authority.watch_revocations`.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Callable
from functools import partial

import trio

from ..errors import Forbidden, Unauthenticated
from ..store import Store
from . import repository
from . import secrets as sec
from .principal import Principal, PrincipalKind
from .records import StoredCredential, UserStatus

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


class Authority:
    """Verified credentials, and the ids revoked (or logged out) since this process began.

    :param clock: wall-clock seconds (expiries, the cache's age, revocation times).
    :param cache_seconds: how long a verified credential is served from memory, and
        how often other processes' revocations are looked for.
    :param personal_disabled: refuse personal keys (``personal_disabled``).
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float],
        cache_seconds: float = CREDENTIAL_CACHE_SECONDS,
        personal_disabled: bool = False,
    ) -> None:
        self.store = store
        self.clock = clock
        self.cache_seconds = cache_seconds
        self.personal_disabled = personal_disabled
        # Credential and session IDs revoked (or logged out) in this process, so a
        # streaming response can re-check its authority per chunk without the store.
        self._revoked: set[str] = set()
        # Recently verified credentials: id -> (secret hash, principal, clock time).
        self._credentials: OrderedDict[str, tuple[str, Principal, float]] = OrderedDict()

    def mark_revoked(self, principal_id: str) -> None:
        """Refuse ``principal_id`` from now on, its cached verification included."""
        self._revoked.add(principal_id)
        self._credentials.pop(principal_id, None)

    def forget_personal(self) -> None:
        """Drop the cached personal keys, so what is shared with them is read again (a
        share changed in this process applies to their next request)."""
        for credential_id in [k for k, v in self._credentials.items() if v[1].personal]:
            del self._credentials[credential_id]

    async def watch_revocations(
        self,
        period: float | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Learn revocations written by other processes, forever.

        Every ``period`` seconds (default: the cache period) one query finds
        credentials revoked since the last look; they join the in-process
        revocations, so responses streaming for them end too, not only their next
        requests.
        """
        since = self.clock()
        task_status.started()
        while True:
            await trio.sleep(self.cache_seconds if period is None else period)
            revoked = await self.store.read(partial(repository.revoked_since, since=since))
            for credential_id, revoked_at in revoked:
                if credential_id not in self._revoked:
                    self.mark_revoked(credential_id)
                since = max(since, revoked_at)

    def still_valid(self, principal: Principal, now: float | None = None) -> bool:
        """Whether ``principal`` is still authorised, without touching the store.

        False once its credential was revoked (or its session logged out) in this
        process, or once it expired. Cheap enough to call for every chunk of a response.
        """
        if principal.id in self._revoked:
            return False
        expires_at = principal.expires_at
        return expires_at is None or expires_at > (self.clock() if now is None else now)

    def check_valid(self, principal: Principal) -> None:
        """Raise :class:`Unauthenticated` unless :meth:`still_valid` holds."""
        if principal.id in self._revoked:
            raise Unauthenticated("the credential has been revoked", code="credential_revoked")
        if principal.expires_at is not None and principal.expires_at <= self.clock():
            raise Unauthenticated("the credential has expired", code="credential_expired")

    async def authenticate_bearer(self, token: str) -> Principal:
        """Return the principal of a bearer token, or raise :class:`Unauthenticated`.

        A credential verified in the last ``cache_seconds`` is checked in memory (its
        secret's hash, revocation here, expiry): the request path does not read the
        store for every request. Revocations through this controller take effect at
        once; those written by another process within the cache period.
        """
        parts = sec.split_token(token)
        if parts is None:
            raise Unauthenticated(
                "the bearer token is not a FICC credential", code="invalid_credential"
            )
        credential_id, secret = parts
        presented = sec.hash_secret(secret)
        now = self.clock()
        cached = self._credentials.get(credential_id)
        # A clock set back must not stretch the cache period: a negative age is stale too.
        if cached is not None and 0 <= now - cached[2] < self.cache_seconds:
            secret_hash, principal, _ = cached
            if hmac.compare_digest(presented, secret_hash):
                self._credentials.move_to_end(credential_id)
                self.check_valid(principal)
                return principal

        stored = await self.store.read(
            partial(repository.stored_credential, credential_id=credential_id)
        )
        if stored is None or not hmac.compare_digest(presented, stored.secret_hash):
            raise Unauthenticated("the bearer credential is not valid", code="invalid_credential")
        credential = stored.credential
        if credential.revoked_at is not None:
            raise Unauthenticated(
                "the bearer credential has been revoked", code="credential_revoked"
            )
        if credential.expires_at is not None and credential.expires_at <= self.clock():
            raise Unauthenticated("the bearer credential has expired", code="credential_expired")
        self._check_person(stored)
        principal = Principal(
            kind=PrincipalKind.CREDENTIAL,
            id=credential.id,
            project_id=credential.project_id,
            project_name=stored.project_name,
            scopes=frozenset(credential.scopes),
            user_id=credential.user_id,
            username=stored.username,
            is_admin=stored.is_admin,
            expires_at=credential.expires_at,
            service_id=credential.service_id,
            band=credential.band,
            project_band=stored.project_band,
            personal=stored.personal,
            shared=stored.shared,
        )
        self._credentials[credential_id] = (stored.secret_hash, principal, now)
        self._credentials.move_to_end(credential_id)
        while len(self._credentials) > CREDENTIAL_CACHE_SIZE:
            self._credentials.popitem(last=False)
        return principal

    def _check_person(self, stored: StoredCredential) -> None:
        """Refuse a pending user's key, and a personal key while ``personal_disabled``."""
        if stored.user_status == UserStatus.PENDING:
            raise Forbidden(
                "this account is pending an administrator's approval",
                code="account_pending",
            )
        if stored.personal and self.personal_disabled:
            raise Forbidden(
                "personal keys are disabled on this installation (personal_disabled)",
                code="personal_disabled",
            )
