"""Request checks: who may invoke what, whether the service admits it, and its body.

Everything here is in memory (no SQLite, no I/O), cheap enough for every request
and, for :meth:`RequestChecks.problem`, for every read of a response stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import trio

from ..base.errors import FiccError, Forbidden, InvalidRequest, PayloadTooLarge, Unauthenticated
from ..base.strictjson import dumps, loads
from .catalog import CAPABILITIES
from .errors import (
    CapabilityNotServed,
    DeadlineExceeded,
    GenerationChanged,
    NotForThisService,
    ReplicaUnresponsive,
    ServerShuttingDown,
    ServiceDraining,
    ServiceNotFound,
    ServiceStopped,
    not_served_here,
)
from .limits import estimate

if TYPE_CHECKING:
    from ..auth import AuthService, Principal
    from ..routing.live import LiveService, LiveTable
    from .limits import ContextLimits, PromptCount
    from .request import Request

INVOKE_SCOPE = "inference:invoke"
#: The engine capability a path needs beyond the model list.
NEEDS = {"/v1/embeddings": "embeddings", "/v1/completions": "completions"}
#: The paths whose answer may stream (SSE), with usage asked for in the last event.
STREAMED = frozenset({"/v1/chat/completions", "/v1/completions"})
#: A completion's bound on the tokens it generates, as OpenAI's API names it (newer first).
OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens")


def _shown(value: Any) -> str:
    """A client's value in a refusal: a number as it is, anything else by its JSON type."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)[:32]
    names = {bool: "a boolean", str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


#: The content parts that carry an image (OpenAI's, and the Responses API's name).
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


#: The roles of OpenAI's chat messages. llama.cpp and vLLM take any string and hand it
#: to the model's chat template, which may render it as nothing the model knows, or
#: fail (a 500 that counts against the replica's breaker); OpenAI's clients send these.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_ROLE_LIST = ", ".join(sorted(ROLES))


def _messages(view: LiveService, messages: list[Any]) -> None:
    """Refuse a chat's ``messages`` no engine should be sent: none at all, a message that
    is not an object or whose ``role`` is not one of :data:`ROLES`, and (for a service
    that does not declare ``vision``) an image part.

    One pass of a class check and a set lookup per message; a message the pass cannot
    settle (content parts to look through for images, or something wrong) sends the
    whole list to :func:`_message_by_message`, which finds what to refuse, if anything.
    """
    if not messages:
        raise _invalid(
            "`messages` is empty: a chat completion needs at least one message",
            "$.messages",
            "a non-empty array",
        )
    images = "vision" not in view.capabilities
    try:
        for message in messages:
            if message.__class__ is not dict or message.get("role") not in ROLES:
                break
            if images and message.get("content").__class__ is list:
                break
        else:
            return
    except TypeError:  # an unhashable role: an array, an object
        pass
    _message_by_message(view, messages, images)


def _message_by_message(view: LiveService, messages: list[Any], images: bool) -> None:
    """Refuse the first message that is not an object, has no role of :data:`ROLES`, or
    (``images``: the service does not declare ``vision``) holds an image part."""
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(
                f"`messages[{index}]` must be an object, not {_shown(message)}",
                f"$.messages[{index}]",
                "an object with a `role`",
            )
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            said = f"{role[:32]!r}" if isinstance(role, str) else _shown(role)
            raise _invalid(
                f"`messages[{index}].role` is {'missing' if role is None else said}: a "
                f"message's role is one of {_ROLE_LIST}",
                f"$.messages[{index}].role",
                f"one of {_ROLE_LIST}",
            )
        if images:
            content = message.get("content")
            if isinstance(content, list):
                _no_images(view, index, content)


def _no_images(view: LiveService, index: int, content: list[Any]) -> None:
    """Refuse an image part sent to a service that does not declare ``vision``: its
    engine cannot read it (llama.cpp answers 500, which would count against the
    replica's breaker: any invoker could open breakers on purpose)."""
    for part_index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind in IMAGE_PARTS:  # a list is unhashable
            raise _invalid(
                f"service {view.id!r} does not take images (its capabilities do not "
                "include vision; an operator declares capabilities.vision in the "
                "specification when its model reads them)",
                f"$.messages[{index}].content[{part_index}]",
                "a text part",
            )


def _one_answer(document: Mapping[str, Any]) -> None:
    """Refuse a request for several answers: ``n`` above 1, or a completion's ``prompt``
    that is several prompts (strings, or token arrays). Each answer takes an engine slot
    of its own, while the service's concurrency, the priority bands, ``max_output`` and
    the quotas count a request as one, and the engine reports one answer's usage."""
    n = document.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n != 1):
        raise _invalid(
            f"`n` must be 1, not {_shown(n)}: each answer takes an engine slot of its own, "
            "so send one request per answer",
            "$.n",
            "1",
        )
    prompt = document.get("prompt")
    if (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(part, str | list) for part in prompt)
    ):
        raise _invalid(
            f"`prompt` holds {len(prompt)} prompts: send one request per prompt (each "
            "takes an engine slot of its own)",
            "$.prompt",
            "one prompt: a string, or an array of token IDs",
        )


