"""Bearer credentials of the caller's project (scope ``tokens:manage``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from quart import Response, g, jsonify

from ..auth.scopes import ADMIN
from .access import route
from .bodies import band_validator, lifetime_validator, name_validator, read_json
from .views_auth import credential_view, issued_view, revocation_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service


@attrs.frozen
class TokenBody:
    """``POST /api/v1/tokens``: a named credential with scopes, an optional lifetime (s)
    and an optional priority band; ``lasting`` (a browser session's key only) outlives
    the session that makes it."""

    name: str = attrs.field(validator=name_validator)
    scopes: list[str]
    lifetime: float | None = attrs.field(default=None, validator=lifetime_validator)
    band: str | None = attrs.field(default=None, validator=band_validator)
    lasting: bool = False


def register(app: QuartTrio, service: Service) -> None:
    """Add the credential routes to ``app``."""

    # Credentials holding ``admin`` are the installation's, not the project's: a token
    # manager without ``admin`` neither sees nor revokes them.
    def installation() -> bool:
        return ADMIN in g.principal.scopes

    @route(app, "tokens_list")
    async def tokens_list() -> Response:
        tokens = await service.auth.list_credentials(
            g.principal.project_id, installation=installation()
        )
        return jsonify({"tokens": [credential_view(token) for token in tokens]})

    @route(app, "tokens_create")
    async def tokens_create() -> tuple[Response, int]:
        body = await read_json(TokenBody, service.config.max_body_bytes)
        principal = g.principal
        credential, token = await service.auth.create_credential(
            principal.project_id,
            name=body.name,
            scopes=frozenset(body.scopes),
            user_id=principal.user_id,
            lifetime=body.lifetime,
            issuer=principal,
            band=body.band,
            lasting=body.lasting,
        )
        return jsonify(issued_view(credential, token)), 201

    # ``token_id`` is the credential's ID or its name (unique among the live ones).
    @route(app, "tokens_get")
    async def tokens_get(token_id: str) -> Response:
        credential = await service.auth.get_credential(
            g.principal.project_id, token_id, installation=installation()
        )
        return jsonify(credential_view(credential))

    @route(app, "tokens_revoke")
    async def tokens_revoke(token_id: str) -> Response:
        revocation = await service.auth.revoke_credential(
            g.principal.project_id, token_id, installation=installation()
        )
        return jsonify(revocation_view(revocation))
