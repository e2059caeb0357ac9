"""What travels on a node connection: message forms, relay frames, bounds, errors.

Both ends encode and decode here, so the two never disagree. A refusal travels as
``{"code", "message", "status"}`` and comes back as its own class when it is one
both ends know (:func:`error_from_wire`): a node's :class:`UnknownAttempt` or
:class:`StaleFence` is caught as that class on the controller, relayed or not.

Relay frames are binary: ``struct "!BI"`` (kind, channel) followed by at most
64 KiB of payload; kind :data:`KIND_CHUNK` carries a response body chunk (agent →
controller), :data:`KIND_BODY` a piece of a request body (controller → agent).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..base import digests
from ..base.errors import FiccError, InvalidRequest
from ..executor import errors as executor_errors
from ..executor.types import AttemptStatus, BodyChunk, EndOfStream, ReadEvent, ResponseHead

if TYPE_CHECKING:
    from ..executor.types import StreamFailed

#: The largest message an agent may send (a snapshot with many runtimes and attempts).
MAX_MESSAGE = 1 << 20
#: The controller's last word on a connection it ends because it is stopping: the agent
#: reconnects (to it once it is back, or to another controller) without a warning.
GOODBYE: Mapping[str, str] = {
    "type": "goodbye",
    "code": "controller_shutting_down",
    "message": "the controller is shutting down; reconnect once it is back",
}
#: Events a relayed stream may have in flight between agent and controller (and queued on each).
WINDOW = 4
#: Relayed streams one connection may have open at once.
MAX_CHANNELS = 256
#: The largest request body relayed (the executor's own bound).
MAX_BODY = 16 * 1024 * 1024
#: The most bytes of one log line that travel (a longer one is cut there).
MAX_LOG_LINE = 8 * 1024
#: The most bytes of log lines one snapshot reply carries (the oldest lines go first).
MAX_LOG_REPLY = 512 * 1024
#: Binary frame kinds.
KIND_CHUNK = 1
KIND_BODY = 2
_HEADER = struct.Struct("!BI")

#: Sends one message on the connection: text (str) or a binary frame (bytes).
Send = Callable[[str | bytes], Awaitable[None]]


#: The node protocol version this side speaks, ``major.minor``. A minor version adds
#: optional fields and messages only; a major version may change what a known one means.
PROTOCOL_VERSION = "1.1"
#: What a peer that sends no version speaks: every release before versions were sent.
PROTOCOL_ABSENT = "1.0"
#: The header an agent names its version in when it dials (absent: :data:`PROTOCOL_ABSENT`).
PROTOCOL_HEADER = "Ficc-Node-Protocol"


def protocol_version(value: Any) -> tuple[int, int]:
    """``(major, minor)`` of a version a peer sent; None or absent is :data:`PROTOCOL_ABSENT`.

    A malformed one is :class:`ValueError`.
    """
    text = PROTOCOL_ABSENT if value is None else value
    if not isinstance(text, str):
        raise ValueError(f"a protocol version is a string like {PROTOCOL_VERSION!r}")
    major, dot, minor = text.strip().partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and len(text) <= 16):
        raise ValueError(f"{text!r} is not a protocol version like {PROTOCOL_VERSION!r}")
    return int(major), int(minor)


class ProtocolMismatch(FiccError):
    """The agent and the controller are more than one minor version apart (or of another
    major version): 426 ``protocol_version_unsupported``, with details ``agent_version``,
    ``controller_version``, ``accepted`` (the oldest and newest versions the refusing side
    takes) and ``upgrade`` (``agent`` or ``controller``: the older of the two)."""

    status = 426
    code = "protocol_version_unsupported"


def negotiate(agent: Any, controller: Any, *, refusing: str) -> tuple[int, int]:
    """The version an agent and a controller speak together: the older of the two.

    Each side accepts the other one minor version older or newer, of the same major
    version; ``refusing`` (``controller`` or ``agent``) names the side that checks.
    Anything else is :class:`ProtocolMismatch`, naming the side to upgrade. A malformed
    version is refused the same way.
    """
    ours_text = controller if refusing == "controller" else agent
    theirs_text = agent if refusing == "controller" else controller
    ours = protocol_version(ours_text)
    try:
        theirs = protocol_version(theirs_text)
    except ValueError:
        theirs = (-1, -1)
    if theirs[0] == ours[0] and abs(theirs[1] - ours[1]) <= 1:
        return min(ours, theirs)
    low, high = f"{ours[0]}.{max(ours[1] - 1, 0)}", f"{ours[0]}.{ours[1] + 1}"
    shown = {"agent": agent or PROTOCOL_ABSENT, "controller": controller or PROTOCOL_ABSENT}
    peer = "agent" if refusing == "controller" else "controller"
    upgrade = peer if theirs < ours else refusing  # the older side moves up
    raise ProtocolMismatch(
        f"the agent speaks node protocol {shown['agent']} and the controller "
        f"{shown['controller']}; the {refusing} accepts {low} to {high}: upgrade the "
        f'{upgrade} (docs/operations.md, "Upgrading a fleet": controllers first, then agents)',
        details={
            "agent_version": str(shown["agent"])[:16],
            "controller_version": str(shown["controller"])[:16],
            "accepted": [low, high],
            "upgrade": upgrade,
        },
    )


def at_least(version: tuple[int, int], text: str) -> bool:
    """Whether the negotiated ``version`` is ``text`` or newer (a field of that version
    may be sent)."""
    return version >= protocol_version(text)


def message_term(message: Mapping[str, Any]) -> int:
    """The controller term a message carries; 0 when it carries none.

    A controller built before there could be a second one sends no ``term``, and
    neither do tests of the wire: their messages are term 0, which every node
    accepts until a controller with a term has spoken to it.
    """
    term = message.get("term", 0)
    if not isinstance(term, int) or isinstance(term, bool) or term < 0:
        raise InvalidRequest("term must be a whole number", code="bad_command")
    return term


class StaleTerm(FiccError):
    """A ``launch`` or ``stop`` from a controller whose leader term this node has seen
    superseded: 409 with details ``term`` (the one sent) and ``current`` (the highest
    the node has seen). The sender is no longer the leader and must stop placing work.
    """

    status = 409
    code = "stale_term"

    def __init__(
        self,
        message: str | None = None,
        *,
        term: int | None = None,
        current: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        facts = {**(details or {})}
        if term is not None:
            facts["term"] = term
        if current is not None:
            facts["current"] = current
        if message is None:
            message = (
                f"this node has seen leader term {current}; a command of term {term} "
                "comes from a controller that is no longer the leader"
            )
        super().__init__(message, details=facts)


#: The refusals a node may report that come back as their own class, by code.
_KNOWN: dict[str, type[FiccError]] = {
    cls.code: cls
    for cls in (
        *(getattr(executor_errors, name) for name in executor_errors.__all__),
        digests.InvalidDigest,
        digests.UnsafePath,
        StaleTerm,
    )
}


class NodeGone(FiccError):
    """The node's agent cannot be reached: it is not connected here, or its connection closed.

    502 "agent on node gpu-1 is unreachable", with details ``node``, ``reason``
    (``agent_unreachable``), ``raw_error`` (``cause``) and, when the caller says,
    ``action``.
    """

    status = 502
    code = "node_unavailable"

    def __init__(
        self,
        cause: str = "its connection closed",
        *,
        node: str | None = None,
        action: str | None = None,
    ) -> None:
        details = {"node": node, "reason": "agent_unreachable", "raw_error": cause}
        if action is not None:
            details["action"] = action
        where = "the node" if node is None else f"node {node}"
        super().__init__(f"agent on {where} is unreachable", details=details)


class NodeTimeout(NodeGone):
    """The node's agent did not answer in time: 504 "agent on node gpu-1 did not answer
    'status' within 60 s", with details ``node``, ``reason`` (``agent_timeout``),
    ``operation`` and ``timeout``."""

    status = 504
    code = "node_timeout"

    def __init__(self, operation: str, timeout: float, *, node: str | None = None) -> None:
        where = "the node" if node is None else f"node {node}"
        FiccError.__init__(
            self,
            f"agent on {where} did not answer {operation!r} within {timeout:g} s",
            details={
                "node": node,
                "reason": "agent_timeout",
                "operation": operation,
                "timeout": timeout,
            },
        )


# -- errors ------------------------------------------------------------------------------------


def error_to_wire(exc: FiccError, *, details: bool = False) -> dict[str, Any]:
    """A refusal as it travels; with ``details``, its details too (a command's reply
    carries them to the controller, e.g. :class:`StaleTerm`'s terms; a relayed stream's
    refusal, which may reach an API client, does not)."""
    wire: dict[str, Any] = {"code": exc.code, "message": exc.message, "status": exc.status}
    if details and exc.details:
        wire["details"] = exc.details
    return wire


def error_from_wire(
    error: Mapping[str, Any], *, details: Mapping[str, Any] | None = None
) -> FiccError:
    """The refusal a node reported, as its own class when it is one we know.

    The node's own details (a newer node sends them) come first; ``details`` adds to them.
    """
    code = str(error.get("code", "node_error"))
    message = str(error.get("message", "the node refused the request"))
    sent = error.get("details")
    details = {**(sent if isinstance(sent, Mapping) else {}), **(details or {})}
    known = _KNOWN.get(code)
    if known is not None:
        return known(message, details=details)
    return FiccError(message, code=code, status=int(error.get("status", 502)), details=details)


def raise_for_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """Return a successful command reply; raise the node's refusal for a failed one."""
    if reply.get("ok"):
        return reply
    raise error_from_wire(reply.get("error") or {}, details={"node_error": True})


