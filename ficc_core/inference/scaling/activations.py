"""Failed activations of on-demand services, remembered for a while in memory.

The reconciler's on-demand step (:mod:`~ficc_core.inference.reconciliation.on_demand`)
and the autoscaler note a failed activation here; the routing view says ``failed``
with its reason while it is recent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ...routing.live import ActivationFailure


@attrs.frozen(kw_only=True)
class Failure:
    """A failed activation: the envelope's code, message and details, and when (the
    clock's)."""

    code: str
    message: str
    at: float
    details: Mapping[str, Any] = attrs.field(factory=dict)

    def public(self) -> ActivationFailure:
        """What the routing view says of it."""
        return ActivationFailure(code=self.code, message=self.message, details=self.details)


class ActivationNotes:
    """The last failed activation of each on-demand service, kept ``retry`` seconds: the
    view says ``failed`` meanwhile, so every waiter gets the reason at once and a burst
    does not relaunch a broken engine for each request. In memory: a restarted
    controller tries again at the next request."""

    def __init__(self, clock: Callable[[], float], retry: float) -> None:
        self.clock = clock
        self.retry = retry
        self._failures: dict[str, Failure] = {}

    def failed(
        self,
        service_id: str,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
    ) -> Failure:
        """Note a failed activation of ``service_id``."""
        failure = self._failures[service_id] = Failure(
            code=code, message=message, at=self.clock(), details=dict(details or {})
        )
        return failure

    def recent(self, service_id: str) -> Failure | None:
        """The service's failed activation, while it is recent."""
        failure = self._failures.get(service_id)
        if failure is not None and self.clock() - failure.at >= self.retry:
            del self._failures[service_id]
            return None
        return failure

    def clear(self, service_id: str) -> None:
        """Forget the service's failed activation (a new one begins, or it served)."""
        self._failures.pop(service_id, None)


__all__ = ["ActivationNotes", "Failure"]
