"""What the gateway saw of one service's requests, as the autoscaler reads it.

A leaf of plain data: the gateway (:meth:`ficc_core.gateway.Gateway.demand`) fills it
from the request path's counts, in memory; the autoscaler
(:mod:`ficc_core.inference.scaling.autoscaler`) decides by it. Neither package may import the
other (see the layering contracts in pyproject.toml), so it lives below both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs

#: Seconds after its ``Retry-After`` that a request refused ``activation_timeout`` is
#: still expected back (a client's own latency and back-off jitter).
RETURN_MARGIN = 10.0


def retry_after(activation_retry: float) -> int:
    """The ``Retry-After`` of an activation refusal, in whole seconds (at least 1)."""
    return max(1, math.ceil(activation_retry))


def retry_window(activation_retry: float) -> float:
    """Seconds a request refused ``activation_timeout`` counts as demand: its
    ``Retry-After`` and :data:`RETURN_MARGIN` for it to come back. The replica its
    wait woke stays up at least that long, so the retry finds it loading or ready."""
    return retry_after(activation_retry) + RETURN_MARGIN


@attrs.frozen(kw_only=True)
class Demand:
    """One service's demand now.

    :ivar waits: seconds each request waiting now (for a replica slot, or for an
        activation) has waited, longest first.
    :ivar inflight: requests admitted and not yet ended (those waiting included).
    :ivar idle_for: per replica of the current view (its attempt ID), seconds since it
        last served a request (0 while one is in flight); a replica never used counts
        from when the gateway first saw it.
    :ivar returning: requests refused ``activation_timeout`` whose :func:`retry_window`
        has not passed: expected back, they are demand (the service does not go idle).
    """

    waits: tuple[float, ...] = ()
    inflight: int = 0
    idle_for: Mapping[str, float] = attrs.field(factory=dict)
    returning: int = 0

    @property
    def queued(self) -> int:
        """Requests waiting now."""
        return len(self.waits)

    @property
    def oldest_wait(self) -> float:
        """Seconds the longest-waiting request has waited (0 when none waits)."""
        return self.waits[0] if self.waits else 0.0

    def waited(self, count: int) -> float:
        """How long at least ``count`` requests have been waiting, in seconds: the wait
        of the ``count``-th longest-waiting one (0 when fewer wait, or for ``count`` < 1).

        The queue has held ``count`` or more requests at least that long: those
        ``count`` have all been in it since the last of them came.
        """
        if count < 1 or count > len(self.waits):
            return 0.0
        return self.waits[count - 1]


#: One service's demand now, by its ID.
ReadDemand = Callable[[str], Demand]


def no_demand(_service_id: str) -> Demand:
    """No gateway serves the board: no request waits and none is in flight."""
    return Demand()


class DemandBoard:
    """Where the autoscaler reads what the gateway saw (see the module docs)."""

    def __init__(self) -> None:
        self._read: ReadDemand = no_demand

    def serve(self, read: ReadDemand | None) -> None:
        """Answer :meth:`read` with ``read`` from now on (None: no demand)."""
        self._read = no_demand if read is None else read

    def read(self, service_id: str) -> Demand:
        """Service ``service_id``'s demand now."""
        return self._read(service_id)


__all__ = [
    "RETURN_MARGIN",
    "Demand",
    "DemandBoard",
    "ReadDemand",
    "no_demand",
    "retry_after",
    "retry_window",
]