def not_capable(view: LiveService, needed: str) -> CapabilityNotServed:
    """The refusal of a route whose capability ``needed`` the service's model does not
    serve, in a client's words: the model it asked for, what that model does serve."""
    # Named as /v1/models names them (an engine's own, tokenize.*, are the gateway's).
    served = [c for c in CAPABILITIES if c in view.capabilities]
    advice = (
        "ask a model that serves embeddings (an embedding model's service: GET /v1/models "
        "lists each model's capabilities)"
        if needed == "embeddings"
        else "send the prompt as a chat completion (POST /v1/chat/completions) instead"
        if "chat" in served
        else f"ask a model that serves {needed} (GET /v1/models lists each model's capabilities)"
    )
    return CapabilityNotServed(
        f"model {view.alias!r} does not serve {needed} (it serves: "
        f"{', '.join(served) or 'nothing declared'}): {advice}",
        details={"model": view.alias, "service": view.id, "needed": needed, "capabilities": served},
    )


def model_not_a_string(model: Any) -> InvalidRequest:
    """The refusal of a ``model`` that is present but not a string, on both endpoints."""
    return _invalid(
        f"`model` must be a string naming a model, not {_shown(model)}", "$.model", "string"
    )


def _named(view: LiveService) -> str:
    """A service in a refusal: its alias (a client's ``model``) and its ID (a service
    route's path), so whichever the client sent is named."""
    return f"{view.alias!r} ({view.id})"


def _invalid(message: str, path: str, expected: str, **kwargs: Any) -> InvalidRequest:
    return InvalidRequest(
        message, details={"errors": [{"path": path, "message": f"expected {expected}"}]}, **kwargs
    )


@attrs.frozen(slots=True)
class Body:
    """A request body parsed once: its JSON object, its ``model``, and the client's bytes.

    :ivar document: the JSON object (read, never changed: candidates share it).
    :ivar model: the model the request is prepared for: the client's ``model`` (any JSON
        value, or None), or the alias a project endpoint resolved it to.
    :ivar raw: the client's bytes, sent unchanged when nothing must be set; None for a
        mapping handed to the seam, or a body renamed for another service.
    """

    document: Mapping[str, Any]
    model: Any
    raw: bytes | None

    def for_model(self, alias: str) -> Body:
        """The same body for the service of ``alias`` (a project endpoint's candidate):
        itself when it already names it, else renamed, with nothing parsed again."""
        if self.model == alias:
            return self
        return Body(self.document, alias, None)


class Prepared(NamedTuple):
    """What :meth:`RequestChecks.prepare` makes of a body for one service (a named tuple:
    its callers unpack it).

    :ivar payload: the bytes sent to the engine.
    :ivar streaming: the answer is a server-sent-event stream.
    :ivar prompt_count: the prompt count the engine's tokenizer must settle, if any.
    :ivar prompt_estimate: the prompt's tokens as estimated (bytes / 4), for the quota gate.
    :ivar completion_estimate: the completion's (:func:`.limits.estimate`).
    :ivar hide_usage: the stream's usage event is the gateway's ask: accounted, not relayed.
    """

    payload: bytes
    streaming: bool
    # Not ``count``: a named tuple's field of that name would hide tuple.count.
    prompt_count: PromptCount | None
    prompt_estimate: int
    completion_estimate: int
    hide_usage: bool


