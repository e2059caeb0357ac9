"""``/api/v1/models``: the model registry (scopes ``models:read`` and ``models:manage``)."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

import attrs
from quart import Response, g, jsonify, request

from ..base.errors import FiccError, InvalidRequest
from ..models.registry import MAX_BYTES_CHUNK, MAX_JSON_CHUNK
from ..schema import ModelManifest
from ..schema._convert import MAX_LENGTH, MAX_SAFE_INTEGER, integer
from .access import route
from .bodies import query_integer, read_body, read_json
from .views_models import deletion_view, model_detail_view, model_file_view, model_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service

# Base64 of 1 MiB plus room for the JSON around it.
_JSON_CHUNK_BODY = (MAX_JSON_CHUNK + 2) // 3 * 4 + 1024


# Keyword-only: ``integer`` declares a field without a default, which type checkers
# cannot see (they would take ``offset`` for a field with one before ``data``).
@attrs.frozen(kw_only=True)
class ChunkBody:
    """``POST /models/{id}/files/{index}``: ``data`` is canonical base64 of at most 1 MiB."""

    offset: int = integer(0, MAX_SAFE_INTEGER)
    data: str = attrs.field(metadata={MAX_LENGTH: _JSON_CHUNK_BODY})


@attrs.frozen
class HubPreviewBody:
    """``POST /models/hub-preview``."""

    repository: str
    revision: str = "main"
    filename: str | None = None
    licence: str | None = None


def decode_canonical_base64(text: str) -> bytes:
    """Decode standard, padded base64 with no whitespace; refuse every other spelling."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        data = None
    if data is None or base64.b64encode(data).decode("ascii") != text:
        raise InvalidRequest(
            "data must be canonical base64: standard alphabet, '=' padding, no whitespace, "
            "and no non-zero padding bits",
            code="invalid_base64",
            details={"errors": [{"path": "$.data", "message": "not canonical base64"}]},
        )
    if len(data) > MAX_JSON_CHUNK:
        raise FiccError(
            f"a chunk decodes to {len(data)} bytes; at most {MAX_JSON_CHUNK} are accepted",
            code="payload_too_large",
            status=413,
            details={"limit": MAX_JSON_CHUNK},
        )
    return data


def register(app: QuartTrio, service: Service) -> None:
    """Add the model registry routes to ``app``."""
    models = service.models
    limit = service.config.max_body_bytes

    @route(app, "models_list")
    async def models_list() -> Response:
        listed = await models.list(g.principal.project_id)
        return jsonify({"models": [model_view(model) for model in listed]})

    @route(app, "models_get")
    async def models_get(model_id: str) -> Response:
        model = await models.get(g.principal.project_id, model_id)
        metadata = await models.metadata(model)
        return jsonify(model_detail_view(model, metadata, models.header_problem(model)))

    @route(app, "models_register")
    async def models_register() -> tuple[Response, int]:
        manifest = await read_json(ModelManifest, limit)
        model, created = await models.register(g.principal.project_id, manifest)
        return jsonify(model_view(model)), 201 if created else 200

    @route(app, "models_acquire")
    async def models_acquire(model_id: str) -> tuple[Response, int]:
        # The acquisition workers run on the leader alone (docs/operations.md); another
        # project's model is a 404 first.
        await models.get(g.principal.project_id, model_id)
        service.lease.require_leader("acquire")
        return jsonify(model_view(await models.acquire(g.principal.project_id, model_id))), 202

    @route(app, "models_pause")
    async def models_pause(model_id: str) -> Response:
        await models.get(g.principal.project_id, model_id)
        service.lease.require_leader("pause")
        return jsonify(model_view(await models.pause(g.principal.project_id, model_id)))

    @route(app, "models_upload_chunk")
    async def models_upload_chunk(model_id: str, index: int) -> Response:
        await models.upload_target(g.principal.project_id, model_id, index)
        body = await read_json(ChunkBody, _JSON_CHUNK_BODY)
        data = decode_canonical_base64(body.data)
        file = await models.upload(g.principal.project_id, model_id, index, body.offset, data)
        return jsonify(model_file_view(file))

    @route(app, "models_upload_bytes")
    async def models_upload_bytes(model_id: str, index: int) -> Response:
        if request.mimetype != "application/octet-stream":
            raise FiccError(
                "this route takes application/octet-stream",
                code="unsupported_media_type",
                status=415,
            )
        offset = query_integer("offset")
        project_id = g.principal.project_id
        await models.upload_target(project_id, model_id, index)
        async with models.upload_slot(project_id):
            data = await read_body(MAX_BYTES_CHUNK, idle=service.config.upload_idle_timeout)
            file = await models.upload(project_id, model_id, index, offset, data)
            return jsonify(model_file_view(file))

    @route(app, "models_hub_preview")
    async def models_hub_preview() -> Response:
        body = await read_json(HubPreviewBody, limit)
        previews = await service.hub_preview(
            body.repository, body.revision, filename=body.filename, licence=body.licence
        )
        return jsonify({"previews": [preview.to_json() for preview in previews]})

    @route(app, "models_delete")
    async def models_delete(model_id: str) -> Response:
        evict = request.args.get("evict", "false").lower()
        if evict not in ("true", "false", "1", "0"):
            raise InvalidRequest("evict must be true or false", code="invalid_request")
        deletion = await models.delete(
            g.principal.project_id, model_id, evict=evict in ("true", "1")
        )
        return jsonify(deletion_view(deletion))
