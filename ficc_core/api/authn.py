"""Who sent a request: a bearer credential, or a browser session with its CSRF token.

The one set of rules for every route, the Quart application's and the invoke
handler's alike: an ``Authorization`` header must be ``Bearer <token>`` with a
project credential (a node credential is refused here); without one, the
``ficc_session`` cookie authenticates, and a request it authenticates to a route
that changes something (the route table's ``csrf``: every method other than GET,
HEAD or OPTIONS) must carry the CSRF token returned at login in ``X-CSRF-Token``.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from ..auth import secrets as sec
from ..base.errors import Forbidden, Unauthenticated
from ..contributors import is_node_token

if TYPE_CHECKING:
    from ..auth import AuthService, Principal

SESSION_COOKIE = "ficc_session"
CSRF_COOKIE = "ficc_csrf"
CSRF_HEADER = "X-CSRF-Token"


async def authenticate(
    auth: AuthService,
    *,
    check_csrf: bool,
    authorization: str | None,
    session: str | None,
    csrf: str,
) -> Principal:
    """The principal of a request, or raise the refusal (401, or 403 for a node credential
    or a missing CSRF token).

    :param check_csrf: a session must send its CSRF token (the route's
        :attr:`~ficc_core.api.access.Route.csrf`).
    :param authorization: the first ``Authorization`` header, or None.
    :param session: the ``ficc_session`` cookie, or None (only read without ``authorization``).
    :param csrf: the first ``X-CSRF-Token`` header, or ``""``.
    """
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated(
                "the Authorization header must be 'Bearer <token>'", code="invalid_credential"
            )
        if is_node_token(token):
            # A node credential connects its node and stages blobs, nothing else.
            raise Forbidden(
                "a node credential can only connect its node to /api/v1/contributors/connect "
                "and download blobs from /api/v1/contributors/blobs/<sha256>; "
                "use a project credential for management routes",
                code="node_credential_refused",
            )
        return await auth.authenticate_bearer(token)
    if session:
        principal = await auth.authenticate_session(session)
        if check_csrf and not (
            csrf and hmac.compare_digest(sec.hash_secret(csrf), principal.csrf_hash or "")
        ):
            raise Forbidden(
                f"a request authenticated by the session cookie must carry the {CSRF_HEADER} "
                "header returned at login",
                code="csrf_failed",
            )
        return principal
    raise Unauthenticated(
        "this route needs a credential: send 'Authorization: Bearer <token>' or log in",
        code="unauthenticated",
    )
