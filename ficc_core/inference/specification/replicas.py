"""Which placements of a specification run: every one, or a scaled service's active ones.

A service whose specification has ``scaling`` runs replicas on some of its placements
(its *candidates*): the service record's ``active`` indices, at most ``max`` of them.
Every other part of the inference package asks :func:`running_indices` which
replicas a generation wants; for a service without ``scaling`` that is every
placement, as the contract says. The transactions that change ``active`` are
:mod:`~ficc_core.inference.scaling.changes`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...schema import Specification


def floor(specification: Specification, pinned: bool) -> int:
    """Replicas that always run: ``min``, at least one when pinned."""
    least = specification.min_replicas
    return max(least, 1) if pinned and specification.scaling is not None else least


def on_demand(specification: Specification, pinned: bool) -> bool:
    """Whether the service may run no replica (and a request wakes it)."""
    return specification.scaling is not None and floor(specification, pinned) == 0


def running_indices(
    specification: Specification, active: Collection[int] | None
) -> tuple[int, ...]:
    """The placements whose replicas run: every one without ``scaling``; else the
    ``active`` ones that exist (a service scaled by a rollout starts from its first
    ``max``), at most ``max``."""
    count = len(specification.placements)
    if specification.scaling is None:
        return tuple(range(count))
    if active is None:
        return tuple(range(specification.max_replicas))
    return tuple(sorted(i for i in set(active) if i < count))[: specification.max_replicas]


def initial(specification: Specification, pinned: bool = False) -> tuple[int, ...] | None:
    """The placements a starting service runs: ``min`` of them (the first), or every one
    without ``scaling`` (None)."""
    if specification.scaling is None:
        return None
    return tuple(range(floor(specification, pinned)))


__all__ = ["floor", "initial", "on_demand", "running_indices"]
