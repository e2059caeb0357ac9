"""Bearer credentials: minting (the one place that bounds a lifetime), listing, revoking.

Every credential is minted by :meth:`Credentials.create`, which bounds its lifetime
(never past ``token_max_lifetime``, never past its issuer's expiry) and records its
issuer, so revoking an issuer revokes what it minted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..bands import BandTable
from ..errors import Forbidden, InvalidRequest, NotFound, Unauthenticated
from ..store import Store, Transaction
from . import repository
from . import secrets as sec
from .authority import Authority
from .principal import Principal
from .records import PERSONAL_PROJECT, CapReason, Credential, LifetimeCap, Revocation
from .scopes import ADMIN, INFERENCE_INVOKE, check_scopes


def _not_found(credential_id: str) -> NotFound:
    return NotFound(
        f"no credential {credential_id!r} in this project",
        code="credential_not_found",
        details={"id": credential_id},
    )


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
        credential_id, secret, now = sec.new_id(), sec.new_secret(), self.clock()
        expires_at, capped = credential_expiry(lifetime, issuer, now, self.token_max_lifetime)

        def insert(tx: Transaction) -> Credential:
            if personal:
                repository.ensure_personal_project(tx)
            credential = Credential(
                id=credential_id,
                name=name,
                project_id=PERSONAL_PROJECT
                if personal
                else repository.require_project(tx, project_ref).id,
                user_id=user_id,
                scopes=tuple(sorted(scopes)),
                created_at=now,
                expires_at=expires_at,
                revoked_at=None,
                service_id=service_id,
                issuer_id=None if issuer is None else issuer.id,
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
        """One credential of the project; without ``installation``, not one holding ``admin``."""
        credential = await self.store.read(lambda tx: repository.find_credential(tx, credential_id))
        if (
            credential is None
            or credential.project_id != project_id
            or not (installation or not credential.installation_level)
        ):
            raise _not_found(credential_id)
        return credential

    async def list_personal(self, user_id: str) -> list[Credential]:
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
        """Revoke a credential and what it minted, transitively, in one transaction
        (with ``user_id``: only one of that user's)."""
        now = self.clock()

        def write(tx: Transaction) -> Revocation:
            found = repository.find_credential(tx, credential_id)
            if (
                found is None
                or (project_id is not None and found.project_id != project_id)
                or (user_id is not None and found.user_id != user_id)
                or not (installation or not found.installation_level)
            ):
                raise _not_found(credential_id)
            minted = repository.minted_by(tx, credential_id)
            repository.revoke(tx, [credential_id, *minted], now)
            revoked = repository.find_credential(tx, credential_id)
            assert revoked is not None
            return Revocation(credential=revoked, also_revoked=tuple(minted))

        revocation = await self.store.write(write)
        for revoked in (credential_id, *revocation.also_revoked):
            self.authority.mark_revoked(revoked)
        return revocation
