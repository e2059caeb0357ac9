"""The scopes a credential can carry, exactly as the contract names them."""

from __future__ import annotations

from collections.abc import Iterable

from ..base.errors import InvalidRequest

MODELS_READ = "models:read"
MODELS_MANAGE = "models:manage"
INFERENCE_READ = "inference:read"
INFERENCE_MANAGE = "inference:manage"
INFERENCE_INVOKE = "inference:invoke"
TOKENS_MANAGE = "tokens:manage"
JOBS_EXECUTE = "jobs:execute"
JOBS_CANCEL = "jobs:cancel"
CONTRIBUTORS_READ = "contributors:read"
#: Manage projects and users across the whole installation (not project-scoped).
ADMIN = "admin"

#: Every project scope, in the contract's order.
PROJECT_SCOPES: tuple[str, ...] = (
    MODELS_READ,
    MODELS_MANAGE,
    INFERENCE_READ,
    INFERENCE_MANAGE,
    INFERENCE_INVOKE,
    TOKENS_MANAGE,
    JOBS_EXECUTE,
    JOBS_CANCEL,
    CONTRIBUTORS_READ,
)
ALL_SCOPES: tuple[str, ...] = (*PROJECT_SCOPES, ADMIN)


def check_scopes(scopes: Iterable[str], *, field: str = "scopes") -> frozenset[str]:
    """Return ``scopes`` as a frozenset, refusing names that are not scopes."""
    found = frozenset(scopes)
    unknown = sorted(found - set(ALL_SCOPES))
    if unknown:
        raise InvalidRequest(
            f"unknown scope(s): {', '.join(unknown)}; valid scopes are {', '.join(ALL_SCOPES)}",
            details={
                "errors": [{"path": f"$.{field}", "message": "unknown scope"}],
                "unknown": unknown,
            },
        )
    return found
