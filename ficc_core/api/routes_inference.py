"""``/api/v1/inference``: managed inference services (management routes).

Scopes follow the contract: reading needs ``inference:read``; preview
``inference:manage``; submit and replace also the contributor job scopes
(``jobs:execute``, ``contributors:read``, ``models:read``), as does ``start``;
``drain``, ``stop`` and ``remove`` need ``jobs:cancel``; issuing an invoke token
needs ``inference:manage``, ``inference:invoke`` and ``tokens:manage``.
Each control action is its own route so the scope table can name its scopes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from quart import Response, g, jsonify

from ..inference import CONTROL_ACTIONS
from ..inference.reconciliation.status import read_status
from ..schema import FieldError
from ..schema._convert import MAX_SAFE_INTEGER, integer
from .access import add_route, route
from .bodies import band_validator, query_number, read_json, read_json_object
from .views_auth import credential_view, issued_view, revocation_view
from .views_inference import preview_view, status_view, usage_view
from .views_inference import service_view as view_of_service

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service
    from ..inference import ServiceDetail


@attrs.frozen(kw_only=True)
class ControlBody:
    """``POST /inference/{id}/control/{action}``."""

    revision: int = integer(0, MAX_SAFE_INTEGER)
    acknowledge_unknown: bool = False


@attrs.frozen(kw_only=True)
class ReplaceBody:
    """``PUT /inference/{id}``: the revision read, and the new specification."""

    revision: int = integer(0, MAX_SAFE_INTEGER)
    spec: dict[str, Any]


def _positive_lifetime(_instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise FieldError(attribute.name, "must be a positive number of seconds")


@attrs.frozen(kw_only=True)
class TokenBody:
    """``POST /inference/{id}/tokens``: how long the invoke credential lives, in seconds;
    its name and priority band, optional."""

    lifetime: float = attrs.field(validator=_positive_lifetime)
    name: str | None = None
    band: str | None = attrs.field(default=None, validator=band_validator)


def register(app: QuartTrio, service: Service) -> None:
    """Add the inference management routes to ``app``."""
    inference = service.inference
    limit = service.config.max_body_bytes

    def service_view(detail: ServiceDetail) -> dict[str, Any]:
        return view_of_service(
            detail,
            service.config.replica_give_up_after,
            trouble=service.contributors.attempt_trouble,
        )

    @route(app, "inference_list")
    async def inference_list() -> Response:
        services = await inference.list(g.principal.project_id)
        return jsonify({"services": [service_view(detail) for detail in services]})

    @route(app, "inference_get")
    async def inference_get(service_id: str) -> Response:
        return jsonify(service_view(await inference.get(g.principal.project_id, service_id)))

    @route(app, "inference_usage")
    async def inference_usage(service_id: str) -> Response:
        since = query_number("since")  # seconds since the epoch
        summary = await inference.usage_summary(g.principal.project_id, service_id, since)
        return jsonify(usage_view(summary))

    @route(app, "inference_status")
    async def inference_status(service_id: str) -> Response:
        found = await read_status(
            inference, service.contributors, g.principal.project_id, service_id
        )
        return jsonify(status_view(found))

    @route(app, "inference_preview")
    async def inference_preview() -> Response:
        preview = await inference.preview(g.principal, await read_json_object(limit))
        return jsonify(preview_view(preview))

    @route(app, "inference_create")
    async def inference_create() -> tuple[Response, int]:
        created = await inference.create(g.principal, await read_json_object(limit))
        return jsonify(service_view(created)), 201

    @route(app, "inference_replace")
    async def inference_replace(service_id: str) -> Response:
        body = await read_json(ReplaceBody, limit)
        replaced = await inference.replace(g.principal, service_id, body.revision, body.spec)
        return jsonify(service_view(replaced))

    def control_route(action: str) -> None:
        async def control(service_id: str) -> Response:
            body = await read_json(ControlBody, limit)
            controlled = await inference.control(
                g.principal,
                service_id,
                action,
                revision=body.revision,
                acknowledge_unknown=body.acknowledge_unknown,
            )
            return jsonify(service_view(controlled))

        add_route(app, f"inference_control_{action}", control)

    for action in CONTROL_ACTIONS:
        control_route(action)

    @route(app, "inference_tokens_create")
    async def inference_tokens_create(service_id: str) -> tuple[Response, int]:
        body = await read_json(TokenBody, limit)
        record, token = await inference.create_token(
            g.principal, service_id, lifetime=body.lifetime, name=body.name, band=body.band
        )
        return jsonify(issued_view(record, token)), 201

    @route(app, "inference_tokens_list")
    async def inference_tokens_list(service_id: str) -> Response:
        tokens = await inference.list_tokens(g.principal, service_id)
        return jsonify({"tokens": [credential_view(token) for token in tokens]})

    @route(app, "inference_tokens_revoke")
    async def inference_tokens_revoke(service_id: str, token_id: str) -> Response:
        revocation = await inference.revoke_token(g.principal, service_id, token_id)
        return jsonify(revocation_view(revocation))
