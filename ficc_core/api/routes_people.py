"""People: signup, approval and password resets, personal keys, services shared with people.

``POST /api/v1/signup`` is public (404 ``signup_closed`` unless ``signup_open``);
approval and resets are the administrator's; ``/api/v1/me/tokens`` is a person's own
(a browser session, or a credential of theirs that is not a personal key); shares
are managed with ``inference:manage`` in the service's project (docs/people.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
from quart import Response, g, jsonify, request

from .. import inference
from ..inference.errors import service_not_found
from ..inference.specification.transitions import writable
from ..schema import FieldError
from ..store import Transaction
from .access import route
from .bodies import lifetime_validator, name_validator, read_json
from .views_auth import credential_view, issued_view, revocation_view, shares_view, user_view

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ..controller.service import Service

#: People one ``PUT .../shares`` names at most.
MAX_SHARED_USERS = 1000


@attrs.frozen
class SignupBody:
    """``POST /api/v1/signup``: the name and password of a new, pending account."""

    username: str = attrs.field(validator=name_validator)
    password: str


@attrs.frozen
class PasswordBody:
    """``PUT /api/v1/users/{id}/password``: the user's new password."""

    password: str


@attrs.frozen
class PersonalTokenBody:
    """``POST /api/v1/me/tokens``: a personal key's name and lifetime (seconds, optional)."""

    name: str = attrs.field(validator=name_validator)
    lifetime: float | None = attrs.field(default=None, validator=lifetime_validator)


def _users(_instance: Any, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    if len(value) > MAX_SHARED_USERS:
        raise FieldError(attribute.name, f"at most {MAX_SHARED_USERS} users")
    if any(not user or len(user) > 64 for user in value):
        raise FieldError(attribute.name, "each is a username or user ID (1 to 64 characters)")


@attrs.frozen
class SharesBody:
    """``PUT /api/v1/inference/{id}/shares``: exactly who the service is shared with."""

    # A tuple: the converter takes only a JSON array for it (a string is not a list).
    users: tuple[str, ...] = attrs.field(default=(), validator=_users)
    everyone: bool = False


def _in_project(project_id: str, service_id: str) -> Callable[[Transaction], None]:
    """The check that ``service_id`` is a service of the project (else 404)."""

    def check(tx: Transaction) -> None:
        record = inference.service(tx, service_id)
        if record is None or record.project_id != project_id:
            raise service_not_found(service_id)

    return check


def register(app: QuartTrio, service: Service) -> None:
    """Add the people routes to ``app``."""
    people = service.auth.people
    limit = service.config.max_body_bytes

    @route(app, "signup")
    async def signup() -> tuple[Response, int]:
        people.require_signup_open()  # before reading the body
        body = await read_json(SignupBody, limit)
        user = await people.signup(body.username, body.password, address=request.remote_addr or "")
        return jsonify(user_view(user)), 201

    @route(app, "users_approve")
    async def users_approve(user_id: str) -> Response:
        return jsonify(user_view(await people.approve(user_id)))

    @route(app, "users_set_password")
    async def users_set_password(user_id: str) -> Response:
        body = await read_json(PasswordBody, limit)
        user, ended = await people.reset_password(user_id, body.password)
        return jsonify({**user_view(user), "sessions_ended": ended})

    @route(app, "me_tokens_list")
    async def me_tokens_list() -> Response:
        tokens = await people.list_keys(g.principal)
        return jsonify({"tokens": [credential_view(token) for token in tokens]})

    @route(app, "me_tokens_create")
    async def me_tokens_create() -> tuple[Response, int]:
        people.person(g.principal)
        body = await read_json(PersonalTokenBody, limit)
        credential, token = await people.create_key(
            g.principal, name=body.name, lifetime=body.lifetime
        )
        return jsonify(issued_view(credential, token)), 201

    @route(app, "me_tokens_revoke")
    async def me_tokens_revoke(token_id: str) -> Response:
        return jsonify(revocation_view(await people.revoke_key(g.principal, token_id)))

    @route(app, "inference_shares_get")
    async def inference_shares_get(service_id: str) -> Response:
        check = _in_project(g.principal.project_id, service_id)
        return jsonify(shares_view(await people.shares(service_id, check_service=check)))

    @route(app, "inference_shares_set")
    async def inference_shares_set(service_id: str) -> Response:
        body = await read_json(SharesBody, limit)
        project_id = g.principal.project_id
        shares = await people.set_shares(
            service_id,
            body.users,
            body.everyone,
            # Not one being removed (409 service_removing): its shares go with it.
            check_service=lambda tx: writable(tx, project_id, service_id),
        )
        return jsonify(shares_view(shares))
