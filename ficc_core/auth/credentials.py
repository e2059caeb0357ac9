"""Bearer credentials: minting (the one place that bounds a lifetime), listing, revoking.

Every credential is minted by :meth:`Credentials.create`, which bounds its lifetime
(never past ``token_max_lifetime``, never past its issuer's expiry) and records its
issuer, so revoking an issuer revokes what it minted.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable

from ..base.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated
from ..routing.bands import BandTable
from ..store import Store, Transaction
from . import repository
from . import secrets as sec
from .authority import Authority
from .principal import Principal, PrincipalKind
from .records import PERSONAL_PROJECT, CapReason, Credential, LifetimeCap, Revocation
from .scopes import ADMIN, INFERENCE_INVOKE, check_scopes

#: The longest credential name (as ``name_validator`` admits).
NAME_MAX = 64


def _not_found(credential_id: str) -> NotFound:
    return NotFound(
        f"no credential {credential_id!r} in this project (give its ID or its name)",
        code="credential_not_found",
        details={"id": credential_id},
    )


def _live(credential: Credential, now: float) -> bool:
    return credential.revoked_at is None and (
        credential.expires_at is None or credential.expires_at > now
    )


def resolve(
    tx: Transaction,
    ref: str,
    now: float,
    *,
    project_id: str | None,
    user_id: str | None = None,
    visible: Callable[[Credential], bool] = lambda _c: True,
) -> Credential | None:
    """The credential ``ref`` names: its ID, else its name (of ``project_id`` and
    ``user_id`` when given; only those ``visible``). A name is unique among the live
    credentials of a project, so it names the live one; else the newest that had it.
    Across projects (``project_id`` None) a name live in several is
    ``ambiguous_credential_name``, listing them."""

    def fits(credential: Credential) -> bool:
        return (
            (project_id is None or credential.project_id == project_id)
            and (user_id is None or credential.user_id == user_id)
            and visible(credential)
        )

    found = repository.find_credential(tx, ref)
    if found is not None and fits(found):
        return found
    named = [c for c in repository.credentials_named(tx, ref, project_id, user_id) if fits(c)]
    pool = [c for c in named if _live(c, now)] or named
    if len({c.project_id for c in pool}) > 1:
        raise Conflict(
            f"{len(pool)} credentials of different projects are called {ref!r}: "
            f"{', '.join(f'{c.id} (project {c.project_id})' for c in pool)}; give the ID",
            code="ambiguous_credential_name",
            details={
                "name": ref,
                "candidates": [{"id": c.id, "project_id": c.project_id} for c in pool],
            },
        )
    return pool[0] if pool else None


def _stands_for_a_person(issuer: Principal | None) -> bool:
    """Whether ``issuer`` may make a lasting key: a browser session, or a project key of
    a person that no credential or session minted (a lasting key, the first run's)."""
    if issuer is None:
        return False
    if issuer.kind == PrincipalKind.SESSION:
        return True
    return (
        issuer.user_id is not None
        and issuer.issuer_id is None
        and issuer.service_id is None
        and not issuer.personal
    )


def _free_name(tx: Transaction, project_id: str, name: str, user_id: str | None, now: float) -> str:
    """``name``, or the first of ``name-2``, ``name-3``... no live credential has."""
    candidate, number = name, 1
    while repository.name_holder(tx, project_id, candidate, user_id, now) is not None:
        number += 1
        suffix = f"-{number}"
        candidate = name[: NAME_MAX - len(suffix)] + suffix
    return candidate


def credential_expiry(
    lifetime: float | None, issuer: Principal | None, now: float, max_lifetime: float
) -> tuple[float, LifetimeCap | None]:
    """The expiry of a credential asked to live ``lifetime`` seconds, and the cap if any.

    An absent ``lifetime`` asks for the longest allowed: ``max_lifetime``, or the
    issuer's remaining lifetime if shorter.
    """
    if lifetime is not None and not (math.isfinite(lifetime) and lifetime > 0):
        raise InvalidRequest(
            "a credential lifetime must be a positive, finite number of seconds",
            details={"errors": [{"path": "$.lifetime", "message": "must be positive"}]},
        )
    expires_at, by = now + max_lifetime, CapReason.TOKEN_MAX_LIFETIME
    if issuer is not None and issuer.expires_at is not None:
        if issuer.expires_at <= now:
            raise Unauthenticated("the credential has expired", code="credential_expired")
        if issuer.expires_at < expires_at:
            expires_at, by = issuer.expires_at, CapReason.ISSUER_EXPIRY
    if lifetime is not None and now + lifetime <= expires_at:
        return now + lifetime, None
    return expires_at, LifetimeCap(requested=lifetime, granted=expires_at - now, by=by)


def check_band(bands: BandTable, band: str | None, issuer: Principal | None) -> None:
    """Refuse a band that is not configured, or one above the issuer's own (its
    credential's band, else its project's, else the default) unless it holds ``admin``."""
    if band is None:
        return
    granted = bands.require(band)
    if issuer is None or ADMIN in issuer.scopes:
        return
    own = bands.entitled(issuer.band, issuer.project_band)
    if granted.priority > own.priority:
        raise Forbidden(
            f"you cannot grant band {band!r} above your own band {own.name!r}",
            code="band_escalation",
            details={"band": band, "own_band": own.name},
        )


class Credentials:
    """The credentials of every project, through the :class:`Store`."""

    def __init__(
        self,
        store: Store,
        authority: Authority,
        *,
        token_max_lifetime: float,
        clock: Callable[[], float],
        bands: BandTable,
    ) -> None:
        self.store = store
        self.authority = authority
        self.token_max_lifetime = token_max_lifetime
        self.clock = clock
        self.bands = bands

    async def create(
        self,
        project_ref: str,
        *,
        name: str,
        scopes: frozenset[str],
        user_id: str | None = None,
        lifetime: float | None = None,
        issuer: Principal | None = None,
        service_id: str | None = None,
        band: str | None = None,
        personal: bool = False,
        lasting: bool = False,
        generated_name: bool = False,
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

        ``band`` is its priority band (None: its project's): one of the configured
        bands, and not above the issuer's own unless the issuer holds ``admin``
        (``band_escalation``).

        ``name`` is unique among the project's live credentials (a person's own, for
        personal keys): a taken one is 409 ``credential_name_taken``, unless
        ``generated_name`` (a default the caller chose), which takes the first free
        of ``name-2``, ``name-3``...

        ``lasting`` makes a person's key outlive what made it: not recorded as minted by
        the issuer (logging out does not revoke it) and not capped at the issuer's
        expiry, only at ``token_max_lifetime``. Only a person makes one: a browser
        session, or a person's own key that nothing minted (``ficc login --username``
        stores one); from any other credential it is 400 ``lasting_needs_session``.

        ``personal`` mints a person's personal key (``project_ref`` is ignored): in the
        reserved personal project, for ``user_id``, holding ``inference:invoke`` only:
        a person's own right, not a delegation of the issuer's project scopes.
        """
        if personal:
            if user_id is None or scopes != {INFERENCE_INVOKE} or service_id or band:
                raise ValueError("a personal key is a person's, holding inference:invoke only")
            project_ref = PERSONAL_PROJECT
        scopes = check_scopes(scopes)
        if not scopes:
            raise InvalidRequest(
                "a credential needs at least one scope",
                details={"errors": [{"path": "$.scopes", "message": "empty"}]},
            )
        if issuer is not None and not personal:
            beyond = sorted(scopes - issuer.scopes)
            if beyond:
                raise Forbidden(
                    f"you cannot grant scopes you do not hold: {', '.join(beyond)}",
                    code="scope_escalation",
                    details={"scopes": beyond},
                )
        check_band(self.bands, band, issuer)
        if lasting and not _stands_for_a_person(issuer):
            raise InvalidRequest(
                "only a person makes a lasting key: a browser session, or a person's own key "
                "that nothing else minted (ficc login --username stores one); a key minted "
                "by another credential always ends with it (omit lasting)",
                code="lasting_needs_session",
                details={"errors": [{"path": "$.lasting", "message": "needs a person"}]},
            )
        # What the new credential is bound to: revoked with it and expiring no later.
        bound = None if lasting else issuer
        credential_id, secret, now = sec.new_id(), sec.new_secret(), self.clock()
        expires_at, capped = credential_expiry(lifetime, bound, now, self.token_max_lifetime)

        def insert(tx: Transaction) -> Credential:
            if personal:
                repository.ensure_personal_project(tx)
            project_id = (
                PERSONAL_PROJECT if personal else repository.require_project(tx, project_ref).id
            )
            chosen = name
            if generated_name:
                chosen = _free_name(tx, project_id, name, user_id, now)
            elif (held := repository.name_holder(tx, project_id, name, user_id, now)) is not None:
                raise Conflict(
                    f"a credential called {name!r} exists already ({held.id}): choose another "
                    "name, or revoke that one first",
                    code="credential_name_taken",
                    details={"name": name, "id": held.id},
                )
            credential = Credential(
                id=credential_id,
                name=chosen,
                project_id=project_id,
                user_id=user_id,
                scopes=tuple(sorted(scopes)),
                created_at=now,
                expires_at=expires_at,
                revoked_at=None,
                service_id=service_id,
                issuer_id=None if bound is None else bound.id,
                capped=capped,
                band=band,
            )
            repository.insert_credential(tx, credential, sec.hash_secret(secret))
            return credential

        credential = await self.store.write(insert)
        return credential, sec.make_token(credential_id, secret)

    async def list(self, project_id: str, *, installation: bool = True) -> list[Credential]:
        """The project's credentials; without ``installation``, none that holds ``admin``."""
        credentials = await self.store.read(lambda tx: repository.list_credentials(tx, project_id))
        return [c for c in credentials if installation or not c.installation_level]

    async def get(
        self, project_id: str, credential_id: str, *, installation: bool = True
    ) -> Credential:
        """One credential of the project by ID or name; without ``installation``, not one
        holding ``admin``."""
        now = self.clock()

        def visible(credential: Credential) -> bool:
            return installation or not credential.installation_level

        credential = await self.store.read(
            lambda tx: resolve(tx, credential_id, now, project_id=project_id, visible=visible)
        )
        if credential is None:
            raise _not_found(credential_id)
        return credential

    async def list_personal(self, user_id: str) -> builtins.list[Credential]:
        """The person's personal keys."""
        return await self.store.read(lambda tx: repository.list_personal_credentials(tx, user_id))

    async def revoke(
        self,
        project_id: str | None,
        credential_id: str,
        *,
        installation: bool = True,
        user_id: str | None = None,
    ) -> Revocation:
        """Revoke a credential (its ID or name) and what it minted, transitively, in one
        transaction (with ``user_id``: only one of that user's)."""
        now = self.clock()

        def visible(credential: Credential) -> bool:
            return installation or not credential.installation_level

        def write(tx: Transaction) -> Revocation:
            found = resolve(
                tx, credential_id, now, project_id=project_id, user_id=user_id, visible=visible
            )
            if found is None:
                raise _not_found(credential_id)
            minted = repository.minted_by(tx, found.id)
            repository.revoke(tx, [found.id, *minted], now)
            revoked = repository.find_credential(tx, found.id)
            assert revoked is not None
            return Revocation(credential=revoked, also_revoked=tuple(minted))

        revocation = await self.store.write(write)
        for revoked in (revocation.credential.id, *revocation.also_revoked):
            self.authority.mark_revoked(revoked)
        return revocation
