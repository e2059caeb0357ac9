"""One admitted request, from admission to its end.

What the checks made of the body is fixed here at admission (:class:`.checks.Prepared`:
``payload``, ``streaming``, ``hide_usage`` and the estimates). Each stage after that
keeps its own state in its own small object: the relay's engine stream of the current
attempt is a :class:`.relay.Stream` (``stream``), the quota gate's reservation is its
own type; admission records the slot (``replica``, ``band``) and accounting the
tokens the engine reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from ..auth import Principal
    from ..quotas.gate import Reservation
    from ..routing.bands import Band
    from ..routing.live import LiveReplica, LiveService
    from .affinity import Prompt
    from .relay import Stream


@attrs.define(eq=False)
class Request:
    """One admitted request of ``actor`` to ``path`` of a service, on one replica at a time.

    :ivar view: the service's view it was admitted under (the generation it streams from).
    :ivar headers: the client's headers routing reads (lower-case names, first values).
    :ivar started: admission time, on the trio clock.
    :ivar deadline: the request deadline on the trio clock (``math.inf`` without one).
    :ivar replica: the replica holding (or last holding) its slot.
    :ivar stream: the engine stream of the current attempt (the relay's, None before one).
    :ivar finished: slot freed and accounted; nothing more happens to it.
    :ivar deadline_bound: what set ``deadline``: ``request_deadline`` or ``timeout_total``,
        of ``deadline_seconds``.
    :ivar streaming: the answer is a server-sent-event stream.
    :ivar band: the priority band it is served in (decided when it first asks for a slot).
    """

    service_id: str
    path: str
    actor: Principal
    view: LiveService
    headers: Mapping[str, str]
    started: float
    deadline: float
    queue_wait: float = 0.0
    replica: LiveReplica | None = None
    stream: Stream | None = None
    status: int = 0
    finished: bool = False
    holds_slot: bool = False
    #: The gateway asked the engine for the stream's usage event the client did not ask
    #: for (``stream_options.include_usage``): it is accounted, not relayed.
    hide_usage: bool = False
    # -- resilience: which bound the request and its next engine event are held to --------
    deadline_bound: str = "request_deadline"
    deadline_seconds: float = math.inf
    streaming: bool = False
    # -- priority bands (admission.py, docs/priority.md) --
    band: Band | None = None
    #: It waited for its service's activation (activation.py): the slot queue takes it
    #: whatever its bound (the activation queue already bounded it), so a request held
    #: while the engine loaded is not refused once it is ready.
    woken: bool = False
    # -- routing (gateway/scoring.py, gateway/affinity.py) ----------------------------------
    #: The bytes sent to the engine, until the router hashed its prompt (then released).
    payload: bytes = b""
    #: The prompt's prefix hashes, computed at the first pick (None until then).
    prefix: Prompt | None = None
    # -- quotas (ficc_core/quotas, docs/limits.md) ------------------------------------------
    #: What the quota gate reserved at admission (its own type), settled at the end.
    reservation: Reservation | None = None
    #: The prompt's tokens as estimated at admission (the tokenizer's count, else bytes/4)
    #: and the completion's (``max_tokens``, else ``max_output``, else what the context
    #: leaves): what the gate reserves until the engine reports its usage.
    prompt_estimate: int = 0
    completion_estimate: int = 0
    #: The tokens the engine reported (prompt, completion), once the request settled.
    tokens: tuple[int | None, int | None] = (None, None)

    @property
    def ended(self) -> bool:
        """The current attempt's engine stream ended (by itself, or cancelled)."""
        stream = self.stream
        return stream is not None and stream.ended
