"""Names and aliases wherever the command line takes an ID.

``ficc models show smollm2`` and ``ficc inference stop smol`` work as well as with
the IDs: :func:`resolve` lists the project's models or services and matches the
argument against the IDs first, then the names (models) or aliases (services), then
the starts of the IDs.
"""

from __future__ import annotations

from typing import Any

import click

from .client import ApiClient, ApiError

#: For each kind: the list route, the key of its list and the field a person names.
_KINDS = {
    "models": ("/api/v1/models", "models", "name", "model"),
    "inference": ("/api/v1/inference", "services", "alias", "service"),
}


#: The shortest start of an ID accepted for it.
_MIN_PREFIX = 4


class AmbiguousName(click.ClickException):
    """A name that more than one object has; ``candidates`` lists their IDs."""

    def __init__(self, what: str, name: str, candidates: list[dict[str, Any]], label: str):
        self.candidates = [item["id"] for item in candidates]
        listing = "; ".join(
            f"{item['id']} ({item.get('state', '-')}, created {_created(item)})"
            for item in candidates
        )
        super().__init__(
            f"{len(candidates)} {what}s have the {label} {name!r}: {listing}; give the ID "
            "[ambiguous_name]"
        )


def _created(item: dict[str, Any]) -> str:
    from .output import when

    return when(item.get("created_at"))


def resolve(client: ApiClient, kind: str, name_or_id: str) -> str:
    """The ID of the project's ``kind`` (``models`` or ``inference``) called ``name_or_id``.

    An ID matches first; then a name (models) or alias (services); then the start
    of an ID (at least four characters, as short IDs are used). Several matching is
    :class:`AmbiguousName`, listing them. None matching returns ``name_or_id``
    as it is, so the API's own refusal (``model_not_found``, ``service_not_found``)
    names it; so does a credential that may not list them (a service-bound token).
    """
    route, key, label, what = _KINDS[kind]
    try:
        items = client.json("GET", route)[key]
    except ApiError as exc:
        if exc.code != "missing_scope":
            raise
        return name_or_id  # a credential that may not list (a service-bound token)
    if any(item["id"] == name_or_id for item in items):
        return name_or_id
    for field, matches in (
        (label, [item for item in items if item.get(label) == name_or_id]),
        ("ID prefix", [item for item in items if _prefix(item["id"], name_or_id)]),
    ):
        if len(matches) == 1:
            return matches[0]["id"]
        if matches:
            raise AmbiguousName(what, name_or_id, matches, field)
    return name_or_id


def _prefix(identifier: str, text: str) -> bool:
    return len(text) >= _MIN_PREFIX and identifier.startswith(text)


def resolve_credential(client: ApiClient, name_or_id: str) -> str:
    """The ID of the project's credential called ``name_or_id`` (its ID or its name).

    For the routes that take only an ID (a usage filter); the credential routes take a
    name themselves. A name is unique among the project's live credentials: the live
    one it names, else the newest that had it. A credential that may not list the
    project's credentials (no ``tokens:manage``) gets ``name_or_id`` back as it is, so
    the API's own refusal names it.
    """
    try:
        items = client.json("GET", "/api/v1/tokens")["tokens"]
    except ApiError as exc:
        if exc.code != "missing_scope":
            raise
        return name_or_id
    if any(item["id"] == name_or_id for item in items):
        return name_or_id
    named = sorted(
        (item for item in items if item.get("name") == name_or_id),
        key=lambda item: (item.get("revoked_at") is None, item.get("created_at") or 0),
        reverse=True,
    )
    return named[0]["id"] if named else name_or_id
