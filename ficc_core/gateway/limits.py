"""Context and output limits: a request that certainly cannot fit is refused before a replica
is taken, so the engine never sees it.

Two limits come with the service's view: ``max_output`` (the most tokens one
completion may ask for) and ``context_length`` (prompt and completion together,
per request: llama.cpp divides ``--ctx-size`` over its slots). A chat or
completion asking for more than ``max_output`` (``max_completion_tokens``, else
``max_tokens``) is refused with ``400 max_output_exceeded``. One whose prompt
tokens plus the completion asked for (or 1) exceed ``context_length`` is refused
with ``400 context_length_exceeded``, OpenAI's own code for it.

Counting the prompt costs nothing in the common case. Two bounds come from its
bytes first:

- an upper bound: the request body's bytes plus :data:`TEMPLATE_TOKENS` for the
  chat template (a byte-level tokenizer makes at most one token of each byte, and
  the JSON around the text has more bytes than the template has tokens). When it
  fits, nothing more is done;
- a lower bound: the text's bytes divided by :data:`MAX_TOKEN_BYTES`, which no
  vocabulary's token covers more of. When even that does not fit, the request is
  refused at once.

Only in between is the engine's tokenizer asked, through the endpoint action of
a ready replica and outside any slot (llama.cpp: ``POST /apply-template`` then
``POST /tokenize``; vLLM: ``POST /tokenize`` with the messages), within
``tokenize_timeout``. When it cannot answer, the request goes on: a refusal is
only made when certain, and the engine then judges it (its own
``context_length_exceeded`` reaches the client as well). The refusal's details
say the prompt's tokens, the completion's, the limit and how the prompt was
counted (``tokenizer`` or ``bytes_lower_bound``).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..base.errors import FiccError
from ..base.strictjson import dumps
from .errors import ContextLengthExceeded, MaxOutputExceeded

if TYPE_CHECKING:
    from ..routing.live import LiveReplica, LiveService
    from .metrics import GatewayMetrics
    from .relay import Relay

log = logging.getLogger("ficc.gateway")

__all__ = ["MAX_TOKEN_BYTES", "TEMPLATE_TOKENS", "ContextLimits", "PromptCount", "estimate"]

#: No vocabulary in use has a token longer than this many bytes (SmolLM2's longest is
#: 81: a newline and 80 spaces), so a text of n bytes is at least n / 256 tokens.
MAX_TOKEN_BYTES = 256
#: Tokens a chat template may add around the messages (roles, markers, a default
#: system prompt such as SmolLM2's 18 tokens) beyond the JSON's own bytes.
TEMPLATE_TOKENS = 256
#: The largest tokenizer answer read (a token ID list of a 1 MiB prompt fits).
TOKENIZE_LIMIT = 8 << 20
#: The engine routes each tokenizer dialect uses (the capability the adapter declares).
LLAMA_CPP, VLLM = "tokenize.llama_cpp", "tokenize.vllm"
_PATHS = ("/v1/chat/completions", "/v1/completions")


@attrs.define(eq=False)
class PromptCount:
    """A prompt the bytes could not settle: the engine's tokenizer decides.

    :ivar document: the request body (its messages or prompt).
    :ivar completion: the completion tokens asked for (or 1).
    :ivar at_least: the prompt's lower bound from its bytes.
    :ivar asked: whether the client named the completion's bound.
    """

    view: LiveService
    path: str
    document: Mapping[str, Any]
    completion: int
    at_least: int
    asked: bool = True


def _requested(document: Mapping[str, Any]) -> tuple[str, int] | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = document.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def estimate(view: LiveService, path: str, document: Mapping[str, Any], size: int) -> int:
    """The completion tokens a request may use, for the quota gate's reservation
    (docs/limits.md): ``max_completion_tokens`` or ``max_tokens``, else the service's
    ``max_output``, else what its context leaves after ``size // 4`` prompt tokens (0 for
    an embedding, or when nothing bounds it)."""
    if path not in _PATHS:
        return 0
    requested = _requested(document)
    if requested is not None:
        return requested[1]
    if view.max_output is not None:
        return view.max_output
    return max(0, view.context_length - size // 4)


def _text_bytes(path: str, document: Mapping[str, Any]) -> int | None:
    """The UTF-8 bytes of the prompt's text; None when it has parts that are not text
    (an image), which the tokenizer routes cannot count."""
    if path == "/v1/completions":
        prompt = document.get("prompt")
        return len(prompt.encode()) if isinstance(prompt, str) else None
    total = 0
    for message in document.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content.encode())
        elif isinstance(content, list):
            for part in content:
                if not (isinstance(part, dict) and isinstance(part.get("text"), str)):
                    return None
                total += len(part["text"].encode())
    return total


class ContextLimits:
    """The service's ``max_output`` and ``context_length``, checked before a replica is taken.

    :param relay: reaches a replica's tokenizer route (:meth:`Relay.fetch`).
    :param metrics: counts the tokenizer's answers and fallbacks.
    :param tokenize_timeout: the longest wait for a tokenizer, in seconds.
    """

    def __init__(self, relay: Relay, metrics: GatewayMetrics, *, tokenize_timeout: float) -> None:
        self.relay = relay
        self.metrics = metrics
        self.tokenize_timeout = tokenize_timeout
        self._turn = itertools.count()

    def admit(
        self, view: LiveService, path: str, document: Mapping[str, Any], size: int
    ) -> PromptCount | None:
        """Raise the refusal the request certainly earns; return what the tokenizer must
        settle, or None when the request fits (no I/O: bounds from ``size`` bytes)."""
        if path not in _PATHS or (view.context_length <= 0 and view.max_output is None):
            return None
        requested = _requested(document)
        if requested is not None and view.max_output is not None:
            name, tokens = requested
            if tokens > view.max_output:
                raise MaxOutputExceeded(
                    f"`{name}` is {tokens}; service {view.id!r} generates at most "
                    f"{view.max_output} tokens per completion",
                    param=name,
                    details={"requested": tokens, "max_output": view.max_output},
                )
        context = view.context_length
        asked = requested is not None
        completion = requested[1] if requested is not None else 1
        if context <= 0 or size + TEMPLATE_TOKENS + completion <= context:
            return None
        text = _text_bytes(path, document)
        if text is None:
            return None  # parts the bounds cannot count: the engine judges
        at_least = text // MAX_TOKEN_BYTES
        if at_least + completion > context:
            raise _too_long(view, path, at_least, completion, "bytes_lower_bound", asked)
        return PromptCount(view, path, document, completion, at_least, asked)

    async def settle(self, count: PromptCount) -> int | None:
        """Ask the engine's tokenizer; raise :class:`ContextLengthExceeded` when it says the
        prompt does not fit, else return its count (None: it could not say). An engine that
        cannot answer in time lets the request on."""
        view = count.view
        dialect = LLAMA_CPP if LLAMA_CPP in view.capabilities else VLLM
        if dialect not in view.capabilities or not view.replicas:
            return None
        replica = view.replicas[next(self._turn) % len(view.replicas)]
        tokens = None
        with trio.move_on_after(self.tokenize_timeout):
            try:
                tokens = await self._count(replica, dialect, count)
            except (FiccError, ValueError, KeyError, TypeError) as exc:
                log.info("service %s: the tokenizer did not count the prompt: %s", view.id, exc)
        outcome = "fallback" if tokens is None else "counted"
        self.metrics.gateway_tokenize.labels(view.id, outcome).inc()
        if tokens is not None and tokens + count.completion > view.context_length:
            raise _too_long(view, count.path, tokens, count.completion, "tokenizer", count.asked)
        return tokens

    async def _count(self, replica: LiveReplica, dialect: str, count: PromptCount) -> int | None:
        document, chat = count.document, count.path == "/v1/chat/completions"
        extra = {key: document[key] for key in ("tools", "chat_template_kwargs") if key in document}
        if dialect == VLLM:
            body: dict[str, Any] = {"model": count.view.alias}
            if chat:
                body.update(messages=document["messages"], add_generation_prompt=True, **extra)
            else:
                body["prompt"] = document["prompt"]
            answer = await self._post(replica, "/tokenize", body)
            return int(answer["count"]) if answer is not None else None
        if chat:
            rendered = await self._post(
                replica, "/apply-template", {"messages": document["messages"], **extra}
            )
            if rendered is None:
                return None
            prompt = rendered["prompt"]
        else:
            prompt = document["prompt"]
        answer = await self._post(replica, "/tokenize", {"content": prompt})
        return len(answer["tokens"]) if answer is not None else None

    async def _post(self, replica: LiveReplica, path: str, body: dict[str, Any]) -> Any:
        status, answer = await self.relay.fetch(replica, path, dumps(body), limit=TOKENIZE_LIMIT)
        if status != 200:
            log.info("the tokenizer route %s answered %s", path, status)
            return None
        return json.loads(answer)


def _too_long(
    view: LiveService, path: str, prompt: int, completion: int, counted: str, asked: bool
) -> FiccError:
    how = "by the engine's tokenizer" if counted == "tokenizer" else "at least, from its bytes"
    # A request naming no bound is counted as asking for one token: say so, not "asks for 1".
    rest = (
        f"and the completion asks for {completion}: shorten the messages or the completion"
        if asked
        else "leaving no room for a completion: shorten the messages"
    )
    return ContextLengthExceeded(
        f"service {view.id!r} serves {view.context_length} tokens per request (its context "
        f"length); the prompt has {prompt} tokens ({how}) {rest}",
        param="messages" if path == "/v1/chat/completions" else "prompt",
        details={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "context_length": view.context_length,
            "counted": counted,
        },
    )
