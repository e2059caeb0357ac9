"""An HTTP response as the events it arrives in: its head, its body's chunks, its end.

These are the events of an endpoint stream (:mod:`ficc_core.executor`, which adds
:class:`~ficc_core.executor.types.StreamFailed` and exports all four through
``ficc_core``); :class:`~ficc_core.http1.engine_codec.ResponseParser` makes them from an
engine's bytes, so they live here, below the executor.
"""

from __future__ import annotations

import attrs

__all__ = ["BodyChunk", "EndOfStream", "ResponseHead"]


@attrs.frozen(kw_only=True)
class ResponseHead:
    """The first event of a stream: the engine's status and response headers."""

    status: int
    headers: tuple[tuple[str, str], ...]


@attrs.frozen
class BodyChunk:
    """Part of the response body, at most 64 KiB."""

    data: bytes


@attrs.frozen
class EndOfStream:
    """The response body is complete; the stream is closed."""
