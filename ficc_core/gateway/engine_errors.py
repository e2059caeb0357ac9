"""An engine's own error answer, re-shaped as an OpenAI error object inside the one envelope.

Engines answer errors in their own shapes: llama.cpp
``{"error": {"code": 400, "message", "type"}}``, vLLM ``{"object": "error",
"message", "type", "param", "code": 400}`` (newer releases nest it under
``"error"``), Ollama ``{"error": {"message", "type", "param", "code": null}}`` or
its native ``{"error": "message"}``. Clients (the ``openai`` package among them)
read an OpenAI error object whose ``code`` is a string, so a JSON answer with an
error status becomes::

    {"error": {"code": "context_length_exceeded", "message": "...",
               "type": "invalid_request_error", "param": null,
               "details": {"engine_status": 400, "engine_code": 400,
                           "engine_type": "exceed_context_size_error"}}}

``code`` is ``context_length_exceeded`` for a prompt that does not fit (OpenAI's
own code for it), a string code the engine gave itself, else ``engine_error``.
Only the first :data:`MAX_ERROR_BYTES` are parsed; a body that is not JSON (or
not an error object) keeps its text, shortened, as the message. A streamed error
after the head is not touched: it stays the stream's last event.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import RETRY_AFTER, EngineError

__all__ = ["MAX_ERROR_BYTES", "engine_error"]

#: The most of an error body that is parsed; a longer one is not an error object.
MAX_ERROR_BYTES = 64 * 1024
#: The longest message passed on, in characters.
MAX_MESSAGE = 2000
_CONTEXT = re.compile(
    r"context (length|size|window)|maximum context|exceeds? the available context|"
    r"too many tokens|prompt is too long",
    re.IGNORECASE,
)
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: Facts some engines add to a context overflow, renamed for ``details``.
_CONTEXT_FACTS = {"n_prompt_tokens": "prompt_tokens", "n_ctx": "context_length"}


def _document(pending: list[bytes] | None) -> tuple[Any, str]:
    if pending is None:
        return None, ""
    body = b"".join(pending)[:MAX_ERROR_BYTES]
    text = body.decode("utf-8", errors="replace")
    try:
        return json.loads(text), text
    except ValueError:
        return None, text


def engine_error(status: int, pending: list[bytes] | None) -> EngineError | None:
    """The OpenAI-shaped refusal for an engine's JSON answer with error ``status``.

    :param pending: the answer's body as read (None when it was too long to read whole).
    Returns None for a status below 400.
    """
    if status < 400:
        return None
    document, text = _document(pending)
    error: Any = document.get("error") if isinstance(document, dict) else None
    if isinstance(document, dict) and document.get("object") == "error":
        error = document  # vLLM's flat shape
    if isinstance(error, str):
        error = {"message": error}  # Ollama's native shape
    if not isinstance(error, dict):
        error = {}
    message = error.get("message")
    if not isinstance(message, str) or not message.strip():
        message = " ".join(text.split())[:500] or f"the engine answered {status}"
    message = message[:MAX_MESSAGE]
    engine_code, engine_type = error.get("code"), error.get("type")
    details: dict[str, Any] = {"engine_status": status}
    if isinstance(engine_code, str | int) and not isinstance(engine_code, bool):
        details["engine_code"] = engine_code if isinstance(engine_code, int) else engine_code[:64]
    if isinstance(engine_type, str):
        details["engine_type"] = engine_type[:64]
    if engine_type == "exceed_context_size_error" or _CONTEXT.search(message):
        code = "context_length_exceeded"
        for name, renamed in _CONTEXT_FACTS.items():
            value = error.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                details[renamed] = value
    elif isinstance(engine_code, str) and _CODE.fullmatch(engine_code):
        code = engine_code
    else:
        code = "engine_error"
    param = error.get("param")
    return EngineError(
        message,
        code=code,
        status=status,
        param=param if isinstance(param, str) else None,
        details=details,
        # An engine that is loading or overloaded: a client may come back shortly.
        headers={"Retry-After": str(RETRY_AFTER)} if status in (429, 503) else None,
    )
