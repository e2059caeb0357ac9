"""Strict JSON: the one decoder for what clients send and the one encoder for what they get.

Python's :mod:`json` reads more than JSON: the constants ``NaN``, ``Infinity`` and
``-Infinity``, numbers such as ``1e999`` that overflow to infinity, integers of any
length, and ``\\ud800`` escapes that decode to a lone UTF-16 surrogate no UTF-8
encoder can write back. Each of these got through to SQLite, placement or a
response once; :func:`loads` refuses all of them with a 400 ``invalid_json`` that
names where in the document the value is.

:func:`dumps` never writes a non-JSON constant (it raises instead), and
:func:`dumps_error` renders an error envelope whatever its message or details
hold, so reporting a refusal can never fail in turn.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import InvalidRequest

#: The integer range every reader of a JSON document in FICC accepts (SQLite, engines).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_SURROGATE = re.compile("[\ud800-\udfff]")
# Cheap scans of the raw text decide whether the decoded document is walked: it may hold
# a surrogate escape (a valid pair "\ud83d\ude00" decodes to one character, and passes),
# or a run of 19 digits (found as 19 zeros once every digit is mapped to "0": a plain
# substring search, many times faster than a regular expression over digit-dense text).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_DIGITS_AS_ZEROS = bytes.maketrans(b"0123456789", b"0" * 10)
_NINETEEN_DIGITS = b"0" * 19


class _Refused(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text} is out of range for a JSON number (a 64-bit float)")
    return value


def _shown_key(key: str) -> str:
    return _SURROGATE.sub("\ufffd", key)


def _check(document: Any) -> None:
    """Refuse lone surrogates (in keys and strings) and integers outside 64 bits."""
    stack: list[tuple[str, Any]] = [("$", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise _Refused(
                    "a string holds a lone UTF-16 surrogate escape (\\ud800 to \\udfff "
                    "without its pair), which is not Unicode text",
                    path,
                )
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                raise _Refused(
                    "an integer is out of range: JSON integers here lie between "
                    f"{INT64_MIN} and {INT64_MAX}",
                    path,
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{_shown_key(key)}"
                if _SURROGATE.search(key):
                    raise _Refused(
                        "a key holds a lone UTF-16 surrogate escape, which is not Unicode text",
                        child,
                    )
                stack.append((child, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", item) for index, item in enumerate(value))


def _maybe_hostile(data: bytes) -> bool:
    if b"\\u" in data and _SURROGATE_ESCAPE.search(data):
        return True
    return _NINETEEN_DIGITS in data.translate(_DIGITS_AS_ZEROS)


def loads(raw: bytes | bytearray | memoryview | str, *, what: str = "the request body") -> Any:
    """Decode ``raw`` as strict JSON or raise :class:`InvalidRequest` (``invalid_json``)."""
    try:
        # JSON between systems is UTF-8 (RFC 8259); json.loads would also guess UTF-16/32.
        if isinstance(raw, str):
            data, text = None, raw
        else:
            data = bytes(raw)
            text = data.decode("utf-8")
        document = json.loads(
            text.removeprefix("\ufeff"), parse_constant=_constant, parse_float=_finite
        )
        if data is None or _maybe_hostile(data):  # text may hold surrogates unescaped
            _check(document)
    except _Refused as exc:
        message = str(exc.args[0])
        path = exc.args[1] if len(exc.args) > 1 else None
        details = {"errors": [{"path": path, "message": message}]} if path else {}
        at = f" at {path}" if path else ""
        raise InvalidRequest(
            f"{what} is not strict JSON{at}: {message}", code="invalid_json", details=details
        ) from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{what} is not UTF-8: {exc}", code="invalid_json") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}", code="invalid_json") from None
    except ValueError:
        # int() refuses a literal of more than 4,300 digits before _check could.
        raise InvalidRequest(
            f"{what} is not strict JSON: an integer is out of range: JSON integers here lie "
            f"between {INT64_MIN} and {INT64_MAX}",
            code="invalid_json",
        ) from None
    return document


def dumps(document: Any, **options: Any) -> bytes:
    """Encode ``document`` as compact UTF-8 JSON; raise ``ValueError`` for NaN or Infinity.

    A lone surrogate cannot be encoded as UTF-8 either, and also raises
    (``UnicodeEncodeError`` is a ``ValueError``).
    """
    options.setdefault("separators", (",", ":"))
    return json.dumps(document, ensure_ascii=False, allow_nan=False, **options).encode("utf-8")


def _safe(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {_safe(str(key)): _safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(item) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _safe(str(value))


def dumps_error(envelope: dict[str, Any]) -> bytes:
    """Encode an error envelope; lone surrogates become U+FFFD and NaN or Infinity null."""
    try:
        return dumps(envelope)
    except (ValueError, TypeError):
        return dumps(_safe(envelope))
