"""The route-scope table: the one place every route declares who may call it.

Keys are Quart endpoint names. ``create_app`` refuses to start if a route is
missing here, and ``tests/test_route_scopes.py`` walks every registered route to
prove each refuses a request without a credential (401) and a credential that
lacks any one of its scopes (403).
"""

from __future__ import annotations

import attrs

from ..auth import scopes as s


@attrs.frozen
class Access:
    """Who may call a route: anyone, any authenticated principal, or holders of scopes.

    ``node`` routes skip bearer authentication: their handler accepts a node
    credential and nothing else (every other credential gets 401). They are the
    WebSocket agents dial and the blob download nodes stage inputs from.
    """

    public: bool = False
    scopes: frozenset[str] = frozenset()
    node: bool = False


PUBLIC = Access(public=True)
AUTHENTICATED = Access()
NODE = Access(public=True, node=True)


def needs(*scopes: str) -> Access:
    """Access for principals holding every one of ``scopes``."""
    return Access(scopes=frozenset(scopes))


#: Submitting, replacing or starting a service launches contributor jobs.
_START = (s.INFERENCE_MANAGE, s.JOBS_EXECUTE, s.CONTRIBUTORS_READ, s.MODELS_READ)

ROUTE_ACCESS: dict[str, Access] = {
    # system
    "health": PUBLIC,
    "metrics": PUBLIC,
    "whoami": AUTHENTICATED,
    # browser sessions
    "session_login": PUBLIC,
    "session_logout": AUTHENTICATED,
    # installation administration
    "projects_list": needs(s.ADMIN),
    "projects_create": needs(s.ADMIN),
    "users_list": needs(s.ADMIN),
    "users_create": needs(s.ADMIN),
    "users_set_membership": needs(s.ADMIN),
    # project credentials
    "tokens_list": needs(s.TOKENS_MANAGE),
    "tokens_create": needs(s.TOKENS_MANAGE),
    "tokens_get": needs(s.TOKENS_MANAGE),
    "tokens_revoke": needs(s.TOKENS_MANAGE),
    # the model registry
    "models_list": needs(s.MODELS_READ),
    "models_get": needs(s.MODELS_READ),
    "models_register": needs(s.MODELS_MANAGE),
    "models_acquire": needs(s.MODELS_MANAGE),
    "models_pause": needs(s.MODELS_MANAGE),
    "models_upload_chunk": needs(s.MODELS_MANAGE),
    "models_upload_bytes": needs(s.MODELS_MANAGE),
    "models_hub_preview": needs(s.MODELS_MANAGE),
    "models_delete": needs(s.MODELS_MANAGE),
    # contributor nodes
    "contributors_list": needs(s.CONTRIBUTORS_READ),
    "contributors_get": needs(s.CONTRIBUTORS_READ),
    # The WebSocket remote agents dial: a node credential, checked in its handler.
    "contributors_connect": NODE,
    # Verified model blobs, by digest, for nodes staging inputs: a node credential only.
    "contributors_blob": NODE,
    # managed inference services
    "inference_list": needs(s.INFERENCE_READ),
    "inference_get": needs(s.INFERENCE_READ),
    "inference_usage": needs(s.INFERENCE_READ),
    "inference_preview": needs(s.INFERENCE_MANAGE),
    "inference_create": needs(*_START),
    "inference_replace": needs(*_START),
    "inference_control_start": needs(*_START),
    "inference_control_drain": needs(s.INFERENCE_MANAGE, s.JOBS_CANCEL),
    "inference_control_stop": needs(s.INFERENCE_MANAGE, s.JOBS_CANCEL),
    "inference_control_remove": needs(s.INFERENCE_MANAGE, s.JOBS_CANCEL),
    "inference_tokens_create": needs(s.INFERENCE_MANAGE, s.INFERENCE_INVOKE, s.TOKENS_MANAGE),
    "inference_tokens_list": needs(s.INFERENCE_MANAGE, s.TOKENS_MANAGE),
    "inference_tokens_revoke": needs(s.INFERENCE_MANAGE, s.TOKENS_MANAGE),
    # the inference gateway (the gateway checks the service binding and the project)
    "invoke_models": needs(s.INFERENCE_INVOKE),
    "invoke_chat_completions": needs(s.INFERENCE_INVOKE),
    "invoke_embeddings": needs(s.INFERENCE_INVOKE),
}
