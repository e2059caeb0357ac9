"""Quotas: rate limits, budgets and spend on the request path (docs/limits.md).

The gateway asks its :class:`QuotaGate` twice per request: :meth:`QuotaGate.admit`
once the request is checked and before a replica is taken (it raises the refusal,
a 429 in the envelope, or reserves what the request is expected to use), and
:meth:`QuotaGate.settle` once it ended, however it ended (it reconciles the
reservation with what the engine reported and returns the request's cost in
milli-units, see :mod:`ficc_core.prices`). Neither may block or touch the store.

:class:`Unlimited` is the gate that admits everything and charges nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..gateway.request import Request

__all__ = ["QuotaGate", "Unlimited"]


class QuotaGate(Protocol):
    """What the gateway asks of quotas (see the module docs)."""

    def admit(self, request: Request) -> None:
        """Refuse ``request`` (raise a :class:`~ficc_core.errors.FiccError`) or reserve
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
