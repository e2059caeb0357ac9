"""The values executor providers return: attempt status and endpoint read events.

A stream's events are :mod:`ficc_core.http1.events`' three and :class:`StreamFailed`.
"""

from __future__ import annotations

from typing import Literal

import attrs

# A response's events are HTTP's (the engine codec makes them, below this package).
from ..http1.events import BodyChunk, EndOfStream, ResponseHead

__all__ = [
    "AttemptState",
    "AttemptStatus",
    "BodyChunk",
    "EndOfStream",
    "ReadEvent",
    "ResponseHead",
    "StreamFailed",
]

#: ``starting`` until the readiness probe answers 200, then ``ready``; ``exited`` when the
#: engine ended by itself (or was killed by a limit); ``stopped`` after ``stop()``;
#: ``failed`` when it never became ready (start-up timeout, refused launch).
AttemptState = Literal["starting", "ready", "exited", "stopped", "failed"]


@attrs.frozen(kw_only=True)
class AttemptStatus:
    """Where one attempt stands.

    :ivar attempt_id: the attempt's ID (from its fence).
    :ivar state: see :data:`AttemptState`.
    :ivar exit_code: the engine's exit status once it ended by itself, else None.
    :ivar signal: the signal number that ended it, when one did.
    :ivar reason: a machine word for why it ended: ``memory_limit``, ``exited``,
        ``killed``, ``readiness_timeout``, ``stopped``, ``provider_restarted``; None while it runs.
    :ivar message: a sentence a person can act on, when it ended.
    :ivar log_tail: the last lines of its log, when it ended.
    :ivar pid: the engine's process ID on its node, where the provider knows it.
    :ivar started_at: when the engine process started (epoch seconds, the node's clock).
    :ivar health: the readiness probe's last answer: an HTTP status (``"200"``,
        ``"503"``) or what kept it from one (``"connection refused"``, ``"no answer"``).
    :ivar health_at: when the probe got that answer (epoch seconds, the node's clock).

    The last four are None where the provider does not know them (or an older node
    did not say).
    """

    attempt_id: str
    state: AttemptState
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    log_tail: tuple[str, ...] = ()
    pid: int | None = None
    started_at: float | None = None
    health: str | None = None
    health_at: float | None = None

    @property
    def running(self) -> bool:
        """Whether the engine is still starting or ready."""
        return self.state in ("starting", "ready")


@attrs.frozen(kw_only=True)
class StreamFailed:
    """The stream ended with an error (engine gone, idle expiry, bad response)."""

    code: str
    message: str


ReadEvent = ResponseHead | BodyChunk | EndOfStream | StreamFailed


def is_terminal(event: ReadEvent) -> bool:
    """Whether ``event`` ends its stream (:class:`EndOfStream` or :class:`StreamFailed`)."""
    return isinstance(event, EndOfStream | StreamFailed)
