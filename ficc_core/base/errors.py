"""Errors that carry a stable machine code, an actionable message and details.

Every refusal FICC makes, in the API, the CLI or a plugin loader, is one of these.
The API maps them to the one JSON error envelope::

    {"error": {"code": "invalid_request", "message": "...", "details": {...}}}

``code`` is stable and meant for programs; ``message`` is a sentence a person can
act on; ``details`` holds structured facts (field paths, current revisions, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class FiccError(Exception):
    """Base class for every error FICC reports to a client or operator."""

    #: The HTTP status the API answers with.
    status: int = 500
    #: The stable machine code of this kind of error.
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.details: dict[str, Any] = dict(details or {})
        self.headers: dict[str, str] = dict(headers or {})

    def envelope(self) -> dict[str, Any]:
        """Return the JSON error envelope for this error."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequest(FiccError):
    """The request is malformed: bad JSON, wrong types, unknown fields, bad values."""

    status = 400
    code = "invalid_request"


class Unauthenticated(FiccError):
    """No valid credential came with the request."""

    status = 401
    code = "unauthenticated"


class Forbidden(FiccError):
    """The credential is valid but lacks a required scope or check."""

    status = 403
    code = "forbidden"


class NotFound(FiccError):
    """The resource does not exist, or belongs to another project."""

    status = 404
    code = "not_found"


class Conflict(FiccError):
    """The request conflicts with the current state (taken name, stale revision)."""

    status = 409
    code = "conflict"


class PayloadTooLarge(FiccError):
    """The request body is larger than the route admits."""

    status = 413
    code = "payload_too_large"


class StoreError(FiccError):
    """The store could not be opened or migrated."""

    status = 503
    code = "store_unavailable"


class StoreUnavailable(StoreError):
    """The store failed or did not answer in time while a request needed it: retry soon.

    Carries ``Retry-After`` (``retry_after`` seconds) and ``details.retry_after``.
    """

    def __init__(self, message: str, *, retry_after: int = 1, **kwargs: Any) -> None:
        headers = {"Retry-After": str(retry_after), **(kwargs.pop("headers", None) or {})}
        details = {"retry_after": retry_after, **(kwargs.pop("details", None) or {})}
        super().__init__(message, headers=headers, details=details, **kwargs)


class NotLeader(FiccError):
    """This controller is a standby; the action needs the leader (docs/operations.md,
    "Several controllers").

    409 with ``details.leader`` (``id``, ``url``) and ``details.term`` while a leader is
    known, so a client can send the request there; 503 with ``Retry-After`` while none is
    (a takeover is under way: retry within the lease).
    """

    status = 409
    code = "not_leader"

    def __init__(
        self,
        action: str,
        *,
        leader_id: str | None,
        leader_url: str | None,
        term: int,
        retry_after: int = 5,
    ) -> None:
        if leader_id is None:
            super().__init__(
                f"{action} needs the leader controller, and none holds the lease now; "
                f"retry in {retry_after} s",
                status=503,
                details={"leader": None, "term": term, "action": action},
                headers={"Retry-After": str(retry_after)},
            )
            return
        super().__init__(
            f"{action} needs the leader controller; this one is a standby: send it to "
            f"{leader_id} at {leader_url or '(no advertised URL)'}",
            details={
                "leader": {"id": leader_id, "url": leader_url},
                "term": term,
                "action": action,
            },
        )


class StoreNotEmpty(StoreError):
    """``ficc admin migrate-store`` refused a destination that already holds data."""

    status = 409
    code = "store_not_empty"


class ConfigError(FiccError):
    """A configuration file or value is invalid."""

    status = 500
    code = "invalid_configuration"


class PluginError(FiccError):
    """A plugin was refused; the message names its distribution."""

    status = 500
    code = "plugin_refused"

    def __init__(self, message: str, *, distribution: str | None, **kwargs: Any) -> None:
        details = dict(kwargs.pop("details", None) or {})
        details.setdefault("distribution", distribution)
        super().__init__(message, details=details, **kwargs)
        self.distribution = distribution
