"""Live authority: bearer authentication with short in-memory caches, and revocations.

The request path re-checks a principal's authority while its response streams
(:meth:`Authority.still_valid`, per chunk, without the store). Revocations made in
this process apply at once; those written by another process sharing the database
(``ficc admin revoke-token``) are learnt by :meth:`Authority.watch_revocations`.

Two caches keep the store off the request path (docs/usage.md, "Credential checks"):
verified credentials for ``auth_cache_ttl``, and rejected tokens (keyed by the whole
token, so a wrong secret never blocks the right one) for ``auth_negative_ttl``. A
store read that fails or takes more than :data:`STORE_WAIT_SECONDS` is a 503
``store_unavailable`` with ``Retry-After``, never a 401; a credential verified before
is then served from its (stale) cache entry, at once while the store keeps failing
(docs/operations.md, "When the database is down"); so is a browser session verified
before.
"""

from __future__ import annotations

import hmac
import logging
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any, NoReturn, TypeVar

import attrs
import trio

from ..base.errors import Forbidden, StoreUnavailable, Unauthenticated
from ..store import Store, Transaction
from . import repository
from . import secrets as sec
from .principal import Principal, PrincipalKind
from .records import StoredCredential, UserStatus

#: Seconds a verified bearer credential is served from memory (see ``authenticate_bearer``).
CREDENTIAL_CACHE_SECONDS = 5.0
#: Credentials kept in that cache, least recently used dropped first.
CREDENTIAL_CACHE_SIZE = 10_000
#: Seconds a rejected token is remembered as rejected (the default of ``auth_negative_ttl``).
REJECTED_CACHE_SECONDS = 30.0
#: Rejected tokens remembered, least recently used dropped first.
REJECTED_CACHE_SIZE = 10_000
#: Seconds a credential check waits for the store before answering 503 ``store_unavailable``.
STORE_WAIT_SECONDS = 3.0

log = logging.getLogger("ficc.auth")
T = TypeVar("T")


@attrs.define
class _Read:
    """One store read, shared by every check waiting for it."""

    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: Exception | None = None


def revocation_statement() -> str:
    """What a revocation written by another process does; docs/api.md and docs/gateway.md
    both carry this sentence (a test compares them with it)."""
    seconds = f"{CREDENTIAL_CACHE_SECONDS:g}"
    return (
        "A credential revoked by another process sharing the database (`ficc admin "
        f"revoke-token`) stops working within {seconds} s (`auth_cache_ttl`, by default): its "
        f"new requests are refused and the responses it has streaming end (the controller "
        f"looks for new revocations every {seconds} s)."
    )


