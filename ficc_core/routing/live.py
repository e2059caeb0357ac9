"""The live routing table: what the reconciler publishes and the gateway routes by.

The reconciler owns the durable record of services and replicas (in the store);
this in-memory table is its projection for the request path, so no SQLite read
happens per request. For each service it holds the current generation, whether
new requests are admitted, and the *ready* replicas of that generation with their
fences. Every publish replaces the service's entry and wakes whoever waits on
:meth:`LiveTable.changed` (the gateway re-checks in-flight streams then).

A control action that closes admission (drain, stop, remove) does not wait for
the reconciler: the manager calls :meth:`LiveTable.close` before it answers, so
once the answer is out the gateway already refuses new requests. The table then
ignores any view the reconciler computed from an older record of the service
(its ``revision``), so a step that was under way cannot open admission again.

The gateway reports in-flight requests back so a drain can wait until they
finish: :meth:`LiveTable.enter` when it admits one, :meth:`LiveTable.leave` when
the response ends (its ``aclose``); :meth:`LiveTable.request` is the same pair as a
``with`` block, for a request served within one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs
import trio

from ..schema import Fence

#: ``serving``: new requests admitted; ``draining``: in-flight requests may finish,
#: new ones are refused; ``stopped``: nothing is admitted and in-flight streams end.
Admission = Literal["serving", "draining", "stopped"]
_NARROWNESS = {"serving": 0, "draining": 1, "stopped": 2}
#: Where a scaled service that may run no replica stands (:attr:`LiveService.activation`).
Activation = Literal["", "idle", "activating", "failed"]


@attrs.frozen(kw_only=True)
class ActivationFailure:
    """Why a scaled service's last activation failed, as a refusal says it: the
    envelope's code and message and its structured details (``reasons``: each
    placement's refusal for want of room; ``attempt_reason``: the replica's own
    failure)."""

    code: str
    message: str
    details: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class LiveReplica:
    """One ready replica the gateway may send requests to.

    :ivar index: the replica's position in the specification's placements.
    :ivar node_id: the node whose endpoint action reaches its engine.
    :ivar fence: the attempt's fence; every endpoint call carries it.
    """

    index: int
    node_id: str
    fence: Fence

    @property
    def key(self) -> str:
        """A stable key for per-replica accounting (the attempt ID)."""
        return self.fence.attempt_id


@attrs.frozen(kw_only=True)
class LiveService:
    """A service as the request path sees it.

    :ivar id: the service ID.
    :ivar project_id: the project that owns it.
    :ivar alias: the model name clients send (and the engine serves).
    :ivar generation: the current generation; replicas of others are never routed to.
    :ivar admission: see :data:`Admission`.
    :ivar concurrency: requests one replica serves at once.
    :ivar request_deadline: seconds a request may take, or None.
    :ivar capabilities: what the engine serves (``chat``, ``streaming``, ``embeddings``).
    :ivar replicas: the ready replicas new requests go to: per replica, its newest
        ready attempt (of ``generation``; a rollout's next generation joins once all its
        replicas are ready).
    :ivar retiring: ready attempts a successor replaced (a move's source, a rollout's
        previous generation): no new request goes there, the ones in flight finish.
    :ivar names: more model names the project endpoint routes here, in order (the
        specification's ``aliases``, then the model's manifest name).
    :ivar description: the specification's description, for ``/v1/models``.
    :ivar context_length: tokens one request may use, prompt and completion together
        (the specification's, else its context bounded by the model's trained context).
    :ivar max_output: tokens one completion may generate, or None for no bound.
    :ivar fallbacks: aliases of the project's services tried in order when this one
        cannot serve a request (project endpoint only).
    :ivar model_id: the registry model it serves, and ``model_name`` its name (what
        ``pricing`` is looked up by; empty when the model is gone).
    :ivar created: when the service was created, in Unix seconds (``/v1/models``).
    :ivar scaled: the service has ``scaling``: how many replicas run follows demand.
    :ivar activation: for a scaled service that may run no replica (``min = 0``, not
        pinned): ``idle`` (none runs; the next request wakes it), ``activating`` (woken,
        none ready yet), ``failed`` (the last activation failed: ``activation_error``),
        or ``""`` (it runs a replica, or cannot be woken).
    :ivar activation_error: why the last activation failed: every request waiting for
        it gets this at once, and every request until ``activation_retry`` has passed.
    """

    id: str
    project_id: str
    alias: str
    generation: int
    admission: Admission
    concurrency: int
    request_deadline: float | None = None
    capabilities: tuple[str, ...] = ()
    replicas: tuple[LiveReplica, ...] = ()
    retiring: tuple[LiveReplica, ...] = ()
    names: tuple[str, ...] = ()
    description: str | None = None
    context_length: int = 0
    max_output: int | None = None
    fallbacks: tuple[str, ...] = ()
    created: int = 0
    model_id: str = ""
    model_name: str = ""
    scaled: bool = False
    activation: Activation = ""
    activation_error: ActivationFailure | None = None

    @property
    def wakes(self) -> bool:
        """Whether a request finding no ready replica asks for an activation and waits for
        it (instead of being refused ``no_ready_replica``). A ``failed`` one is asked too:
        the activation answers the recent failure's reason at once, or, once
        ``activation_retry`` passed, tries again."""
        return self.admission == "serving" and self.activation in ("idle", "activating", "failed")

    def serves(self, key: str) -> bool:
        """Whether a request in flight on the attempt ``key`` may go on (routed or retiring)."""
        return any(r.key == key for r in self.replicas) or any(r.key == key for r in self.retiring)


class _InFlight:
    """One request counted in flight for a ``with`` block (:meth:`LiveTable.request`)."""

    __slots__ = ("service_id", "table")

    def __init__(self, table: LiveTable, service_id: str) -> None:
        self.table = table
        self.service_id = service_id

    def __enter__(self) -> None:
        self.table.enter(self.service_id)

    def __exit__(self, *exc_info: object) -> None:
        self.table.leave(self.service_id)


class LiveTable:
    """Published service views, change events, and in-flight request counts."""

    def __init__(self) -> None:
        self._services: dict[str, LiveService] = {}
        self._changed: dict[str, trio.Event] = {}
        self._inflight: dict[str, int] = {}
        self._idle: dict[str, trio.Event] = {}
        #: The revision of the last control action that closed each service's admission.
        self._closed_at: dict[str, int] = {}
        #: Counts every change of any view: what is derived from all of them (the
        #: gateway's name index) is rebuilt when it moved.
        self.version = 0
        #: Replicas (attempt IDs) taken out of routing by their liveness, and why.
        self._suspended: dict[str, str] = {}
        #: Set when the gateway saw a replica fail (a scrape, a timeout): its next
        #: liveness probe comes at once.
        self._suspects: dict[str, trio.Event] = {}

    # -- the reconciler's and the manager's side ----------------------------------------

    def publish(self, service: LiveService, *, revision: int | None = None) -> None:
        """Replace the view of ``service.id`` and wake its waiters (no-op when unchanged).

        :param revision: the revision of the service record the view was computed
            from; a view older than the last :meth:`close` is ignored.
        """
        if revision is not None and revision < self._closed_at.get(service.id, revision):
            return
        if self._suspended:
            service = _without(service, self._suspended)
        if self._services.get(service.id) == service:
            return
        self._services[service.id] = service
        self._wake(service.id)

    def close(self, service_id: str, admission: Admission, revision: int) -> None:
        """Narrow the admission of ``service_id`` now: a control action at ``revision``
        answered (``stopped`` also drops its replicas, so streams in flight end)."""
        self._closed_at[service_id] = max(self._closed_at.get(service_id, revision), revision)
        view = self._services.get(service_id)
        if view is None or _NARROWNESS[view.admission] >= _NARROWNESS[admission]:
            return
        if admission == "stopped":
            view = attrs.evolve(view, admission=admission, replicas=(), retiring=())
        else:
            view = attrs.evolve(view, admission=admission)
        self._services[service_id] = view
        self._wake(service_id)

    def remove(self, service_id: str) -> None:
        """Forget a removed service; its waiters wake and find nothing."""
        self._services.pop(service_id, None)
        self._closed_at.pop(service_id, None)
        self._wake(service_id)

    def _wake(self, service_id: str) -> None:
        self.version += 1
        event = self._changed.pop(service_id, None)
        if event is not None:
            event.set()

    # -- liveness (:mod:`.liveness`) ----------------------------------------------------

    def suspend(self, service_id: str, key: str, reason: str) -> None:
        """Take the replica ``key`` out of routing now (``reason``: why, e.g.
        ``unresponsive``): no new request goes there and the gateway ends the ones in
        flight on it; it stays out of every later view until :meth:`resume`."""
        self._suspended[key] = reason
        view = self._services.get(service_id)
        if view is not None:
            trimmed = _without(view, self._suspended)
            if trimmed != view:
                self._services[service_id] = trimmed
                self._wake(service_id)

    def resume(self, key: str) -> None:
        """The replica ``key`` may be routed again (the next publish adds it back)."""
        self._suspended.pop(key, None)

    def suspended(self, key: str) -> str | None:
        """Why the replica ``key`` is out of routing by its liveness, or None."""
        return self._suspended.get(key)

    def suspect(self, key: str) -> None:
        """The gateway saw the replica ``key`` fail (a /metrics read, a request timeout):
        whoever probes its liveness probes it now."""
        event = self._suspects.get(key)
        if event is not None:
            event.set()

    def suspicion(self, key: str) -> trio.Event:
        """An event set at the next :meth:`suspect` of ``key`` (the liveness prober waits on it)."""
        event = self._suspects.get(key)
        if event is None or event.is_set():
            event = self._suspects[key] = trio.Event()
        return event

    def forget_suspicion(self, key: str) -> None:
        """Nobody probes ``key`` any more."""
        self._suspects.pop(key, None)
        self._suspended.pop(key, None)

    # -- the gateway's side -------------------------------------------------------------

    def get(self, service_id: str) -> LiveService | None:
        """The service's current view, or None when it is not published."""
        return self._services.get(service_id)

    def services(self) -> tuple[LiveService, ...]:
        """Every published view, as a copy (the project endpoint's index is rebuilt from it
        when the table changes; the gateway's background tasks walk it across awaits)."""
        return tuple(self._services.values())

    def changed(self, service_id: str) -> trio.Event:
        """An event set at the next change of ``service_id``'s view."""
        event = self._changed.get(service_id)
        if event is None:
            event = self._changed[service_id] = trio.Event()
        return event

    def inflight(self, service_id: str) -> int:
        """Requests to ``service_id`` being served now."""
        return self._inflight.get(service_id, 0)

    def request(self, service_id: str) -> _InFlight:
        """Count one request to ``service_id`` in flight for the duration of a ``with`` block."""
        return _InFlight(self, service_id)

    def enter(self, service_id: str) -> None:
        """Count one more request to ``service_id`` in flight; :meth:`leave` ends it, once."""
        self._inflight[service_id] = self._inflight.get(service_id, 0) + 1

    def leave(self, service_id: str) -> None:
        """A request counted by :meth:`enter` ended; wake :meth:`wait_idle` at zero."""
        left = self._inflight[service_id] - 1
        if left:
            self._inflight[service_id] = left
        else:
            del self._inflight[service_id]
            idle = self._idle.pop(service_id, None)
            if idle is not None:
                idle.set()

    async def wait_idle(self, service_id: str) -> None:
        """Return once no request to ``service_id`` is in flight."""
        while self.inflight(service_id):
            event = self._idle.get(service_id)
            if event is None:
                event = self._idle[service_id] = trio.Event()
            await event.wait()

    async def wait_all_idle(self) -> None:
        """Return once no request to any service is in flight."""
        while self._inflight:
            await self.wait_idle(next(iter(self._inflight)))


def _without(view: LiveService, suspended: Mapping[str, str]) -> LiveService:
    """``view`` without the replicas ``suspended`` (routed or retiring)."""
    replicas = tuple(r for r in view.replicas if r.key not in suspended)
    retiring = tuple(r for r in view.retiring if r.key not in suspended)
    if len(replicas) == len(view.replicas) and len(retiring) == len(view.retiring):
        return view
    return attrs.evolve(view, replicas=replicas, retiring=retiring)
