"""People on their own: signup and approval, password resets, personal keys, shares.

Accounts are made by administrators, or, with ``signup_open``, by signup: a signed-up
account is *pending* (it cannot log in, its keys do not work) until an administrator
approves it. An administrator's password reset ends the user's browser sessions.

A person (a browser session, or a credential of theirs that is not a personal key)
mints *personal keys*: outside any project (the reserved personal project), holding
``inference:invoke`` only, minted by :meth:`Credentials.create` like every credential.
They invoke the services shared with their person or with everyone; what is shared
is read when the key is authenticated and cached with it (docs/people.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import trio

from ..base.errors import FiccError, Forbidden, InvalidRequest, NotFound
from ..store import Store, Transaction
from . import repository
from . import secrets as sec
from .authority import Authority
from .credentials import Credentials
from .directory import Directory, check_password
from .principal import Principal
from .records import PERSONAL_PROJECT, Credential, Revocation, Shares, User, UserStatus
from .scopes import INFERENCE_INVOKE
from .sessions import Sessions
from .throttle import LoginThrottle, LoginThrottled


class SignupClosed(FiccError):
    """Signup is not served here (``signup_open`` is off): the route does not exist."""

    status = 404
    code = "signup_closed"


class SignupThrottled(FiccError):
    """Too many signups from this address or for this name: wait ``Retry-After`` seconds."""

    status = 429
    code = "signup_throttled"


def _require_user(tx: Transaction, ref: str) -> User:
    user = repository.find_user_ref(tx, ref)
    if user is None:
        raise NotFound(f"no user {ref!r}", code="user_not_found", details={"user": ref})
    return user


class People:
    """Signups, approvals, password resets, personal keys and shares, through the store.

    :param signup_throttle: bounds signups like logins: every signup counts as a
        failure, so one address (or one name) gets a few and then waits.
    """

    def __init__(
        self,
        store: Store,
        *,
        directory: Directory,
        credentials: Credentials,
        sessions: Sessions,
        authority: Authority,
        password_limiter: trio.CapacityLimiter,
        clock: Callable[[], float],
        signup_throttle: LoginThrottle,
        signup_open: bool = False,
        personal_disabled: bool = False,
    ) -> None:
        self.store = store
        self.directory = directory
        self.credentials = credentials
        self.sessions = sessions
        self.authority = authority
        self._password_limiter = password_limiter
        self.clock = clock
        self.signup_throttle = signup_throttle
        self.signup_open = signup_open
        self.personal_disabled = personal_disabled

    # -- accounts ---------------------------------------------------------------------------

    async def signup(self, username: str, password: str, *, address: str = "") -> User:
        """Create a pending account (``signup_open`` only; a taken name is 409)."""
        self.require_signup_open()
        try:
            with self.signup_throttle.attempt(username, address) as record:
                record(False)  # made or refused, every signup counts
                return await self.directory.create_user(
                    username, password, status=UserStatus.PENDING
                )
        except LoginThrottled as exc:
            raise SignupThrottled(
                exc.message.replace("failed logins", "signups"),
                details=exc.details,
                headers=exc.headers,
            ) from None

    def require_signup_open(self) -> None:
        """Raise :class:`SignupClosed` unless signup is served."""
        if not self.signup_open:
            raise SignupClosed(
                "signup is closed on this installation: an administrator creates accounts"
            )

    async def approve(self, ref: str) -> User:
        """Activate the user whose id or username is ``ref`` (an active one stays so)."""

        def write(tx: Transaction) -> User:
            user = _require_user(tx, ref)
            repository.set_user_status(tx, user.id, UserStatus.ACTIVE)
            return _require_user(tx, user.id)

        return await self.store.write(write)

    async def get_user(self, ref: str) -> User:
        """The user whose id or username is ``ref``."""
        return await self.store.read(partial(_require_user, ref=ref))

    async def reset_password(self, ref: str, password: str) -> tuple[User, int]:
        """Set the user's password and end their browser sessions (as logouts: what they
        minted is revoked too); return the user and how many sessions ended."""
        check_password(password)
        user = await self.get_user(ref)
        password_hash = await sec.hash_password(password, self._password_limiter)

        def change(tx: Transaction) -> list[str]:
            _require_user(tx, user.id)
            repository.set_password_hash(tx, user.id, password_hash)
            return repository.user_session_ids(tx, user.id)

        ended = await self.sessions.end(change)
        return user, len(ended)

    # -- personal keys ------------------------------------------------------------------------

    @staticmethod
    def person(principal: Principal) -> str:
        """The user id of a principal acting as a person, or the refusal."""
        if principal.personal:
            raise Forbidden(
                "a personal key only invokes services: manage personal keys from a browser "
                "session or another credential of yours",
                code="personal_key_refused",
            )
        if principal.user_id is None:
            raise Forbidden(
                "this credential belongs to no person: log in, or use a credential of yours",
                code="no_person",
            )
        return principal.user_id

    async def create_key(
        self, principal: Principal, *, name: str, lifetime: float | None = None
    ) -> tuple[Credential, str]:
        """Mint a personal key for ``principal``'s person (capped as every credential)."""
        user_id = self.person(principal)
        if self.personal_disabled:
            raise Forbidden(
                "personal keys are disabled on this installation (personal_disabled)",
                code="personal_disabled",
            )
        return await self.credentials.create(
            PERSONAL_PROJECT,
            name=name,
            scopes=frozenset({INFERENCE_INVOKE}),
            user_id=user_id,
            lifetime=lifetime,
            issuer=principal,
            personal=True,
        )

    async def list_keys(self, principal: Principal) -> list[Credential]:
        """The personal keys of ``principal``'s person."""
        return await self.credentials.list_personal(self.person(principal))

    async def revoke_key(self, principal: Principal, credential_id: str) -> Revocation:
        """Revoke one of the personal keys of ``principal``'s person (else 404)."""
        return await self.credentials.revoke(
            PERSONAL_PROJECT, credential_id, user_id=self.person(principal)
        )

    # -- shares ----------------------------------------------------------------------------------

    async def set_shares(
        self,
        service_id: str,
        users: Iterable[str],
        everyone: bool,
        *,
        check_service: Callable[[Transaction], object],
    ) -> Shares:
        """Share the service with exactly ``users`` (ids or usernames) and, with
        ``everyone``, every person; an unknown user is refused by name.

        ``check_service(tx)`` refuses a service the caller may not share (inference owns
        its table: the caller passes its check), in the same transaction.
        """
        refs = list(dict.fromkeys(users))

        def write(tx: Transaction) -> Shares:
            check_service(tx)
            found = {ref: repository.find_user_ref(tx, ref) for ref in refs}
            unknown = [ref for ref, user in found.items() if user is None]
            if unknown:
                raise InvalidRequest(
                    f"no such user: {', '.join(unknown)}",
                    code="unknown_user",
                    details={
                        "unknown": unknown,
                        "errors": [{"path": "$.users", "message": "unknown user"}],
                    },
                )
            ids = [user.id for user in found.values() if user is not None]
            repository.set_shares(tx, service_id, ids, everyone, self.clock())
            return repository.shares_of(tx, service_id)

        shares = await self.store.write(write)
        # This process's cached personal keys read what is shared with them again.
        self.authority.forget_personal()
        return shares

    async def shares(
        self, service_id: str, *, check_service: Callable[[Transaction], object]
    ) -> Shares:
        """Who the service is shared with (``check_service`` as for :meth:`set_shares`)."""

        def read(tx: Transaction) -> Shares:
            check_service(tx)
            return repository.shares_of(tx, service_id)

        return await self.store.read(read)
