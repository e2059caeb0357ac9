"""Limit records: one scope's explicit rate limits and budget, and how a change is read.

A scope is a ``credential`` (one key), a ``user`` (a person, all their keys) or a
``project`` (all its keys). Each field is None where the scope sets nothing: the
fallbacks (``default_rpm``, ``default_tpm``, the personal limits) then decide
(docs/limits.md). 0 is an explicit "no limit".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..base.errors import InvalidRequest

__all__ = ["FIELDS", "PERIODS", "SCOPES", "Limits", "merge_limits"]

#: The scopes a limit is set on.
SCOPES = ("credential", "user", "project")
#: The periods a budget renews over (UTC calendar).
PERIODS = ("day", "month")
#: The fields of a limit, as the API and the store name them.
FIELDS = ("rpm", "tpm", "budget", "period")
#: The largest count accepted (JSON's safe integers).
_MAX = 2**53 - 1


@attrs.frozen
class Limits:
    """One scope's explicit limits (None: not set here).

    :ivar rpm: requests per minute (0: none).
    :ivar tpm: prompt and completion tokens per minute (0: none).
    :ivar budget: whole units per ``period`` (0: none).
    :ivar period: ``day`` or ``month``, with a budget.
    """

    rpm: int | None = None
    tpm: int | None = None
    budget: int | None = None
    period: str | None = None

    @property
    def empty(self) -> bool:
        """Whether this scope sets nothing."""
        return self.rpm is None and self.tpm is None and self.budget is None

    def view(self) -> dict[str, Any]:
        """The JSON form (``{rpm, tpm, budget, period}``, null where unset)."""
        return {"rpm": self.rpm, "tpm": self.tpm, "budget": self.budget, "period": self.period}


NONE = Limits()


def _problem(path: str, message: str) -> dict[str, str]:
    return {"path": path, "message": message}


def merge_limits(current: Limits, change: Mapping[str, Any]) -> Limits:
    """``current`` with ``change`` applied: a field absent stays, null clears it.

    Raises :class:`~ficc_core.base.errors.InvalidRequest` with every field's problem
    (``details.errors``: ``[{path, message}]``) and changes nothing then.
    """
    errors = [_problem(f"$.{key}", "unknown field") for key in change if key not in FIELDS]
    values = current.view()
    for key in FIELDS:
        if key not in change:
            continue
        value = change[key]
        if key == "period":
            if value is not None and value not in PERIODS:
                errors.append(_problem("$.period", "expected day, month or null"))
        elif value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX
        ):
            errors.append(_problem(f"$.{key}", "expected a non-negative integer or null"))
        values[key] = value
    if not errors:
        if values["budget"] is not None and values["period"] is None:
            errors.append(_problem("$.period", "a budget needs a period: day or month"))
        if values["budget"] is None and values["period"] is not None and "period" in change:
            errors.append(_problem("$.budget", "a period goes with a budget"))
        if values["budget"] is None:
            values["period"] = None
    if errors:
        raise InvalidRequest("the limits are invalid", details={"errors": errors})
    return Limits(**values)