# -- command replies ----------------------------------------------------------------------------


def status_to_wire(status: AttemptStatus) -> dict[str, Any]:
    """An :class:`AttemptStatus` as JSON."""
    document = attrs.asdict(status)
    document["log_tail"] = list(status.log_tail)
    return document


#: The fields of an :class:`AttemptStatus`; a newer node's others are left out.
_STATUS_FIELDS = frozenset(field.name for field in attrs.fields(AttemptStatus))


def status_from_wire(document: dict[str, Any]) -> AttemptStatus:
    """An :class:`AttemptStatus` from its JSON (an older node's lacks ``pid``, ``health``...)."""
    known = {name: value for name, value in document.items() if name in _STATUS_FIELDS}
    return AttemptStatus(**{**known, "log_tail": tuple(document.get("log_tail", ()))})


def log_line(line: str) -> bytes:
    """One log line as it travels: UTF-8, cut at :data:`MAX_LOG_LINE` bytes."""
    return line.encode("utf-8", "replace")[:MAX_LOG_LINE]


def log_lines(lines: Sequence[str]) -> list[str]:
    """The newest of ``lines`` that fit one reply (:data:`MAX_LOG_REPLY`), each cut."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        data = log_line(line)
        size += len(data) + 1
        if size > MAX_LOG_REPLY:
            break
        kept.append(data.decode("utf-8", "replace"))
    kept.reverse()
    return kept


def decode(raw: str | bytes) -> dict[str, Any]:
    """One JSON text message; raises :class:`ValueError` unless it is an object."""
    message = json.loads(raw)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def heartbeat_attempts(value: Any) -> list[dict[str, Any]]:
    """The attempts of a heartbeat, checked and bounded; ``bad_heartbeat`` otherwise."""
    if not isinstance(value, list):
        raise InvalidRequest("attempts must be a list", code="bad_heartbeat")
    found = []
    for item in value:
        if not isinstance(item, dict):
            raise InvalidRequest("each attempt must be an object", code="bad_heartbeat")
        try:
            found.append(
                {
                    "attempt_id": str(item["attempt_id"])[:128],
                    "generation": int(item["generation"]),
                    "plan_digest": str(item["plan_digest"])[:80],
                    "provider": str(item["provider"])[:64],
                    "state": str(item["state"])[:32],
                }
            )
        except (KeyError, TypeError, ValueError):
            raise InvalidRequest(
                "an attempt needs attempt_id, generation, plan_digest, provider and state",
                code="bad_heartbeat",
            ) from None
    return found


# -- relayed streams ----------------------------------------------------------------------------


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    """One binary relay frame."""
    return _HEADER.pack(kind, channel) + payload


def unframe(data: bytes) -> tuple[int, int, bytes] | None:
    """(kind, channel, payload) of a binary frame, or None when it is too short to be one."""
    if len(data) < _HEADER.size:
        return None
    kind, channel = _HEADER.unpack_from(data)
    return kind, channel, data[_HEADER.size :]


def relay_message(channel: int, **fields: Any) -> str:
    """A relay control message on ``channel``."""
    return json.dumps({"type": "relay", "ch": channel, **fields})


def event_to_wire(channel: int, event: ReadEvent) -> str | bytes:
    """A stream's event as the agent sends it: a chunk frame or a relay message."""
    if isinstance(event, BodyChunk):
        return frame(KIND_CHUNK, channel, event.data)
    if isinstance(event, ResponseHead):
        return relay_message(
            channel,
            event="head",
            status=event.status,
            headers=[list(pair) for pair in event.headers],
        )
    if isinstance(event, EndOfStream):
        return relay_message(channel, event="end")
    failed: StreamFailed = event
    return relay_message(channel, event="failed", code=failed.code, message=failed.message)
