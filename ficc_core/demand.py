"""What the gateway saw of one service's requests, as the autoscaler reads it.

A leaf of plain data: the gateway (:meth:`ficc_core.gateway.Gateway.demand`) fills it
from the request path's counts, in memory; the autoscaler
(:mod:`ficc_core.inference.autoscaler`) decides by it. Neither package may import the
other (see the layering contracts in pyproject.toml), so it lives below both.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen(kw_only=True)
class Demand:
    """One service's demand now.

    :ivar queued: requests waiting now: for a replica slot, or for an activation.
    :ivar oldest_wait: seconds the longest-waiting of them has waited (0 when none).
    :ivar inflight: requests admitted and not yet ended (those queued included).
    :ivar idle_for: per replica of the current view (its attempt ID), seconds since it
        last served a request (0 while one is in flight); a replica never used counts
        from when the gateway first saw it.
    :ivar waits: seconds each waiting request has waited, longest first (empty when the
        gateway did not say: :meth:`waited` then answers 0).
    """

    queued: int = 0
    oldest_wait: float = 0.0
    inflight: int = 0
    idle_for: Mapping[str, float] = attrs.field(factory=dict)
    waits: tuple[float, ...] = ()

    def waited(self, count: int) -> float:
        """How long at least ``count`` requests have been waiting, in seconds: the wait
        of the ``count``-th longest-waiting one (0 when fewer wait, or for ``count`` < 1).

        The queue has held ``count`` or more requests at least that long: those
        ``count`` have all been in it since the last of them came.
        """
        if count < 1 or count > len(self.waits):
            return 0.0
        return self.waits[count - 1]


__all__ = ["Demand"]
