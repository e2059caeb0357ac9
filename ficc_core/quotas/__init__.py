"""Quotas: rate limits, budgets and spend on the request path (docs/limits.md).

The gateway asks its :class:`QuotaGate` twice per request: :meth:`QuotaGate.admit`
once the request is checked and before a replica is taken (it raises the refusal,
a 429 in the envelope, or reserves what the request is expected to use), and
:meth:`QuotaGate.settle` once it ended, however it ended (it reconciles the
reservation with what the engine reported and returns the request's cost in
milli-units, see :mod:`ficc_core.config.prices`). Neither may block or touch the store.

:class:`Unlimited` is the gate that admits everything and charges nothing;
:class:`Quotas` is the real one (:mod:`.gate`: limits per credential, person and
project, budgets, prices), :class:`QuotaSync` shares its counts with the other
processes on the store (:mod:`.sync`), :mod:`.records` and :mod:`.repository` are
the limit records and their SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..gateway.request import Request

__all__ = [
    "BudgetExceeded",
    "Limits",
    "QuotaGate",
    "QuotaSync",
    "Quotas",
    "RateLimited",
    "Unlimited",
]


class QuotaGate(Protocol):
    """What the gateway asks of quotas (see the module docs)."""

    def admit(self, request: Request) -> None:
        """Refuse ``request`` (raise a :class:`~ficc_core.base.errors.FiccError`) or reserve
        what it is expected to use in ``request.reservation``."""

    def settle(
        self, request: Request, outcome: str, prompt: int | None, completion: int | None
    ) -> int:
        """``request`` ended with ``outcome`` having used ``prompt`` and ``completion``
        tokens (None: not reported): reconcile its reservation; return its cost in
        milli-units."""


class Unlimited:
    """Admits every request and charges nothing."""

    def admit(self, request: Request) -> None:
        return None

    def settle(
        self, request: Request, outcome: str, prompt: int | None, completion: int | None
    ) -> int:
        return 0


from .errors import BudgetExceeded, RateLimited  # noqa: E402
from .gate import Quotas  # noqa: E402
from .records import Limits  # noqa: E402
from .sync import QuotaSync  # noqa: E402
