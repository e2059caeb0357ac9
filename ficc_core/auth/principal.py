"""Who is making a request: a bearer credential or a browser session, with its scopes."""

from __future__ import annotations

import enum

import attrs


class PrincipalKind(enum.StrEnum):
    """What authenticated a request."""

    CREDENTIAL = "credential"
    SESSION = "session"


@attrs.frozen
class Principal:
    """Who is making a request, in which project, with which scopes."""

    kind: PrincipalKind
    id: str
    project_id: str
    project_name: str
    scopes: frozenset[str]
    user_id: str | None = None
    username: str | None = None
    is_admin: bool = False
    expires_at: float | None = None
    csrf_hash: str | None = attrs.field(default=None, repr=False)
    #: For a service-bound invoke credential, the one inference service it may invoke.
    service_id: str | None = None
    #: The credential's priority band and its project's (None: not set; docs/priority.md).
    band: str | None = None
    project_band: str | None = None
    #: A person's personal key: outside any project, within the personal limits, and
    #: invoking the services shared with its person (docs/people.md).
    personal: bool = False
    #: For a personal key, the services shared with its person or with everyone, as read
    #: at authentication (a share changed elsewhere applies within the cache period).
    shared: frozenset[str] = frozenset()
    #: A bearer credential's name (what the access log shows it as; None for sessions).
    name: str | None = None
    #: The credential or session that minted this bearer credential (None: nothing did).
    issuer_id: str | None = None

    def may_invoke(self, service_id: str) -> bool:
        """Whether this principal may invoke inference service ``service_id``."""
        return "inference:invoke" in self.scopes and self.service_id in (None, service_id)