class RequestChecks:
    """The gateway's checks of a request before and while it is served.

    :param auth: the authentication service (revocations and expiry, in memory).
    :param live: the live routing table.
    :param max_body_bytes: the largest request body accepted.
    """

    def __init__(self, auth: AuthService, live: LiveTable, *, max_body_bytes: int) -> None:
        self.auth = auth
        self.live = live
        self.max_body_bytes = max_body_bytes
        #: The shutdown grace, once it ended (:meth:`shut_down`); None while serving.
        self.shut_down_after: float | None = None
        self._shut_down_idle = False

    def shut_down(self, grace: float, *, idle: bool = False) -> None:
        """The server's shutdown grace ended: every request being served ends at its next
        re-check (within the recheck interval) with :class:`ServerShuttingDown`, a stream
        with that error as its last SSE event; one still queued for a slot gets it as
        its answer once the ended streams free their slots.

        ``idle``: not the grace's end, but no invoke request was in flight, so what is
        still open (a replica's live log) ends before it; the message says so.

        One attribute, read where a response already re-checks before every read:
        nothing is registered per request.
        """
        self.shut_down_after = grace
        self._shut_down_idle = idle

    def shutdown_problem(self) -> ServerShuttingDown | None:
        """Why a long-lived response must end now because the server's shutdown grace
        ended (:meth:`shut_down`), or None while serving; other streams (a replica's live
        log) end with it too."""
        return None if self.shut_down_after is None else self._shutting_down()

    def _shutting_down(self) -> ServerShuttingDown:
        grace = self.shut_down_after
        if self._shut_down_idle:
            return ServerShuttingDown(
                "the server is shutting down and no request is in flight any more, so what "
                "is still open ends now, before its "
                f"{grace:g} s grace period: retry once it is back, or on another controller",
                details={"grace_seconds": grace, "idle": True},
            )
        return ServerShuttingDown(
            f"the server is shutting down; its {grace:g} s grace period ended before this "
            "response did: retry the request",
            details={"grace_seconds": grace},
        )

    # -- authority ------------------------------------------------------------------------

    def authority(self, actor: Principal) -> FiccError | None:
        """Why ``actor``'s credential no longer holds (revoked, expired), or None."""
        if self.auth.still_valid(actor):
            return None
        try:
            self.auth.check_valid(actor)
        except FiccError as exc:
            return exc
        return Unauthenticated("the credential is no longer valid", code="credential_revoked")

    def may_invoke(self, actor: Principal) -> None:
        """Raise unless ``actor``'s credential holds and carries ``inference:invoke``."""
        problem = self.authority(actor)
        if problem is not None:
            raise problem
        if INVOKE_SCOPE not in actor.scopes:
            raise Forbidden(
                f"this credential lacks the scope {INVOKE_SCOPE}",
                code="missing_scope",
                details={"required": [INVOKE_SCOPE], "missing": [INVOKE_SCOPE]},
            )

    def authorise(self, service_id: str, actor: Principal) -> LiveService:
        """The view of ``service_id`` if ``actor`` may invoke it; else raise the refusal."""
        self.may_invoke(actor)
        if actor.service_id not in (None, service_id):
            raise NotForThisService(
                "this credential is bound to another inference service",
                details={"service": service_id},
            )
        view = self.live.get(service_id)
        # A personal key reaches the services shared with its person (no project's own).
        if view is None or (view.project_id != actor.project_id and service_id not in actor.shared):
            raise ServiceNotFound(
                f"no inference service {service_id!r} in this project", details={"id": service_id}
            )
        return view

    # -- admission ------------------------------------------------------------------------

    @staticmethod
    def admit(view: LiveService) -> None:
        """Raise unless ``view`` admits new requests (draining, stopped).

        The message names the service by its alias, the ``model`` a client sends, and by
        its ID, the one a service route's path holds: whichever was sent is named."""
        if view.admission == "draining":
            raise ServiceDraining(
                f"service {_named(view)} is draining: requests in flight finish, "
                "new ones are refused; send them to another model, or retry once an operator "
                "has started it again",
                details={"service": view.id, "alias": view.alias},
            )
        if view.admission != "serving":
            raise ServiceStopped(
                f"service {_named(view)} is stopped; an operator starts it "
                f"(ficc inference start {view.alias}) for it to serve requests",
                details={"service": view.id, "alias": view.alias},
            )

    def current(self, request: Request) -> LiveService:
        """The service's view for a request still waiting for a replica.

        Nothing was sent yet, so a request queued across a new generation is served
        by the new generation's replicas.
        """
        view = self.live.get(request.service_id)
        if view is None:
            raise ServiceNotFound(
                f"service {_named(request.view)} was removed", details={"id": request.service_id}
            )
        if view.admission == "stopped":
            raise ServiceStopped(f"service {_named(view)} stopped while the request waited")
        request.view = view
        return view

    def problem(self, request: Request) -> FiccError | None:
        """Why a request being served must end now, or None (it runs before every read)."""
        if self.shut_down_after is not None:
            return self._shutting_down()
        problem = self.authority(request.actor)
        if problem is not None:
            return problem
        view = self.live.get(request.service_id)
        if view is not request.view:
            if view is None:
                return ServiceStopped(f"service {_named(request.view)} was removed")
            replica = request.replica
            if view.generation != request.view.generation and not (
                replica is not None and view.serves(replica.key)
            ):
                return GenerationChanged(
                    f"service {_named(view)} moved to generation {view.generation} "
                    "while the response streamed; send the request again",
                    details={"generation": view.generation},
                )
            if view.admission == "stopped":
                return ServiceStopped(f"service {_named(view)} stopped while the response streamed")
            why = None if replica is None else self.live.suspended(replica.key)
            if replica is not None and why is not None and not view.serves(replica.key):
                return ReplicaUnresponsive(
                    f"replica {replica.index} of service {_named(view)} stopped answering "
                    f"({why}) while it served this request and left routing; send the "
                    "request again: other replicas serve it, and this one is restarted",
                    details={"replica": replica.index, "reason": why},
                )
            request.view = view
        if trio.current_time() >= request.deadline:
            bound, seconds = request.deadline_bound, request.deadline_seconds
            whose = "the service's deadline" if bound == "request_deadline" else bound
            return DeadlineExceeded(
                f"the request ran past {whose} of {seconds:g} s",
                details={"bound": bound, bound: seconds},
            )
        return None

    # -- the body ----------------------------------------------------------------------------

    def document(self, body: bytes) -> dict[str, Any]:
        """The JSON object a request body holds (within ``max_body_bytes``, strict JSON)."""
        limit = self.max_body_bytes
        if len(body) > limit:
            raise PayloadTooLarge(
                f"the request body is {len(body)} bytes; at most {limit} are accepted",
                details={"limit": limit, "size": len(body)},
            )
        if not bytes(body).strip():
            raise InvalidRequest(
                "the request body is empty; send a JSON object", code="invalid_json"
            )
        document = loads(body)
        if not isinstance(document, dict):
            raise _invalid("the request body must be a JSON object", "$", "object")
        return document

    def parse(self, body: bytes | Mapping[str, Any] | Body) -> Body:
        """``body`` parsed once (:class:`Body`): the client's bytes decoded strictly, or a
        mapping handed to the seam taken as it is (copied: the caller may change its own)."""
        if isinstance(body, Body):
            return body
        if isinstance(body, Mapping):
            document = dict(body)
            return Body(document, document.get("model"), None)
        raw = bytes(body)
        document = self.document(raw)
        return Body(document, document.get("model"), raw)

    def prepare(
        self,
        view: LiveService,
        path: str,
        body: bytes | Mapping[str, Any] | Body,
        *,
        limits: ContextLimits | None = None,
    ) -> Prepared:
        """What the checks make of ``body`` for ``view`` (:class:`Prepared`): the bytes to
        send the engine, whether the answer streams, the prompt count the engine's
        tokenizer must settle (:mod:`.limits`), if any, the estimated prompt and completion
        tokens the quota gate reserves (bytes / 4, and :func:`.limits.estimate`), and
        whether the stream's usage event is the gateway's ask, not the client's (then it is
        accounted, not relayed). ``limits``: the context and output limits to apply (the
        gateway's; None: none).

        The client's bytes go unchanged unless something must be set: the alias as
        ``model``, usage reporting for a streamed chat or completion, ``max_tokens`` as
        the service's ``max_output`` for a chat or completion that names no bound (an
        engine would otherwise generate up to its context). A bound that is not a
        positive integer is refused (llama.cpp reads ``-1`` as "no bound"), and so is
        a request that certainly exceeds the service's ``max_output`` or
        ``context_length``. The parsed document is read, never changed: a fallback
        candidate prepares the same :class:`Body` again (:meth:`Body.for_model`).
        """
        needed = NEEDS.get(path)
        if needed is not None and needed not in view.capabilities:
            raise not_capable(view, needed)
        # Parsed here unless parsed already (a project endpoint's :class:`Body`); a body
        # of bytes needs no Body made for it (this runs for every request).
        if isinstance(body, Body):
            document, model, raw = body.document, body.model, body.raw
        elif isinstance(body, Mapping):
            document, raw = dict(body), None
            model = document.get("model")
        else:
            raw = bytes(body)
            document = self.document(raw)
            model = document.get("model")
        if model is not None and model != view.alias:
            if not isinstance(model, str):
                raise model_not_a_string(model)
            raise not_served_here(model, view.alias)
        # What the engine is sent beyond the client's document (in the order it is set).
        changes: dict[str, Any] = {"model": view.alias}
        changed = model is None or raw is None
        hidden = False
        stream = document.get("stream")
        if stream is None:
            stream = False  # OpenAI's schema takes null for "not streamed"
        if not isinstance(stream, bool):
            raise _invalid("`stream` must be a boolean", "$.stream", "boolean")
        if path in STREAMED:
            if path == "/v1/chat/completions":
                messages = document.get("messages")
                if not isinstance(messages, list):
                    raise _invalid(
                        "a chat completion needs a `messages` array", "$.messages", "array"
                    )
                _messages(view, messages)
            if path == "/v1/completions" and not isinstance(document.get("prompt"), str | list):
                raise _invalid(
                    "a completion needs a `prompt` string or array", "$.prompt", "string or array"
                )
            _one_answer(document)
            # The client's bound on the completion, which must be one; the service's
            # max_output bounds a completion whose client named none.
            for name in OUTPUT_FIELDS:
                value = document.get(name)
                if value is not None and (
                    not isinstance(value, int) or isinstance(value, bool) or value < 1
                ):
                    raise _invalid(
                        f"`{name}` must be a positive integer, not {_shown(value)}",
                        f"$.{name}",
                        "an integer of at least 1",
                    )
            if view.max_output is not None and all(
                document.get(name) is None for name in OUTPUT_FIELDS
            ):
                changes["max_tokens"] = view.max_output
                changed = True
            if stream:
                options = document.get("stream_options")
                if options is None:
                    options = {}
                if not isinstance(options, dict):
                    raise _invalid(
                        "`stream_options` must be an object", "$.stream_options", "object"
                    )
                if options.get("include_usage") is not True:
                    changes["stream_options"] = {**options, "include_usage": True}
                    changed = hidden = True
        elif path == "/v1/embeddings":
            stream = False
            if not isinstance(document.get("input"), str | list):
                raise _invalid(
                    "an embeddings request needs an `input` string or array",
                    "$.input",
                    "string or array",
                )
        if not changed:
            assert raw is not None
            payload = raw
        else:
            try:
                payload = dumps({**document, **changes})
            except (ValueError, TypeError) as exc:
                # Only a mapping handed to the seam can get here; bytes were decoded strictly.
                raise InvalidRequest(
                    f"the request body cannot be sent as strict JSON: {type(exc).__name__}",
                    code="invalid_json",
                ) from None
        size = len(payload)
        # The checks judge what the client asked (the document as sent: a cap it did not
        # ask for is no ask).
        count = None if limits is None else limits.admit(view, path, document, size)
        return Prepared(
            payload, stream, count, size // 4, estimate(view, path, document, size), hidden
        )
