"""The tier check: a runtime that requires a GPU never goes to a node without one.

A node's snapshot says, for each installed runtime, whether it ``requires_gpu``
(:class:`~ficc_core.schema.InstalledRuntime`). Create, replace, start and move all
refuse a replica whose runtime requires a GPU on a node that reports none, with one
refusal (:class:`TierMismatch`, 422 ``tier_mismatch``) in the peer's words:
"llama_server requires a GPU; node cpu-1 has none".

:func:`check_tier` is the one check; :func:`check_node` finds its facts on a node's
record (the runtime the specification binds, by provider and image digest) and
:func:`check_placements` applies it to every node a specification places a replica on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import contributors
from ...base.errors import InvalidRequest
from ...schema import InstalledRuntime, SchemaError

if TYPE_CHECKING:
    from ...contributors.records import Node
    from ...schema import ExecutorSnapshot, Runtime, Specification
    from ...store import Transaction


class TierMismatch(InvalidRequest):
    """The runtime requires a GPU and the node has none."""

    status = 422
    code = "tier_mismatch"


def check_tier(
    runtime: str, requires_gpu: bool, node_name: str, node_gpus: int, *, action: str
) -> None:
    """Refuse (:class:`TierMismatch`) a runtime that ``requires_gpu`` on a node without GPUs.

    :param runtime: the runtime's name, as the node's snapshot gives it.
    :param node_name: the node's name, as operators know it.
    :param node_gpus: how many GPUs the node's snapshot reports.
    :param action: what was asked (``create``, ``replace``, ``start``, ``move``), for details.
    """
    if requires_gpu and node_gpus <= 0:
        raise TierMismatch(
            f"{runtime} requires a GPU; node {node_name} has none",
            details={
                "action": action,
                "runtime": runtime,
                "node": node_name,
                "reason": "tier_mismatch",
                "target_gpus": 0,
            },
        )


def installed_runtime(snapshot: ExecutorSnapshot, runtime: Runtime) -> InstalledRuntime | None:
    """The runtime ``snapshot`` advertises with ``runtime``'s provider and image digest."""
    for installed in snapshot.runtimes:
        if (
            installed.executor_provider == runtime.executor_provider
            and installed.image_digest == runtime.image_digest
        ):
            return installed
    return None


def check_node(node: Node, specification: Specification, *, action: str) -> None:
    """:func:`check_tier` for ``specification``'s runtime on ``node``.

    A node without a (readable) snapshot or without the runtime passes: placement
    refuses those with its own reasons (``runtime_not_installed``, ...).
    """
    try:
        snapshot = node.executor_snapshot()
    except (SchemaError, ValueError):
        return
    if snapshot is None:
        return
    installed = installed_runtime(snapshot, specification.runtime)
    if installed is not None and installed.requires_gpu:
        check_tier(installed.name, True, node.name, len(snapshot.resources.gpus), action=action)


def check_placements(tx: Transaction, specification: Specification, *, action: str) -> None:
    """:func:`check_node` on every node ``specification`` places a replica on, in ``tx``."""
    for node_id in dict.fromkeys(p.node_id for p in specification.placements):
        node = contributors.fetch_node(tx, node_id)
        if node is not None:
            check_node(node, specification, action=action)


__all__ = ["TierMismatch", "check_node", "check_placements", "check_tier", "installed_runtime"]