class Authority:
    """Verified credentials, and the ids revoked (or logged out) since this process began.

    :param clock: wall-clock seconds (expiries, the caches' age, revocation times).
    :param cache_seconds: how long a verified credential is served from memory, and
        how often other processes' revocations are looked for.
    :param rejected_seconds: how long a rejected token is refused from memory (0: never).
    :param store_wait: seconds a check waits for the store before it answers 503.
    :param personal_disabled: refuse personal keys (``personal_disabled``).
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float],
        cache_seconds: float = CREDENTIAL_CACHE_SECONDS,
        rejected_seconds: float = REJECTED_CACHE_SECONDS,
        store_wait: float = STORE_WAIT_SECONDS,
        personal_disabled: bool = False,
    ) -> None:
        self.store = store
        self.clock = clock
        self.cache_seconds = cache_seconds
        self.rejected_seconds = rejected_seconds
        self.store_wait = store_wait
        # Rejected tokens: (credential id, secret hash) -> (code, message, clock time).
        self._rejected: OrderedDict[tuple[str, str], tuple[str, str, float]] = OrderedDict()
        # Store reads in progress, by credential id (concurrent checks share one).
        self._reads: dict[str, _Read] = {}
        # Store reads failed in a row (logged at the first and every 100th).
        self._failures = 0
        self.personal_disabled = personal_disabled
        # Credential and session IDs revoked (or logged out) in this process, so a
        # streaming response can re-check its authority per chunk without the store.
        self._revoked: set[str] = set()
        # Recently verified credentials: id -> (secret hash, principal, clock time).
        self._credentials: OrderedDict[str, tuple[str, Principal, float]] = OrderedDict()
        # Browser sessions verified before: id -> (secret hash, principal), served only
        # while the store fails (a session is otherwise read on every request).
        self._sessions: OrderedDict[str, tuple[str, Principal]] = OrderedDict()

    def mark_revoked(self, principal_id: str) -> None:
        """Refuse ``principal_id`` from now on, its cached verification included."""
        self._revoked.add(principal_id)
        self._credentials.pop(principal_id, None)
        self._sessions.pop(principal_id, None)

    def remember_session(self, secret_hash: str, principal: Principal) -> None:
        """Keep a verified session's principal for :meth:`remembered_session`."""
        self._sessions[principal.id] = (secret_hash, principal)
        self._sessions.move_to_end(principal.id)
        while len(self._sessions) > CREDENTIAL_CACHE_SIZE:
            self._sessions.popitem(last=False)

    def remembered_session(self, session_id: str, secret_hash: str) -> Principal | None:
        """The principal of a session verified before with this secret (its hash), while
        it is neither ended here nor expired: what a browser is served while the store
        fails. None otherwise."""
        remembered = self._sessions.get(session_id)
        if remembered is None or not hmac.compare_digest(remembered[0], secret_hash):
            return None
        principal = remembered[1]
        return principal if self.still_valid(principal) else None

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
            try:
                revoked = await self.store.read(partial(repository.revoked_since, since=since))
            except Exception as exc:  # a store outage must not end the controller
                self._failed("revocations", exc)
                continue
            self._failures = 0
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
        once; those written by another process within the cache period. A token
        rejected in the last ``rejected_seconds`` is refused from memory too. When the
        store fails or is slow, raise :class:`StoreUnavailable` (503), or serve a
        credential verified before from memory.
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
        if cached is not None and not hmac.compare_digest(presented, cached[0]):
            cached = None  # a wrong secret never uses the right one's verification
        # A clock set back must not stretch the cache period: a negative age is stale too.
        if cached is not None and 0 <= now - cached[2] < self.cache_seconds:
            self._credentials.move_to_end(credential_id)
            self.check_valid(cached[1])
            return cached[1]
        key = (credential_id, presented)
        rejected = self._rejected.get(key)
        if rejected is not None and 0 <= now - rejected[2] < self.rejected_seconds:
            raise Unauthenticated(rejected[1], code=rejected[0])
        if cached is not None and self._failures:
            # The store is failing: a credential verified before is served at once (its
            # read goes on in the background, and tells when the store answers again),
            # so an outage costs known credentials no wait at all.
            self.check_valid(cached[1])
            self._start_read(
                f"credential {credential_id}",
                partial(repository.stored_credential, credential_id=credential_id),
            )
            return cached[1]

        try:
            stored: StoredCredential | None = await self.read_bounded(
                f"credential {credential_id}",
                partial(repository.stored_credential, credential_id=credential_id),
            )
        except StoreUnavailable:
            if cached is None:
                raise
            # Verified before: served while the store is down, and not asked again for
            # another cache period (a hanging store costs one wait per key and period).
            self.check_valid(cached[1])
            self._credentials[credential_id] = (cached[0], cached[1], now)
            return cached[1]
        if stored is None or not hmac.compare_digest(presented, stored.secret_hash):
            self._reject(key, "invalid_credential", "the bearer credential is not valid", now)
        credential = stored.credential
        if credential.revoked_at is not None:
            self.mark_revoked(credential_id)  # no stale entry serves it again
            self._reject(key, "credential_revoked", "the bearer credential has been revoked", now)
        if credential.expires_at is not None and credential.expires_at <= self.clock():
            self._credentials.pop(credential_id, None)
            self._reject(key, "credential_expired", "the bearer credential has expired", now)
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
            name=credential.name,
            issuer_id=credential.issuer_id,
        )
        self._credentials[credential_id] = (stored.secret_hash, principal, now)
        self._credentials.move_to_end(credential_id)
        while len(self._credentials) > CREDENTIAL_CACHE_SIZE:
            self._credentials.popitem(last=False)
        return principal

    def _reject(self, key: tuple[str, str], code: str, message: str, now: float) -> NoReturn:
        """Remember the token ``key`` as rejected with ``code``, and raise the refusal."""
        if self.rejected_seconds > 0:
            self._rejected[key] = (code, message, now)
            self._rejected.move_to_end(key)
            while len(self._rejected) > REJECTED_CACHE_SIZE:
                self._rejected.popitem(last=False)
        raise Unauthenticated(message, code=code)

    async def read_bounded(self, what: str, fn: Callable[[Transaction], T]) -> T:
        """``store.read(fn)`` by a task of its own, shared by concurrent callers asking for
        the same ``what`` (e.g. ``credential <id>``), so that a caller waits at most
        ``store_wait`` seconds; raise :class:`StoreUnavailable` when the read failed or
        did not answer in time (the request path's reads: credentials, sessions)."""
        read = self._start_read(what, fn)
        with trio.move_on_after(self.store_wait):
            await read.done.wait()
        if not read.done.is_set():
            # A store that does not answer is failing too: known credentials are served
            # at once from now on, until a read goes through.
            self._failed(what, TimeoutError(f"no answer within {self.store_wait:g} s"))
            raise StoreUnavailable(
                f"the store did not answer within {self.store_wait:g} s; retry shortly",
                details={"waited": self.store_wait},
            )
        if read.error is not None:
            raise StoreUnavailable(f"the store failed ({type(read.error).__name__}); retry shortly")
        return read.result

    def _start_read(self, what: str, fn: Callable[[Transaction], Any]) -> _Read:
        """The read of ``what`` in progress, started now if there is none."""
        read = self._reads.get(what)
        if read is None:
            read = self._reads[what] = _Read()
            trio.lowlevel.spawn_system_task(self._read, what, fn, read)
        return read

    @property
    def store_failing(self) -> bool:
        """Whether the last store read of credentials, sessions or revocations failed."""
        return self._failures > 0

    async def _read(self, what: str, fn: Callable[[Transaction], Any], read: _Read) -> None:
        try:
            read.result = await self.store.read(fn)
        except Exception as exc:
            self._failed(what, exc)
            read.error = exc
        else:
            self._failures = 0
        finally:
            self._reads.pop(what, None)
            read.done.set()

    def _failed(self, what: str, exc: Exception) -> None:
        self._failures += 1
        if self._failures == 1 or self._failures % 100 == 0:
            log.warning(
                "cannot read %s (%s store failures in a row): %s", what, self._failures, exc
            )

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
