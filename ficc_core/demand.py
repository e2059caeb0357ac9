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
    """

    queued: int = 0
    oldest_wait: float = 0.0
    inflight: int = 0
    idle_for: Mapping[str, float] = attrs.field(factory=dict)


__all__ = ["Demand"]
