"""The JSON view of a scope's limits and use, and finding the scope a route names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base.errors import NotFound
from ..quotas.records import NONE

if TYPE_CHECKING:
    from ..controller.service import Service


async def subject(
    service: Service,
    scope: str,
    ref: str,
    project_id: str | None = None,
    *,
    installation: bool = True,
) -> tuple[str, str]:
    """The ID and name of the project (name or ID), user (ID or username) or credential
    (ID; of ``project_id`` when given, not one holding ``admin`` unless ``installation``,
    else of any project) ``ref``; 404 if none."""
    auth = service.auth
    if scope == "project":
        project = await auth.get_project(ref)
        return project.id, project.name
    if scope == "user":
        user = await auth.people.get_user(ref)
        return user.id, user.username
    if project_id is not None:
        credential = await auth.get_credential(project_id, ref, installation=installation)
        return credential.id, credential.name
    for project in await auth.list_projects():
        try:
            credential = await auth.get_credential(project.id, ref)
        except NotFound:
            continue
        return credential.id, credential.name
    raise NotFound(f"no credential {ref!r}", code="credential_not_found", details={"id": ref})


def limits_view(service: Service, scope: str, key: str, name: str) -> dict[str, Any]:
    """``{scope, id, name, limits: {rpm, tpm, budget, period}, use: {...}}``."""
    quotas = service.quotas
    limits = quotas.limits[scope].get(key)
    return {
        "scope": scope,
        "id": key,
        "name": name,
        "limits": (limits or NONE).view(),
        "use": quotas.use(scope, key),
    }
