"""Admitting a specification: its checks (engine, model, adapter) and its placement.

A specification is checked field by field (every refusal names its path), then
placed beside every other service's reservations in the transaction that records
it, so two submissions never both take the last GPU.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from ...base.errors import FiccError
from ...schema import FieldError, SchemaError, Specification, structure
from ...store import Transaction
from .. import repository
from ..errors import PlacementFailed
from .placement import Plan, plan
from .replicas import initial
from .tiers import check_placements

if TYPE_CHECKING:
    from ...plugins import AdapterRegistry
    from .model_context import ModelContext, ModelContexts


async def check_specification(
    document: Any, project_id: str, *, adapters: AdapterRegistry, contexts: ModelContexts
) -> tuple[Specification, ModelContext]:
    """Structure and check a specification; every refusal names its field path."""
    specification = structure(document, Specification, what="specification")
    errors: list[dict[str, str]] = []
    if specification.engine not in adapters:
        installed = ", ".join(sorted(adapters)) or "none"
        errors.append(
            {
                "path": "$.engine",
                "message": f"no engine adapter {specification.engine!r} is installed "
                f"(installed: {installed}); see 'ficc plugins'",
            }
        )
    if specification.tensor_split is not None:
        for index, placement in enumerate(specification.placements):
            gpus = len(placement.limits.gpus)
            if gpus != len(specification.tensor_split):
                errors.append(
                    {
                        "path": "$.tensor_split",
                        "message": f"lists {len(specification.tensor_split)} share(s), but "
                        f"placement {index} reserves {gpus} GPU(s); give one share per GPU",
                    }
                )
                break
    model = await contexts.get(project_id, specification.model_id)
    if not errors:
        adapter = adapters[specification.engine]
        for index, placement in enumerate(specification.placements):
            try:
                adapter.job(specification, model.record, placement, model.inputs)
            except FieldError as exc:
                errors.append({"path": f"$.{exc.field}", "message": exc.message})
                break
            except FiccError:
                raise
            except Exception as exc:  # a third-party adapter's own refusal
                errors.append(
                    {
                        "path": "$",
                        "message": f"the {specification.engine} adapter refused placement "
                        f"{index}: {type(exc).__name__}: {exc}",
                    }
                )
                break
    if errors:
        raise SchemaError(errors, what="specification")
    return specification, model


def plan_in(
    tx: Transaction,
    service_id: str,
    specification: Specification,
    model: ModelContext,
    *,
    generation: int = 0,
    beside_own: bool = False,
    action: str = "preview",
    held: Collection[int] | None = None,
) -> Plan:
    """Plan ``specification`` (for ``generation``) in ``tx`` beside every reservation but
    the service's own, or beside its own too (``beside_own``: they stay held meanwhile,
    as a rollout's serving generation does).

    ``held`` names the replicas whose reservations the plan takes; by default those a
    scaled service starts with (:func:`~.replicas.initial`: ``min`` of them), every one
    for any other. The rest are planned: shown with their fit, never refused.

    A runtime that requires a GPU placed on a node without one is refused first
    (:class:`~.tiers.TierMismatch`, naming ``action``).
    """
    check_placements(tx, specification, action=action)
    node_ids = list(dict.fromkeys(p.node_id for p in specification.placements))
    existing = repository.reservations_but(tx, service_id)
    if beside_own:
        existing += repository.reservations(tx, service_id)
    return plan(
        service_id,
        specification,
        repository.placement_nodes(tx, node_ids),
        existing,
        model_bytes=model.size,
        model_revision=model.record.revision,
        generation=generation,
        held=initial(specification) if held is None else held,
    )


def refuse_plan(result: Plan) -> PlacementFailed:
    """The refusal of a plan that does not fit: its first reason, and every one in details."""
    reasons = result.reasons()
    first = reasons[0]["message"]
    more = f" (and {len(reasons) - 1} more reason(s))" if len(reasons) > 1 else ""
    return PlacementFailed(
        f"the service does not fit: {first}{more}; preview it to see every reason",
        details={"reasons": reasons, "plan": result.to_json()},
    )


def place(
    tx: Transaction,
    service_id: str,
    specification: Specification,
    model: ModelContext,
    *,
    generation: int = 0,
    beside_own: bool = False,
    action: str = "create",
    held: Collection[int] | None = None,
) -> Plan:
    """A plan that fits; refuse with :class:`~.tiers.TierMismatch` (a GPU runtime on a node
    without GPUs, naming ``action``) or :class:`PlacementFailed` otherwise."""
    result = plan_in(
        tx,
        service_id,
        specification,
        model,
        generation=generation,
        beside_own=beside_own,
        action=action,
        held=held,
    )
    if not result.fits:
        raise refuse_plan(result)
    return result


def reserve(
    tx: Transaction,
    service_id: str,
    specification: Specification,
    model: ModelContext,
    now: float,
    *,
    generation: int,
    action: str = "replace",
    held: Collection[int] | None = None,
) -> Plan:
    """Place ``specification`` and replace the service's reservations with the plan's
    (for ``generation``, the one about to start; ``held`` as :func:`plan_in` says)."""
    result = place(
        tx, service_id, specification, model, generation=generation, action=action, held=held
    )
    repository.delete_reservations(tx, service_id)
    repository.insert_reservations(tx, result.reservations, now)
    return result
