"""The JSON views of authentication's records: principals, projects, users, credentials.

What clients see; the field names and shapes are the contract's (and the CLI's).
"""

from __future__ import annotations

from typing import Any

from ..auth.principal import Principal
from ..auth.records import Credential, LifetimeCap, Project, Revocation, Shares, User


def principal_view(principal: Principal) -> dict[str, Any]:
    """The public description of a principal (``GET /whoami``, a login's ``principal``)."""
    return {
        "kind": str(principal.kind),
        "id": principal.id,
        "user": None
        if principal.user_id is None
        else {"id": principal.user_id, "username": principal.username, "admin": principal.is_admin},
        "project": {"id": principal.project_id, "name": principal.project_name},
        "scopes": sorted(principal.scopes),
        "expires_at": principal.expires_at,
        "service_id": principal.service_id,
        "band": principal.band,
        "project_band": principal.project_band,
        "personal": principal.personal,
    }


def project_view(project: Project) -> dict[str, Any]:
    """A project."""
    return {
        "id": project.id,
        "name": project.name,
        "created_at": project.created_at,
        "band": project.band,
    }


def user_view(user: User) -> dict[str, Any]:
    """A user with their memberships (never a password hash)."""
    return {
        "id": user.id,
        "username": user.username,
        "admin": user.is_admin,
        "status": str(user.status),
        "created_at": user.created_at,
        "projects": [{"project_id": m.project_id, "scopes": list(m.scopes)} for m in user.projects],
    }


def _cap_view(cap: LifetimeCap) -> dict[str, Any]:
    return {"requested": cap.requested, "granted": cap.granted, "by": str(cap.by)}


def credential_view(credential: Credential) -> dict[str, Any]:
    """A credential (never its secret); one just minted with a shortened life says ``capped``."""
    view: dict[str, Any] = {
        "id": credential.id,
        "name": credential.name,
        "project_id": credential.project_id,
        "user_id": credential.user_id,
        "scopes": list(credential.scopes),
        "created_at": credential.created_at,
        "expires_at": credential.expires_at,
        "revoked_at": credential.revoked_at,
        "service_id": credential.service_id,
        "issuer_id": credential.issuer_id,
        "band": credential.band,
        "last_used_at": credential.last_used_at,
    }
    if credential.capped is not None:
        view["capped"] = _cap_view(credential.capped)
    return view


def issued_view(credential: Credential, token: str) -> dict[str, Any]:
    """A credential just minted and its token, shown this once."""
    return {"credential": credential_view(credential), "token": token}


def revocation_view(revocation: Revocation) -> dict[str, Any]:
    """A revoked credential and the ids of what was revoked with it."""
    return {**credential_view(revocation.credential), "also_revoked": list(revocation.also_revoked)}


def shares_view(shares: Shares) -> dict[str, Any]:
    """Who an inference service is shared with."""
    return {
        "service_id": shares.service_id,
        "users": [{"id": user_id, "username": username} for user_id, username in shares.users],
        "everyone": shares.everyone,
    }
