"""The route table: the one place every route is declared, with who may call it.

Keys are Quart endpoint names; each entry declares the route's method, its path (the
Quart rule), who may call it, whether a browser session must send its CSRF token, and
what it answers. The routers register their views from it (:func:`route`,
:func:`add_route`: a view names its endpoint, never its method or path), so a route
cannot exist without its access rule; ``create_app`` refuses to start if one was
registered around the table; ``python -m ficc_core.devtools.docs_routes`` renders it
as the route table of ``docs/api.md``; and ``tests/api/test_route_scopes.py`` walks
every registered route to prove each refuses a request without a credential (401)
and a credential that lacks any one of its scopes (403).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from ..auth import scopes as s

if TYPE_CHECKING:
    from quart_trio import QuartTrio

View = TypeVar("View", bound=Callable[..., Awaitable[Any]])

#: Methods a browser session may use without its CSRF token: they change nothing.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@attrs.frozen
class Access:
    """Who may call a route: anyone, any authenticated principal, or holders of scopes.

    ``node`` routes skip bearer authentication: their handler accepts a node
    credential and nothing else (every other credential gets 401). They are the
    WebSocket agents dial and the blob download nodes stage inputs from.

    ``ticket`` routes skip it too: their handler accepts a single-use ticket in the
    query (:mod:`ficc_core.auth.tickets`), minted by a route that holds ``scopes``,
    and nothing else (a bearer credential alone gets 401), so a stream a browser
    opens from a URL never carries a long-lived credential.
    """

    public: bool = False
    scopes: frozenset[str] = frozenset()
    node: bool = False
    ticket: bool = False
    #: A request its browser session authenticates must carry the session's CSRF token
    #: (set from the route's :attr:`Route.csrf` in :data:`ROUTE_ACCESS`).
    csrf: bool = False


PUBLIC = Access(public=True)
AUTHENTICATED = Access()
NODE = Access(public=True, node=True)
TICKET = Access(public=True, ticket=True)


def needs(*scopes: str) -> Access:
    """Access for principals holding every one of ``scopes``."""
    return Access(scopes=frozenset(scopes))


# A placeholder's name as docs/api.md shows it: an ID is ``{id}`` (the first in a path).
_SHOWN = {"replica": "n"}
_PLACEHOLDER = re.compile(r"<(?:[^:>]+:)?([^>]+)>")


def _shown(rule: str) -> str:
    """``rule`` as docs/api.md writes it: ``/api/v1/inference/{id}/replicas/{n}/logs``."""
    used: set[str] = set()

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        shown = "id" if name.endswith("_id") else _SHOWN.get(name, name)
        if shown in used:
            shown = name
        used.add(shown)
        return "{" + shown + "}"

    return _PLACEHOLDER.sub(one, rule)


@attrs.frozen
class Route:
    """One route: its method, its path, who may call it, and what it answers.

    :ivar rule: the path as Quart's URL map takes it (``/api/v1/models/<model_id>``).
    :ivar access_text: replaces the rendered access where scopes alone say too little.
    :ivar query: the query the docs show after the path (``?since=``); routing ignores it.
    :ivar websocket: a WebSocket route (its method is ``GET``).
    :ivar csrf: a browser session must send its CSRF token (every method that is not
        safe: :data:`SAFE_METHODS`).
    """

    method: str
    rule: str
    access: Access
    result: str
    access_text: str = ""
    query: str = ""
    websocket: bool = False
    csrf: bool = attrs.field(
        default=attrs.Factory(lambda self: self.method not in SAFE_METHODS, takes_self=True)
    )

    @property
    def path(self) -> str:
        """The route as docs/api.md shows it: ``{name}`` placeholders, then any query."""
        return _shown(self.rule) + self.query


#: Submitting, replacing or starting a service launches contributor jobs.
_START = (s.INFERENCE_MANAGE, s.JOBS_EXECUTE, s.CONTRIBUTORS_READ, s.MODELS_READ)

ROUTES: dict[str, Route] = {
    # system
    "health": Route(
        "GET",
        "/api/v1/health",
        PUBLIC,
        '`{"status": "ok", "version": ..., "time": <the controller\'s clock, epoch seconds>}`',
    ),
    "metrics": Route(
        "GET",
        "/metrics",
        PUBLIC,
        "Prometheus text, service and attempt IDs included; with `metrics_listen` set it "
        "moves to that listener alone (404 here) — see "
        "[architecture.md](architecture.md#metrics)",
    ),
    "whoami": Route(
        "GET", "/api/v1/whoami", AUTHENTICATED, "kind, id, user, project, scopes, expiry"
    ),
    "system_controllers": Route(
        "GET",
        "/api/v1/system/controllers",
        needs(s.ADMIN),
        "the controllers sharing the store: `this` (`id`, `role`, `term`), `leader` (`id`, "
        "`url`, `term`, `acquired_at`, `expires_at`) or null, `term`, `lease_expires_at`, "
        "and `controllers` (each `id`, `url`, `role`, `term`, `started_at`, `seen_at`) — "
        "see [operations.md](operations.md#several-controllers)",
    ),
    # browser sessions
    "session_login": Route(
        "POST",
        "/api/v1/session",
        PUBLIC,
        "`{username, password, project?}` → session cookie + `csrf_token` (no project: "
        "a [personal session](people.md#personal-sessions)); 403 `account_pending` "
        "(after a right password); 429 `login_throttled` past the "
        "[login limits](#browser-sessions)",
    ),
    "session_logout": Route(
        "DELETE",
        "/api/v1/session",
        AUTHENTICATED,
        "log out (clears the cookies; revokes what the session minted)",
    ),
    # installation administration
    "projects_list": Route("GET", "/api/v1/projects", needs(s.ADMIN), "every project"),
    "projects_create": Route(
        "POST",
        "/api/v1/projects",
        needs(s.ADMIN),
        "`{name}` → 201; a taken name is 409 `project_exists`",
    ),
    "projects_set_band": Route(
        "PUT",
        "/api/v1/projects/<project>/band",
        needs(s.ADMIN),
        "`{band}` (a band name, or null) sets the priority band of the project's "
        "credentials that name none ([bands](priority.md)); an unknown one is 400 "
        "`unknown_band`",
    ),
    "users_list": Route(
        "GET",
        "/api/v1/users",
        needs(s.ADMIN),
        "users with their project scopes (never password hashes)",
    ),
    "users_create": Route(
        "POST",
        "/api/v1/users",
        needs(s.ADMIN),
        "`{username, password, admin?, projects?: {project: [scopes]}}`",
    ),
    "users_set_membership": Route(
        "PUT",
        "/api/v1/users/<user_id>/projects/<project>",
        needs(s.ADMIN),
        "`{scopes}` sets the user's scopes there (empty removes)",
    ),
    # rate limits and budgets (docs/limits.md)
    "projects_limits": Route(
        "GET",
        "/api/v1/projects/<project>/limits",
        needs(s.ADMIN),
        "the project's [limits](limits.md) `{rpm, tpm, budget, period}` and its use (requests "
        "and tokens this minute, spend this period)",
    ),
    "projects_set_limits": Route(
        "PUT",
        "/api/v1/projects/<project>/limits",
        needs(s.ADMIN),
        "`{rpm?, tpm?, budget?, period?}` (absent stays, null clears) → the limits and use; "
        "a bad field is 400 with `details.errors`",
    ),
    "users_limits": Route(
        "GET", "/api/v1/users/<user_id>/limits", needs(s.ADMIN), "a person's limits and use"
    ),
    "users_set_limits": Route(
        "PUT",
        "/api/v1/users/<user_id>/limits",
        needs(s.ADMIN),
        "`{rpm?, tpm?, budget?, period?}` for all the person's keys",
    ),
    "tokens_limits": Route(
        "GET",
        "/api/v1/tokens/<token_id>/limits",
        needs(s.TOKENS_MANAGE),
        "a credential's limits and use (by ID or name); another project's is 404",
    ),
    "tokens_set_limits": Route(
        "PUT",
        "/api/v1/tokens/<token_id>/limits",
        needs(s.TOKENS_MANAGE),
        "`{rpm?, tpm?, budget?, period?}` for this credential; another project's is 404",
    ),
    # people (docs/people.md)
    "signup": Route(
        "POST",
        "/api/v1/signup",
        PUBLIC,
        "`{username, password}` → 201, a `pending` account; 404 `signup_closed` unless "
        "`signup_open`; 409 `user_exists`; 429 `signup_throttled`",
    ),
    "users_approve": Route(
        "POST",
        "/api/v1/users/<user_id>/approve",
        needs(s.ADMIN),
        "activates a pending account (id or username)",
    ),
    "users_set_password": Route(
        "PUT",
        "/api/v1/users/<user_id>/password",
        needs(s.ADMIN),
        "`{password}` replaces it and ends the user's browser sessions (`sessions_ended`)",
    ),
    "me_tokens_list": Route(
        "GET",
        "/api/v1/me/tokens",
        AUTHENTICATED,
        "the caller's personal keys (no secrets)",
        "a person (not a personal key)",
    ),
    "me_tokens_create": Route(
        "POST",
        "/api/v1/me/tokens",
        AUTHENTICATED,
        "`{name, lifetime?}` → 201 `{credential, token}`: a personal key, `inference:invoke` "
        "only, outside any project; 403 `personal_disabled`",
        "a person (not a personal key)",
    ),
    "me_tokens_revoke": Route(
        "DELETE",
        "/api/v1/me/tokens/<token_id>",
        AUTHENTICATED,
        "revoke one of the caller's personal keys, by ID or name (another's is 404)",
        "a person (not a personal key)",
    ),
    # project credentials
    "tokens_list": Route(
        "GET",
        "/api/v1/tokens",
        needs(s.TOKENS_MANAGE),
        "the project's credentials (no secrets; those holding `admin` only for `admin`)",
    ),
    "tokens_create": Route(
        "POST",
        "/api/v1/tokens",
        needs(s.TOKENS_MANAGE),
        "`{name, scopes, lifetime?, band?, lasting?}` (seconds; capped, see "
        "[lifetimes](#lifetimes-and-issuers); a band not above yours, see "
        "[bands](#priority-bands); `lasting`: a session's key that outlives it) → 201 "
        "`{credential, token}`; a name a live credential of the project has is 409 "
        "`credential_name_taken`",
    ),
    "tokens_get": Route(
        "GET",
        "/api/v1/tokens/<token_id>",
        needs(s.TOKENS_MANAGE),
        "one credential, by ID or name; another project's is 404",
    ),
    "tokens_revoke": Route(
        "DELETE",
        "/api/v1/tokens/<token_id>",
        needs(s.TOKENS_MANAGE),
        "revoke it (by ID or name) and what it minted (`also_revoked`); effective on the "
        "next request (and on streams in flight)",
    ),
    # the model registry
    "models_list": Route(
        "GET",
        "/api/v1/models",
        needs(s.MODELS_READ),
        "the project's models with per-file state and progress",
    ),
    "models_get": Route("GET", "/api/v1/models/<model_id>", needs(s.MODELS_READ), "one model"),
    "models_register": Route(
        "POST",
        "/api/v1/models",
        needs(s.MODELS_MANAGE),
        "register a manifest (201, or 200 for an equal one)",
    ),
    "models_acquire": Route(
        "POST",
        "/api/v1/models/<model_id>/acquire",
        needs(s.MODELS_MANAGE),
        "start/resume HTTPS acquisition (202); 409/503 `not_leader` on a standby",
    ),
    "models_pause": Route(
        "POST",
        "/api/v1/models/<model_id>/pause",
        needs(s.MODELS_MANAGE),
        "pause it, keeping durable offsets; 409/503 `not_leader` on a standby",
    ),
    "models_upload_chunk": Route(
        "POST",
        "/api/v1/models/<model_id>/files/<int:index>",
        needs(s.MODELS_MANAGE),
        "`{offset, data}` canonical base64, at most 1 MiB decoded",
    ),
    "models_upload_bytes": Route(
        "POST",
        "/api/v1/models/<model_id>/files/<int:index>/bytes",
        needs(s.MODELS_MANAGE),
        "octet-stream, at most 16 MiB, two at once",
        query="?offset=N",
    ),
    "models_hub_preview": Route(
        "POST",
        "/api/v1/models/hub-preview",
        needs(s.MODELS_MANAGE),
        "`{repository, revision, filename?, licence?}` → manifests, no weights",
    ),
    "models_delete": Route(
        "DELETE",
        "/api/v1/models/<model_id>",
        needs(s.MODELS_MANAGE),
        "delete metadata, optionally unshared content",
        query="?evict=true",
    ),
    # contributor nodes
    "contributors_list": Route(
        "GET",
        "/api/v1/contributors",
        needs(s.CONTRIBUTORS_READ),
        "every node: state, last heartbeat, snapshot, reservations, attempts",
    ),
    "contributors_get": Route(
        "GET",
        "/api/v1/contributors/<node_id>",
        needs(s.CONTRIBUTORS_READ),
        "one node; an unknown one is 404 `node_not_found`",
    ),
    "contributors_doctor": Route(
        "GET",
        "/api/v1/contributors/<node_id>/doctor",
        needs(s.CONTRIBUTORS_READ),
        "the node's own `ficc doctor` checks, asked over its link, with its clock against "
        "this controller's: `{node, findings: [{check, status, message, fix?}], ok}`; 502 "
        "`node_unavailable` when it is not connected here",
    ),
    "contributors_remove": Route(
        "DELETE",
        "/api/v1/contributors/<node_id>",
        needs(s.ADMIN),
        "remove a lost, revoked or never-connected node: record, credential, assignments, "
        "reported attempts; 409 `node_connected` (connected or unreachable), 409 "
        "`node_has_replicas` with `{service_id, alias, replica}` while a service names it",
    ),
    # The WebSocket remote agents dial: a node credential, checked in its handler.
    "contributors_connect": Route(
        "GET",
        "/api/v1/contributors/connect",
        NODE,
        "(WebSocket) where `ficc executor` dials in; any other credential is 401",
        websocket=True,
    ),
    # Verified model blobs, by digest, for nodes staging inputs: a node credential only.
    "contributors_blob": Route(
        "GET",
        "/api/v1/contributors/blobs/<sha256>",
        NODE,
        "a verified blob that is an input of an attempt assigned to the credential's node, "
        "while it is assigned, for [input staging](agents.md#input-staging); "
        "`Range: bytes=N-` gives 206, a start past the end 416; any other digest (unknown, "
        "unverified, unreferenced, another node's or project's, a stopped attempt's) is the "
        "same 404 `blob_unknown`; any other credential is 401",
    ),
    # managed inference services
    "inference_list": Route(
        "GET",
        "/api/v1/inference",
        needs(s.INFERENCE_READ),
        "the project's services: specification, revision, generation, state, replicas",
    ),
    "inference_get": Route(
        "GET",
        "/api/v1/inference/<service_id>",
        needs(s.INFERENCE_READ),
        "one service; another project's is 404 `service_not_found`",
    ),
    "inference_usage": Route(
        "GET",
        "/api/v1/inference/<service_id>/usage",
        needs(s.INFERENCE_READ),
        "tokens, spend and latency of its invoke requests: totals, per credential, the "
        "latest; spend as `spend` and `spend_milli` (`cost`, the same milli-units, is "
        "deprecated; see [usage.md](usage.md#reading-usage))",
        query="?since=",
    ),
    "usage_report": Route(
        "GET",
        "/api/v1/usage",
        needs(s.INFERENCE_READ),
        "requests, errors by code (429s included), prompt and completion tokens, spend and "
        "latency percentiles, in total and per group, names beside IDs; an administrator "
        "sees every project's, a project principal its own; a filter naming nothing "
        "the caller can see is 404 (`service_not_found`, `model_not_found`, ...); a "
        "person's personal usage is "
        "`/api/v1/me/usage` (see [usage.md](usage.md#reading-usage))",
        query="?service=&key=&person=&project=&model=&since=&until=&period=&group_by=",
    ),
    "me_usage": Route(
        "GET",
        "/api/v1/me/usage",
        AUTHENTICATED,
        "the caller's person's personal usage (their personal keys' requests), in the "
        "fields of `/api/v1/usage`; a credential of no person is 403 `no_person`",
        "a person (a personal key included)",
        query="?service=&key=&model=&since=&until=&period=&group_by=",
    ),
    "inference_status": Route(
        "GET",
        "/api/v1/inference/<service_id>/status",
        needs(s.INFERENCE_READ),
        "each replica's status: state, node (its state, heartbeat age, connected here), "
        "attempt, engine PID, started and ready times, restarts, last exit (code, signal, "
        "`memory_limit`, reason), the readiness probe's last answer, in-flight requests; "
        "another project's is 404 `service_not_found`",
    ),
    "inference_preview": Route(
        "POST",
        "/api/v1/inference/preview",
        needs(s.INFERENCE_MANAGE),
        "a specification (or a partial one) → the completed specification, planned "
        "reservations per node and device, plan digest, reasons, suggested paths, warnings; "
        "writes nothing",
    ),
    "inference_create": Route(
        "POST",
        "/api/v1/inference",
        needs(*_START),
        "submit: service, replicas and reservations in one transaction (201; 409 "
        "`placement_failed`)",
    ),
    "inference_replace": Route(
        "PUT",
        "/api/v1/inference/<service_id>",
        needs(*_START),
        "`{revision, spec}` replaces a stopped service and starts its next generation",
    ),
    "inference_control_start": Route(
        "POST",
        "/api/v1/inference/<service_id>/control/start",
        needs(*_START),
        "`{revision, acknowledge_unknown?}`",
    ),
    **{
        f"inference_control_{action}": Route(
            "POST",
            f"/api/v1/inference/<service_id>/control/{action}",
            needs(s.INFERENCE_MANAGE, s.JOBS_CANCEL),
            "`{revision}`",
        )
        for action in ("drain", "stop", "remove")
    },
    "inference_tokens_create": Route(
        "POST",
        "/api/v1/inference/<service_id>/tokens",
        needs(s.INFERENCE_MANAGE, s.INFERENCE_INVOKE, s.TOKENS_MANAGE),
        "`{lifetime, name?, band?}` → 201 `{credential, token}` bound to the service",
    ),
    "inference_tokens_list": Route(
        "GET",
        "/api/v1/inference/<service_id>/tokens",
        needs(s.INFERENCE_MANAGE, s.TOKENS_MANAGE),
        "the service's invoke credentials (no secrets)",
    ),
    "inference_tokens_revoke": Route(
        "DELETE",
        "/api/v1/inference/<service_id>/tokens/<token_id>",
        needs(s.INFERENCE_MANAGE, s.TOKENS_MANAGE),
        "revoke (`token_id`: its ID or name); in-flight requests end too",
    ),
    "inference_shares_get": Route(
        "GET",
        "/api/v1/inference/<service_id>/shares",
        needs(s.INFERENCE_MANAGE),
        "`{service_id, users: [{id, username}], everyone}`: the people whose personal keys "
        "may invoke it",
    ),
    "inference_shares_set": Route(
        "PUT",
        "/api/v1/inference/<service_id>/shares",
        needs(s.INFERENCE_MANAGE),
        "`{users: [names or ids], everyone}` shares it with exactly those people's "
        "[personal keys](people.md#sharing); an unknown user is 400 `unknown_user`",
    ),
    # operations on running services (extensions beside the contract's routes)
    "inference_move": Route(
        "POST",
        "/api/v1/inference/<service_id>/replicas/<int:replica>/move",
        needs(*_START),
        "`{target_node_id, target_gpu_index?, start_after_move?, revision?}` → `{final_state, "
        "from_node, to_node, steps[]}`: moves replica n to another node without an outage; "
        "400 same or unknown target, 422 `over_subscribed_target`, `tier_mismatch`, "
        "`nothing_to_do`; 409/503 `not_leader` on a standby "
        "([several controllers](operations.md#several-controllers))",
    ),
    "inference_bulk_move": Route(
        "POST",
        "/api/v1/inference/bulk-move",
        needs(*_START),
        "`{replicas: [{service_id, replica}] (1 to 50), target_node_id, target_gpu_index?, "
        "start_after_move?}` → `{total, moved_count, failed_count, items[]}`, one after the "
        "other; 409/503 `not_leader` on a standby",
    ),
    "inference_restart": Route(
        "POST",
        "/api/v1/inference/<service_id>/restart",
        needs(*_START),
        "`{revision}`: every replica in turn, each replaced once its successor is ready "
        "(never below one ready replica of two or more) → `{restarted, replicas[]}`; 422 "
        "`nothing_to_do` when it is not running; 409/503 `not_leader` on a standby",
    ),
    "inference_replica_restart": Route(
        "POST",
        "/api/v1/inference/<service_id>/replicas/<int:replica>/restart",
        needs(*_START),
        "`{revision}`: replica n drains, stops and starts again → `{restarted, replicas[]}`; "
        "409/503 `not_leader` on a standby",
    ),
    "inference_pin": Route(
        "POST",
        "/api/v1/inference/<service_id>/pin",
        needs(*_START),
        "`{revision?}`: a scaled service is never scaled to zero (an idle one wakes now) → "
        "the service; 422 `not_scaled` without `scaling` "
        "([scaling](inference.md#scaling-and-on-demand-services)); 409/503 `not_leader` on a "
        "standby",
    ),
    "inference_unpin": Route(
        "POST",
        "/api/v1/inference/<service_id>/unpin",
        needs(*_START),
        "`{revision?}`: it may be scaled to zero again after its idle timeout → the service; "
        "409/503 `not_leader` on a standby",
    ),
    "inference_rollout": Route(
        "POST",
        "/api/v1/inference/<service_id>/rollout",
        needs(*_START),
        "`{revision, spec, strategy?, keep_limits?}` for a running service: 202, its next "
        "generation starts by `strategy` (`auto`, `surge`: beside the serving one; "
        "`rolling`, `recreate`: in place) and takes the traffic once every replica is "
        "ready; a scale-down is applied at once (409 `placement_failed` naming the "
        "strategies that would fit when the one asked for does not)",
    ),
    "inference_rollout_status": Route(
        "GET",
        "/api/v1/inference/<service_id>/rollout",
        needs(s.INFERENCE_READ),
        "`{generation, pending, rollout, state, reason, revision}`",
    ),
    "inference_rollout_preview": Route(
        "POST",
        "/api/v1/inference/<service_id>/rollout/preview",
        needs(s.INFERENCE_MANAGE),
        "`{spec, strategy?, keep_limits?}` → the preview of the next generation serving "
        "alone (the service's own reservations not counted), `beside_serving`, the plan "
        "while both run, `strategy` (chosen, capacity, downtime) and `adjusted_limits`",
    ),
    "inference_events": Route(
        "GET",
        "/api/v1/inference/<service_id>/events",
        needs(s.INFERENCE_READ),
        "what happened to the service, its replicas and attempts, and the nodes they ran "
        "on, oldest first: the newest `limit` (default 100, at most 500), the first "
        "`limit` after event `after` (`next_after` reads on), or the newest `limit` "
        "before event `before` (pages back)",
        query="?after=&before=&limit=",
    ),
    "inference_logs": Route(
        "GET",
        "/api/v1/inference/<service_id>/replicas/<int:replica>/logs",
        needs(s.INFERENCE_READ),
        "the last `tail` (1..1000, default 100) lines of replica `n`'s latest attempt's "
        "engine log, from its node: `{lines, attempt_id, attempt_state, node_id, ...}`; an "
        "unknown replica is 404 `replica_not_found`, one never started 422 "
        "`replica_not_started`",
        query="?tail=N",
    ),
    "inference_logs_ticket": Route(
        "POST",
        "/api/v1/inference/<service_id>/replicas/<int:replica>/logs/ticket",
        needs(s.INFERENCE_READ),
        "`{ticket, expires_at}`: a single-use ticket for that replica's log stream, valid "
        "60 s, bound to the caller (revoking it invalidates the ticket)",
    ),
    "inference_logs_stream": Route(
        "GET",
        "/api/v1/inference/<service_id>/replicas/<int:replica>/logs/stream",
        TICKET,
        "`text/event-stream`: the last `tail` lines (default 100), then new ones, one per "
        "`data:` event; a `: keepalive` comment every `log_keepalive`; `event: end` when "
        "the attempt ends; a missing, used, expired or foreign ticket is 401 "
        "`ticket_invalid`",
        "a ticket from `.../logs/ticket` only",
        query="?ticket=T&tail=N",
    ),
    # the inference gateway (the gateway checks the service binding and the project)
    "invoke_models": Route(
        "GET",
        "/api/v1/inference/<service_id>/v1/models",
        needs(s.INFERENCE_INVOKE),
        "the service's model (its alias)",
        "`inference:invoke` for this service",
    ),
    "invoke_model": Route(
        "GET",
        "/api/v1/inference/<service_id>/v1/models/<path:model>",
        needs(s.INFERENCE_INVOKE),
        "the service's `/v1/models` entry when `model` is its alias (the `openai` client's "
        "`models.retrieve`); another name is 404 `model_not_found`",
        "`inference:invoke` for this service",
    ),
    "invoke_chat_completions": Route(
        "POST",
        "/api/v1/inference/<service_id>/v1/chat/completions",
        needs(s.INFERENCE_INVOKE),
        "OpenAI-compatible JSON or SSE",
        "`inference:invoke` for this service",
    ),
    "invoke_embeddings": Route(
        "POST",
        "/api/v1/inference/<service_id>/v1/embeddings",
        needs(s.INFERENCE_INVOKE),
        "where the model serves embeddings",
        "`inference:invoke` for this service",
    ),
    "invoke_completions": Route(
        "POST",
        "/api/v1/inference/<service_id>/v1/completions",
        needs(s.INFERENCE_INVOKE),
        "OpenAI-compatible text completion, JSON or SSE, where the engine serves it",
        "`inference:invoke` for this service",
    ),
    # the project endpoint: the body's `model` names the service (docs/gateway.md)
    "project_models": Route(
        "GET",
        "/v1/models",
        needs(s.INFERENCE_INVOKE),
        "the project's services this credential may invoke (not stopped; a personal key: "
        "those [shared](people.md#sharing) with its person), with "
        "`description`, `context_length`, `max_output`, `capabilities`",
    ),
    "project_model": Route(
        "GET",
        "/v1/models/<path:model>",
        needs(s.INFERENCE_INVOKE),
        "the `/v1/models` entry of the service `model` reaches (the `openai` client's "
        "`models.retrieve`); 404 `model_not_found` when it reaches none this credential "
        "may invoke, or a stopped one",
    ),
    "project_chat_completions": Route(
        "POST",
        "/v1/chat/completions",
        needs(s.INFERENCE_INVOKE),
        "as the service's route, for the service `model` names (or its fallbacks); "
        "`x-ficc-service` names the one that answered",
    ),
    "project_embeddings": Route(
        "POST",
        "/v1/embeddings",
        needs(s.INFERENCE_INVOKE),
        "as the service's route, for the service `model` names (or its fallbacks)",
    ),
    "project_completions": Route(
        "POST",
        "/v1/completions",
        needs(s.INFERENCE_INVOKE),
        "as the service's route, for the service `model` names (or its fallbacks)",
    ),
    # the web console (docs/ui.md): shells and assets; the pages' data comes from /api/v1
    "web_landing": Route(
        "GET",
        "/",
        PUBLIC,
        "the console's landing page (the operator's contact and notice) and login form; "
        "303 to `/ui/dashboard` with a valid session cookie",
    ),
    "web_dashboard": Route(
        "GET",
        "/ui/dashboard",
        PUBLIC,
        "the console's dashboard (HTML; its script reads `/api/v1`); 303 to `/` without a "
        "valid session cookie",
    ),
    "web_services": Route(
        "GET",
        "/ui/services",
        PUBLIC,
        "the console's list of the project's services, each linked to its page, and the form "
        "that previews, creates and starts one (HTML); 303 to `/` without a valid session cookie",
    ),
    "web_service": Route(
        "GET",
        "/ui/services/<service_id>",
        PUBLIC,
        "the console's page of one service: specification, replicas, live logs, events, "
        "usage, actions (HTML; its script reads `/api/v1`); 303 to `/` without a valid "
        "session cookie",
    ),
    "web_chat": Route(
        "GET",
        "/ui/chat",
        PUBLIC,
        "the console's chat playground (HTML; its script streams from the invoke routes with "
        "the session); 303 to `/` without a valid session cookie",
    ),
    "web_keys": Route(
        "GET",
        "/ui/keys",
        PUBLIC,
        "the console's keys page: service keys and personal keys, made (shown once) and "
        "revoked (HTML; its script reads `/api/v1`); 303 to `/` without a valid session cookie",
    ),
    "web_usage": Route(
        "GET",
        "/ui/usage",
        PUBLIC,
        "the console's usage page: usage and spend per key, service, person, model or "
        "project and period, limits and budgets (HTML); 303 to `/` without a valid session "
        "cookie",
    ),
    "web_admin": Route(
        "GET",
        "/ui/admin",
        PUBLIC,
        "the console's administration page: users, projects, membership, pending signups "
        "(HTML; linked only for a session holding `admin`, whose routes refuse any other); ",
    ),
    "web_models": Route(
        "GET",
        "/ui/models",
        PUBLIC,
        "the console's models page (HTML; its script reads and changes `/api/v1/models`); "
        "303 to `/` without a valid session cookie",
    ),
    "web_static": Route(
        "GET",
        "/ui/static/<build>/<path:name>",
        PUBLIC,
        "a console asset (CSS, JavaScript, images), cached for good under the current "
        "build; an unknown one is 404 `asset_not_found`",
    ),
}

#: Who may call each route, by endpoint: what ``create_app`` enforces.
ROUTE_ACCESS: dict[str, Access] = {
    name: attrs.evolve(route.access, csrf=route.csrf) for name, route in ROUTES.items()
}


def declared(endpoint: str) -> Route:
    """The table's entry for ``endpoint``; raises if the route is not declared."""
    route = ROUTES.get(endpoint)
    if route is None:
        raise LookupError(
            f"the route {endpoint!r} is not declared: add it to ROUTES in "
            "ficc_core/api/access.py (method, path, access, result), then register its view"
        )
    return route


def add_route(app: QuartTrio, endpoint: str, view: Callable[..., Awaitable[Any]]) -> None:
    """Register ``view`` as ``endpoint``, at the method and path the table declares."""
    route = declared(endpoint)
    if route.websocket:
        app.add_websocket(route.rule, endpoint=endpoint, view_func=view)
    else:
        app.add_url_rule(route.rule, endpoint=endpoint, view_func=view, methods=[route.method])


def route(app: QuartTrio, endpoint: str) -> Callable[[View], View]:
    """Decorator: register the view as ``endpoint`` (see :func:`add_route`)."""
    declared(endpoint)  # at once, before the view is even defined

    def register(view: View) -> View:
        add_route(app, endpoint, view)
        return view

    return register
