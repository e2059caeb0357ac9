"""The quota refusals: 429 in the one envelope, with ``Retry-After``."""

from __future__ import annotations

from typing import Any

from ..base.errors import FiccError

__all__ = ["BudgetExceeded", "RateLimited"]


class _Refusal(FiccError):
    status = 429

    def __init__(self, message: str, *, retry_after: int, details: dict[str, Any]) -> None:
        details["retry_after"] = retry_after
        super().__init__(message, details=details, headers={"Retry-After": str(retry_after)})


class RateLimited(_Refusal):
    """A scope's requests or tokens per minute would be exceeded.

    ``details``: ``limit`` (``rpm`` or ``tpm``), ``scope``, ``id``, ``value`` (the
    limit), ``requested`` (1 request, or the tokens reserved), ``retry_after``.
    """

    code = "rate_limited"


class BudgetExceeded(_Refusal):
    """A project's or person's budget for the period would be exceeded.

    ``details``: ``scope``, ``id``, ``budget`` (whole units), ``spent`` (units, with
    what is in flight), ``estimate`` (this request's, units), ``period``,
    ``resets_at`` (Unix seconds), ``retry_after``.
    """

    code = "budget_exceeded"
