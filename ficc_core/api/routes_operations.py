"""``/api/v1/inference/...``: operations on running services (move, bulk move, restart,
rollout), extensions beside the contract's routes.

Writes need the scopes of a start (``inference:manage``, ``jobs:execute``,
``contributors:read``, ``models:read``); see :mod:`ficc_core.api.access`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import attrs
from quart import Response, g, jsonify

from ..base.errors import FiccError
from ..inference.operations.moves import bulk_move
from ..inference.operations.rollout import rollout_view
from ..inference.operations.strategies import STRATEGIES
from ..schema import FieldError
from ..schema._convert import MAX_SAFE_INTEGER, integer
from ..schema.spec import MAX_GPU_INDEX
from .access import route
from .bodies import read_json
from .views_inference import preview_view
from .views_inference import service_view as view_of_service

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service
    from ..inference import ServiceDetail

MAX_BULK = 50


@attrs.frozen(kw_only=True)
class MoveBody:
    """``POST /inference/{id}/replicas/{n}/move``."""

    target_node_id: str
    target_gpu_index: int | None = integer(0, MAX_GPU_INDEX, default=None)
    start_after_move: bool = True
    revision: int | None = integer(0, MAX_SAFE_INTEGER, default=None)


@attrs.frozen(kw_only=True)
class BulkItem:
    """One replica of a bulk move."""

    service_id: str
    replica: int = integer(0, 4095)


def _bulk_size(_instance: Any, attribute: attrs.Attribute, value: tuple[BulkItem, ...]) -> None:
    if not 1 <= len(value) <= MAX_BULK:
        raise FieldError(attribute.name, f"must list 1 to {MAX_BULK} replicas")


@attrs.frozen(kw_only=True)
class BulkMoveBody:
    """``POST /inference/bulk-move``."""

    replicas: tuple[BulkItem, ...] = attrs.field(validator=_bulk_size)
    target_node_id: str
    target_gpu_index: int | None = integer(0, MAX_GPU_INDEX, default=None)
    start_after_move: bool = True


@attrs.frozen(kw_only=True)
class RestartBody:
    """``POST /inference/{id}/restart`` and ``.../replicas/{n}/restart``."""

    revision: int = integer(0, MAX_SAFE_INTEGER)


def _strategy(_instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in STRATEGIES:
        raise FieldError(attribute.name, f"must be one of {', '.join(STRATEGIES)}, got {value!r}")


@attrs.frozen(kw_only=True)
class RolloutBody:
    """``POST /inference/{id}/rollout``: the revision read, and the next specification;
    ``strategy`` how it runs (docs/inference.md, "Rollout strategies"); ``keep_limits``
    keeps memory limits a new context would recompute."""

    revision: int = integer(0, MAX_SAFE_INTEGER)
    spec: dict[str, Any]
    strategy: str = attrs.field(default="auto", validator=_strategy)
    keep_limits: bool = False


@attrs.frozen(kw_only=True)
class RolloutPreviewBody:
    """``POST /inference/{id}/rollout/preview``."""

    spec: dict[str, Any]
    strategy: str = attrs.field(default="auto", validator=_strategy)
    keep_limits: bool = False


@contextmanager
def _refusals(action: str, service_id: str | None, replica: int | None = None) -> Iterator[None]:
    """Every refusal of an operation carries the same details (``action``, ``service``,
    ``service_id``, ``replica``, ``node``, ``reason``, ``raw_error``); those the refusal
    set itself win."""
    try:
        yield
    except FiccError as exc:
        defaults = {
            "action": action,
            "service": service_id,
            "service_id": service_id,
            "replica": replica,
            "node": None,
            "reason": exc.code,
            "raw_error": None,
        }
        exc.details = {**defaults, **exc.details}
        raise


def register(app: QuartTrio, service: Service) -> None:
    """Add the operations routes to ``app``."""
    inference = service.inference
    limit = service.config.max_body_bytes

    def service_view(detail: ServiceDetail) -> dict[str, Any]:
        return view_of_service(
            detail,
            service.config.replica_give_up_after,
            trouble=service.contributors.attempt_trouble,
        )

    @asynccontextmanager
    async def leader_only(action: str, service_id: str) -> AsyncIterator[None]:
        """Another project's service is a 404 first; then a standby refuses (``not_leader``):
        these operations run in process with the leader's reconciler, and end answering
        ``not_leader`` if it loses the lease meanwhile (``LeaderLease.while_leading``)."""
        await inference.get(g.principal.project_id, service_id)
        async with service.lease.while_leading(action):
            yield

    @route(app, "inference_move")
    async def inference_move(service_id: str, replica: int) -> Response:
        with _refusals("move", service_id, replica):
            body = await read_json(MoveBody, limit)
            async with leader_only("move", service_id):
                result = await inference.mover.move(
                    g.principal,
                    service_id,
                    replica,
                    target_node_id=body.target_node_id,
                    target_gpu_index=body.target_gpu_index,
                    start_after_move=body.start_after_move,
                    revision=body.revision,
                )
        return jsonify(result.to_json())

    @route(app, "inference_bulk_move")
    async def inference_bulk_move() -> Response:
        with _refusals("bulk_move", None):
            body = await read_json(BulkMoveBody, limit)
            service.lease.require_leader("bulk_move")
        async with service.lease.while_leading("bulk_move"):
            result = await bulk_move(
                inference.mover,
                g.principal,
                [(item.service_id, item.replica) for item in body.replicas],
                target_node_id=body.target_node_id,
                target_gpu_index=body.target_gpu_index,
                start_after_move=body.start_after_move,
            )
        return jsonify(result)

    @route(app, "inference_restart")
    async def inference_restart(service_id: str) -> Response:
        with _refusals("restart", service_id):
            body = await read_json(RestartBody, limit)
            async with leader_only("restart", service_id):
                result = await inference.restarter.restart(g.principal, service_id, body.revision)
        return jsonify(result)

    @route(app, "inference_replica_restart")
    async def inference_replica_restart(service_id: str, replica: int) -> Response:
        with _refusals("restart", service_id, replica):
            body = await read_json(RestartBody, limit)
            async with leader_only("restart", service_id):
                result = await inference.restarter.restart(
                    g.principal, service_id, body.revision, replica
                )
        return jsonify(result)

    @route(app, "inference_rollout")
    async def inference_rollout(service_id: str) -> tuple[Response, int]:
        with _refusals("rollout", service_id):
            body = await read_json(RolloutBody, limit)
            started = await inference.rollout(
                g.principal,
                service_id,
                body.revision,
                body.spec,
                strategy=body.strategy,
                keep_limits=body.keep_limits,
            )
        view = service_view(started.detail)
        view["rollout"] = rollout_view(started.rollout, started.detail.service)["rollout"]
        view["strategy"] = started.choice.to_json()
        view["adjusted_limits"] = list(started.adjusted)
        return jsonify(view), 202

    @route(app, "inference_rollout_status")
    async def inference_rollout_status(service_id: str) -> Response:
        return jsonify(await inference.rollout_status(g.principal.project_id, service_id))

    @route(app, "inference_rollout_preview")
    async def inference_rollout_preview(service_id: str) -> Response:
        with _refusals("rollout_preview", service_id):
            body = await read_json(RolloutPreviewBody, limit)
            preview, choice, adjusted = await inference.rollout_preview(
                g.principal,
                service_id,
                body.spec,
                strategy=body.strategy,
                keep_limits=body.keep_limits,
            )
        view = preview_view(preview)
        view["beside_serving"] = choice.beside.to_json()
        view["strategy"] = choice.to_json()
        view["adjusted_limits"] = adjusted
        return jsonify(view)
