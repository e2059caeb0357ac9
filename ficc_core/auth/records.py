"""What the authentication store holds, as typed records (:mod:`.repository` reads them).

The API renders them (``ficc_core.api.views_auth``); the domain never sees a row.
"""

from __future__ import annotations

import enum

import attrs

from .scopes import ADMIN

#: The reserved project personal keys (and personal sessions) belong to: no one can
#: name, list, join or create it, so every project route's scoping keeps them out.
PERSONAL_PROJECT = "~personal"


class UserStatus(enum.StrEnum):
    """Whether a user may log in and use their keys (``pending``: signed up, not approved)."""

    ACTIVE = "active"
    PENDING = "pending"


class CapReason(enum.StrEnum):
    """Why a credential's lifetime was shortened (its ``capped.by``)."""

    TOKEN_MAX_LIFETIME = "token_max_lifetime"
    ISSUER_EXPIRY = "issuer_expiry"


@attrs.frozen
class Project:
    """A project: credentials, models and services belong to one."""

    id: str
    name: str
    created_at: float
    #: The priority band of its credentials that name none (None: ``band_default``).
    band: str | None = None


@attrs.frozen
class Membership:
    """A user's scopes in one project (sorted, as stored)."""

    project_id: str
    scopes: tuple[str, ...]


@attrs.frozen
class User:
    """A user with their memberships (never their password hash)."""

    id: str
    username: str
    is_admin: bool
    created_at: float
    projects: tuple[Membership, ...] = ()
    status: UserStatus = UserStatus.ACTIVE


@attrs.frozen
class UserLogin:
    """What a login checks: the user's password hash and whether they administer."""

    id: str
    is_admin: bool
    password_hash: str
    status: UserStatus = UserStatus.ACTIVE


@attrs.frozen
class LifetimeCap:
    """A lifetime asked for (``None``: the longest allowed) and what was granted instead."""

    requested: float | None
    granted: float
    by: CapReason


@attrs.frozen
class Credential:
    """A bearer credential (never its secret)."""

    id: str
    name: str
    project_id: str
    user_id: str | None
    scopes: tuple[str, ...]
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    #: The one inference service a service-bound invoke credential may invoke.
    service_id: str | None
    #: The credential or session that minted this one (revoking it revokes this).
    issuer_id: str | None
    #: Set on a credential just minted whose lifetime was shortened.
    capped: LifetimeCap | None = None
    #: Its priority band (None: its project's band, else ``band_default``).
    band: str | None = None
    #: When a request made with it last finished, as usage records it (listings only;
    #: None: none recorded, or not read).
    last_used_at: float | None = None

    @property
    def installation_level(self) -> bool:
        """Whether it holds ``admin``: it acts beyond its project, so only
        administrators see or revoke it."""
        return ADMIN in self.scopes


@attrs.frozen
class Revocation:
    """A revoked credential and every credential it minted, transitively, revoked with it."""

    credential: Credential
    also_revoked: tuple[str, ...]


@attrs.frozen
class StoredCredential:
    """A credential as bearer authentication reads it: with its secret's hash and owners."""

    credential: Credential
    secret_hash: str
    project_name: str
    username: str | None
    is_admin: bool
    project_band: str | None = None
    #: Its user's status (None: no user).
    user_status: UserStatus | None = None
    #: For a personal key, the services shared with its person (or with everyone).
    shared: frozenset[str] = frozenset()

    @property
    def personal(self) -> bool:
        """Whether it is a personal key (of the reserved personal project)."""
        return self.credential.project_id == PERSONAL_PROJECT


@attrs.frozen
class Shares:
    """Who an inference service is shared with: people (id, username) and/or everyone."""

    service_id: str
    users: tuple[tuple[str, str], ...]
    everyone: bool


@attrs.frozen
class StoredSession:
    """A browser session as authentication reads it, with the user's scopes in its project."""

    id: str
    secret_hash: str
    csrf_hash: str
    user_id: str
    username: str
    is_admin: bool
    project_id: str
    project_name: str
    expires_at: float
    #: The user's membership scopes in the session's project (empty if none).
    scopes: tuple[str, ...]
    project_band: str | None = None


@attrs.frozen
class NewSession:
    """A session to store: hashes only, never the secrets."""

    id: str
    secret_hash: str
    csrf_hash: str
    user_id: str
    project_id: str
    created_at: float
    expires_at: float
