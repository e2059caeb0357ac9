"""Reading request bodies: bounded, JSON objects only, structured by the one converter."""

from __future__ import annotations

import math
from typing import Any, TypeVar

import attrs
import trio
from quart import request

from ..base.errors import FiccError, InvalidRequest, PayloadTooLarge
from ..base.strictjson import loads
from ..routing.bands import BAND_NAME
from ..schema import FieldError, structure
from ..schema._convert import MAX_SAFE_INTEGER

T = TypeVar("T")


class UploadStalled(FiccError):
    """A body went longer than its idle bound without receiving a byte."""

    status = 408
    code = "upload_stalled"


async def read_body(limit: int, *, idle: float | None = None) -> bytes:
    """Return the request body, refusing more than ``limit`` bytes before buffering it all.

    With ``idle``, a client that sends nothing for that many seconds is refused
    (``upload_stalled``): otherwise a stalled client holds whatever the route holds
    for it (an upload slot) for as long as it keeps the connection open. Bytes
    received before a stall are returned to nobody.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(
            f"the request body is {declared} bytes; this route accepts at most {limit}",
            details={"limit": limit, "size": declared},
        )
    received = bytearray()
    chunks = aiter(request.body)
    while True:
        with trio.move_on_after(math.inf if idle is None else idle) as waiting:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return bytes(received)
        if waiting.cancelled_caught:
            raise UploadStalled(
                f"the upload sent no bytes for {idle:g} s (after {len(received)} bytes); "
                "nothing of it was written: send it again from the same offset",
                details={"idle_timeout": idle, "received": len(received)},
                headers={"Connection": "close"},
            )
        received.extend(chunk)
        if len(received) > limit:
            raise PayloadTooLarge(
                f"the request body is larger than this route accepts ({limit} bytes)",
                details={"limit": limit},
            )


def _json_content_type() -> bool:
    mimetype = request.mimetype or ""
    return mimetype in ("", "application/json") or mimetype.endswith("+json")


async def read_json_object(limit: int) -> dict[str, Any]:
    """Parse the body as a strict JSON object (bounded, ``application/json``), unstructured.

    Strict: no ``NaN`` or ``Infinity``, no number that overflows a float, no integer
    outside 64 bits and no lone surrogate escape (see :mod:`ficc_core.base.strictjson`).
    """
    if not _json_content_type():
        raise FiccError(
            f"this route takes application/json, not {request.mimetype}",
            code="unsupported_media_type",
            status=415,
        )
    raw = await read_body(limit)
    if not raw.strip():
        raise InvalidRequest("the request body is empty; send a JSON object", code="invalid_json")
    data: Any = loads(raw)
    if not isinstance(data, dict):
        raise InvalidRequest(
            "the request body must be a JSON object",
            details={"errors": [{"path": "$", "message": "expected object"}]},
        )
    return data


def query_integer(name: str) -> int:
    """The query parameter ``name`` (required): decimal digits, 0 to 2^53 - 1."""
    raw = request.args.get(name)
    if raw is None:
        raise InvalidRequest(
            f"the query parameter {name} is missing: expected a non-negative integer",
            details={"errors": [{"path": name, "message": "required, a non-negative integer"}]},
        )
    if not (raw.isascii() and raw.isdigit()) or (len(raw) > 1 and raw.startswith("0")):
        raise bad_query(name, "expected a non-negative integer")
    if len(raw) > 16 or int(raw) > MAX_SAFE_INTEGER:
        raise bad_query(name, f"must be at most {MAX_SAFE_INTEGER}")
    return int(raw)


def query_number(name: str) -> float | None:
    """The query parameter ``name``: a finite number from 0 to 2^53 - 1, or None if absent."""
    raw = request.args.get(name)
    if raw is None:
        return None
    try:
        value = float(raw) if len(raw) <= 64 else math.nan
    except ValueError:
        raise bad_query(name, "expected a number") from None
    if not 0 <= value <= MAX_SAFE_INTEGER:  # NaN compares false
        raise bad_query(name, f"must be a finite number from 0 to {MAX_SAFE_INTEGER}")
    return value


def query_bounded(name: str, low: int, high: int, default: int) -> int:
    """The query parameter ``name``: an integer from ``low`` to ``high``; ``default`` if absent."""
    if request.args.get(name) is None:
        return default
    value = query_integer(name)
    if not low <= value <= high:
        raise bad_query(name, f"must be from {low} to {high}")
    return value


def bad_query(name: str, message: str) -> InvalidRequest:
    return InvalidRequest(
        f"the query parameter {name} is invalid: {message}",
        details={"errors": [{"path": name, "message": message}]},
    )


async def read_json(cls: type[T], limit: int) -> T:
    """Parse the body as a JSON object and structure it as ``cls`` (an attrs class)."""
    return structure(await read_json_object(limit), cls)


def _name(value: str) -> None:
    if not value or len(value) > 64 or not all(ch.isalnum() or ch in "._-" for ch in value):
        raise ValueError("use 1 to 64 letters, digits, '.', '_' or '-'")


def name_validator(_instance: Any, attribute: attrs.Attribute, value: str) -> None:
    """attrs validator for resource names (projects, users, credentials)."""
    try:
        _name(value)
    except ValueError as exc:
        raise FieldError(attribute.name, str(exc)) from None


def lifetime_validator(_instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    """attrs validator for an optional credential lifetime: positive seconds."""
    if value is not None and not value > 0:
        raise FieldError(attribute.name, "must be a positive number of seconds")


def band_validator(_instance: Any, attribute: attrs.Attribute, value: str | None) -> None:
    """attrs validator for an optional band name (which band exists is the settings' word:
    an unknown one is ``unknown_band``)."""
    if value is not None and not BAND_NAME.fullmatch(value):
        raise FieldError(
            attribute.name, "must be a band name (lower-case letters, digits, '-', '_'; 1 to 32)"
        )
