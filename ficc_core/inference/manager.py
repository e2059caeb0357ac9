"""Managed inference services: what operators ask, recorded through the :class:`Store`.

Everything durable lives in three tables (:mod:`~ficc_core.inference.repository`):
the services (the specification, ``desired`` and observed ``state``, ``revision``
and ``generation``), the reservations (what each replica holds on its node) and
the attempts (each try at running a replica, with its fence and state). Every
change of a service or of one of its attempts bumps the service's revision; a
request naming another revision is refused with 409 and the current one. The
:class:`~ficc_core.inference.reconciliation.reconciler.Reconciler` drives the attempts towards
``desired``; this module records what operators ask and tells it (``notify``).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from ..auth import secrets as sec
from ..base.errors import Conflict, FiccError, InvalidRequest, NotFound
from ..contributors import list_nodes
from ..events import Event, EventKind
from ..routing.live import Admission, LiveTable
from ..schema import Specification, canonical_json
from ..store import Store, Transaction
from ..usage import UsageLedger, UsageSummary
from . import history, repository
from .errors import service_not_found
from .operations import rollout
from .reconciliation.on_demand import retry_warning
from .records import (
    Desired,
    PlacementNode,
    RolloutRecord,
    ServiceDetail,
    ServiceRecord,
    ServiceState,
)
from .scaling import changes as scaling
from .specification.admission import check_specification, place, plan_in, reserve
from .specification.placement import Plan
from .specification.replicas import initial
from .specification.suggest import Suggestion, complete, memory_warnings, recomputed_limits
from .specification.transitions import (
    check_revision,
    next_generation,
    require_released,
    require_stopped,
    start_in,
    writable,
)

if TYPE_CHECKING:
    from ..auth import AuthService, Principal
    from ..auth.records import Credential, Revocation
    from ..plugins import AdapterRegistry
    from .operations.moves import Mover
    from .operations.rollout import Choice, Restarter
    from .scaling.autoscaler import Autoscaler
    from .specification.model_context import ModelContext, ModelContexts

CONTROL_ACTIONS = ("start", "drain", "stop", "remove")
#: What each control action that closes admission leaves the gateway admitting.
CLOSES_ADMISSION: dict[str, Admission] = {
    "drain": "draining",
    "stop": "stopped",
    "remove": "stopped",
}


@attrs.frozen(kw_only=True)
class Preview:
    """A checked specification and where it would go (nothing written).

    :ivar suggested: the JSON paths that were filled in a partial specification.
    :ivar warnings: what would likely fail although it fits (``memory_limit_low``).
    """

    specification: Specification
    plan: Plan
    suggested: tuple[str, ...] = ()
    warnings: tuple[dict[str, Any], ...] = ()


def _detail(tx: Transaction, service_id: str, project_id: str | None = None) -> ServiceDetail:
    found = repository.detail(tx, service_id)
    if found is None or (project_id is not None and found.service.project_id != project_id):
        raise service_not_found(service_id)
    return found


@attrs.frozen(kw_only=True)
class RolloutStart:
    """A rollout begun: the service, its pending rollout (None: a scale-down applied at
    once), the strategy chosen and the memory limits recomputed."""

    detail: ServiceDetail
    rollout: RolloutRecord | None
    choice: Choice
    adjusted: tuple[dict[str, Any], ...] = ()


class InferenceManager:
    """Operators' requests about inference services.

    :param store: where services, attempts and reservations are recorded.
    :param auth: issues and lists the services' invoke credentials.
    :param adapters: the installed engine adapters (a specification's engine is one).
    :param contexts: the verified models as services need them.
    :param live: the routing view; a control action that closes admission closes it
        at once, before the reconciler's next step.
    :param usage: the invoke requests' usage ledger.
    :param gateway: the invoke seam, held for the contract's
        ``service.inference.gateway`` (inference never calls it, nor imports its package).
    :param mover: runs moves of running services' replicas.
    :param restarter: runs restarts of running services' replicas.
    :param autoscaler: wakes and scales services with ``scaling``.
    :param drain_timeout: how long a drain waits for in-flight requests, in seconds.
    :param notify: called with a service's id after every write (the reconciler acts).
    :param clock: seconds since the epoch, for the records' times.
    """

    def __init__(
        self,
        *,
        store: Store,
        auth: AuthService,
        adapters: AdapterRegistry,
        contexts: ModelContexts,
        live: LiveTable,
        usage: UsageLedger,
        gateway: Any,
        mover: Mover,
        restarter: Restarter,
        autoscaler: Autoscaler,
        drain_timeout: float,
        notify: Callable[[str], None] = lambda _service_id: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.auth = auth
        self.adapters = adapters
        self.contexts = contexts
        self.live = live
        self.usage = usage
        #: The invoke seam (the contract's ``service.inference.gateway.invoke``).
        self.gateway = gateway
        self.mover = mover
        self.restarter = restarter
        self.autoscaler = autoscaler
        self.drain_timeout = drain_timeout
        self.notify = notify
        self.clock = clock

    async def _resolved(self, project_id: str, document: Any) -> Any:
        """``document`` with its ``model_id`` a model ID (a model name is resolved)."""
        if isinstance(document, dict) and isinstance(document.get("model_id"), str):
            model_id = await self.contexts.resolve(project_id, document["model_id"])
            if model_id != document["model_id"]:
                return {**document, "model_id": model_id}
        return document

    async def _check(self, project_id: str, document: Any) -> tuple[Specification, ModelContext]:
        return await check_specification(
            await self._resolved(project_id, document),
            project_id,
            adapters=self.adapters,
            contexts=self.contexts,
        )

    # -- preview and submit --------------------------------------------------------------------

    async def preview(self, principal: Principal, document: Any) -> Preview:
        """Complete (a partial one), validate and place a specification; write nothing."""
        document = await self._resolved(principal.project_id, document)
        suggestion = Suggestion(document=document)
        if isinstance(document, dict) and isinstance(document.get("model_id"), str):
            model = await self.contexts.get(principal.project_id, document["model_id"])

            def suggest(tx: Transaction) -> Suggestion:
                nodes = [PlacementNode.of(n) for n in list_nodes(tx)]
                return complete(document, model, nodes, repository.reservations_but(tx, ""))

            suggestion = await self.store.read(suggest)
        specification, model = await self._check(principal.project_id, suggestion.document)
        result = await self.store.read(lambda tx: plan_in(tx, "", specification, model))
        return Preview(
            specification=specification,
            plan=result,
            suggested=suggestion.suggested,
            warnings=(
                *memory_warnings(specification, model),
                *self._retry_warning(specification),
                *suggestion.notes,
            ),
        )

    def _retry_warning(self, specification: Specification) -> tuple[dict[str, Any], ...]:
        """An on-demand idle_timeout shorter than the activation retry window (a warning)."""
        config = self.autoscaler.config
        warning = retry_warning(
            specification,
            idle_timeout=config.idle_timeout,
            activation_retry=config.activation_retry,
        )
        return () if warning is None else (warning,)

    async def create(self, principal: Principal, document: Any) -> ServiceDetail:
        """Submit a service: the service, its replicas and reservations in one transaction.

        The service starts ``stopped`` at generation 0, holding its reservations;
        ``control/start`` starts generation 1.
        """
        specification, model = await self._check(principal.project_id, document)
        service_id = "svc_" + sec.new_id()
        now = self.clock()
        spec_json = canonical_json(specification).decode("utf-8")

        def write(tx: Transaction) -> ServiceDetail:
            taken = repository.alias_holder(tx, principal.project_id, specification.alias)
            if taken is not None:
                raise Conflict(
                    f"this project already has a service with alias {specification.alias!r} "
                    f"({taken}); replace it or choose another alias",
                    code="service_exists",
                    details={"id": taken, "alias": specification.alias},
                )
            result = place(tx, service_id, specification, model)
            repository.insert_service(
                tx,
                ServiceRecord(
                    id=service_id,
                    project_id=principal.project_id,
                    alias=specification.alias,
                    model_id=specification.model_id,
                    spec=spec_json,
                    revision=1,
                    generation=0,
                    desired=Desired.STOPPED,
                    state=ServiceState.STOPPED,
                    reason=None,
                    plan_digest=result.digest,
                    created_at=now,
                    updated_at=now,
                ),
            )
            repository.insert_reservations(tx, result.reservations, now)
            detail = _detail(tx, service_id)
            history.service_event(
                tx,
                detail.service,
                EventKind.SERVICE_CREATED,
                now,
                reason="created",
                message=f"service {specification.alias} created with "
                f"{len(specification.placements)} replicas (stopped, holding its reservations)",
                details={"alias": specification.alias, "actor": principal.id},
            )
            return detail

        detail = await self.store.write(write)
        self.notify(service_id)
        return detail

    # -- reading -------------------------------------------------------------------------------

    async def list(self, project_id: str) -> list[ServiceDetail]:
        """Every service of the project."""

        def read(tx: Transaction) -> list[ServiceDetail]:
            return [_detail(tx, sid) for sid in repository.service_ids(tx, project_id)]

        return await self.store.read(read)

    async def get(self, project_id: str | None, service_id: str) -> ServiceDetail:
        """One service (of ``project_id``; any project when None)."""
        return await self.store.read(lambda tx: _detail(tx, service_id, project_id))

    # -- replace and control ---------------------------------------------------------------------

    async def replace(
        self, principal: Principal, service_id: str, revision: int, document: Any
    ) -> ServiceDetail:
        """Replace a stopped service's specification and start its next generation."""
        await self.get(principal.project_id, service_id)
        specification, model = await self._check(principal.project_id, document)
        now = self.clock()
        spec_json = canonical_json(specification).decode("utf-8")

        def write(tx: Transaction) -> ServiceDetail:
            record = writable(tx, principal.project_id, service_id)
            check_revision(record, revision)
            require_stopped(record, "replace")
            if specification.alias != record.alias:
                taken = repository.alias_holder(
                    tx, principal.project_id, specification.alias, other_than=service_id
                )
                if taken is not None:
                    raise Conflict(
                        f"alias {specification.alias!r} is taken by service {taken}",
                        code="service_exists",
                        details={"id": taken, "alias": specification.alias},
                    )
            require_released(tx, service_id, acknowledge=False)
            generation = next_generation(tx, record)
            repository.delete_rollout(tx, service_id)
            active = initial(specification, record.pinned)
            result = reserve(
                tx, service_id, specification, model, now, generation=generation, held=active
            )
            repository.set_scale(tx, service_id, active, now, decided=False, bump=False)
            repository.update_service(
                tx,
                attrs.evolve(
                    record,
                    alias=specification.alias,
                    model_id=specification.model_id,
                    spec=spec_json,
                    plan_digest=result.digest,
                    generation=generation,
                    desired=Desired.RUNNING,
                    state=ServiceState.STARTING,
                    reason=None,
                ),
                now,
            )
            detail = _detail(tx, service_id)
            history.service_event(
                tx,
                detail.service,
                EventKind.SERVICE_REPLACED,
                now,
                reason="replaced",
                message=f"specification replaced; generation {detail.service.generation} starts",
                details={"alias": specification.alias, "actor": principal.id},
            )
            return detail

        detail = await self.store.write(write)
        self.notify(service_id)
        return detail

    async def control(
        self,
        principal: Principal,
        service_id: str,
        action: str,
        *,
        revision: int,
        acknowledge_unknown: bool = False,
    ) -> ServiceDetail:
        """Start, drain, stop or remove a service at ``revision``."""
        if action not in CONTROL_ACTIONS:
            raise NotFound(
                f"no control action {action!r}; use one of {', '.join(CONTROL_ACTIONS)}",
                code="unknown_action",
            )
        if acknowledge_unknown and action != "start":
            raise InvalidRequest(
                f"acknowledge_unknown applies to start only, not {action}",
                code="acknowledge_not_allowed",
                details={"errors": [{"path": "$.acknowledge_unknown", "message": "start only"}]},
            )
        model: ModelContext | None = None
        specification: Specification | None = None
        if action == "start":
            current = await self.get(principal.project_id, service_id)
            specification = current.service.specification()
            model = await self.contexts.get(principal.project_id, specification.model_id)
        now = self.clock()

        def write(tx: Transaction) -> ServiceDetail:
            record = writable(tx, principal.project_id, service_id)
            check_revision(record, revision)
            if action == "start":
                assert specification is not None and model is not None
                unreleased = repository.unreleased_attempts(tx, service_id)
                start_in(tx, record, specification, model, acknowledge=acknowledge_unknown, now=now)
                for attempt in unreleased:  # given up (acknowledged unknown): each an event
                    given_up = repository.attempt(tx, attempt.attempt_id)
                    if given_up is not None:
                        history.attempt_changed(tx, record, attempt, given_up, now)
            elif action == "drain":
                if record.desired != Desired.RUNNING:
                    raise Conflict(
                        f"service {service_id!r} is {record.desired}; only a running service "
                        "drains",
                        code="invalid_transition",
                        details={"desired": record.desired, "state": record.state},
                    )
                changed = attrs.evolve(
                    record,
                    desired=Desired.DRAINING,
                    state=ServiceState.DRAINING,
                    drain_deadline=now + self.drain_timeout,
                )
                repository.update_service(tx, changed, now)
            elif action == "stop":
                if record.desired in (Desired.STOPPED, Desired.REMOVED):
                    return _detail(tx, service_id)
                changed = attrs.evolve(record, desired=Desired.STOPPED, state=ServiceState.STOPPING)
                repository.update_service(tx, changed, now)
            else:  # remove
                changed = attrs.evolve(record, desired=Desired.REMOVED, state=ServiceState.REMOVING)
                repository.update_service(tx, changed, now)
            if action != "start" and record.active:
                # Nothing runs once it stopped; the next start begins from ``min``.
                repository.set_scale(tx, service_id, (), now, decided=False, bump=False)
            detail = _detail(tx, service_id)
            history.service_changed(
                tx, record, detail.service, now, action=action, actor=principal.id
            )
            return detail

        detail = await self.store.write(write)
        if action in CLOSES_ADMISSION:
            # The gateway acts on the answer before the reconciler's next step does.
            self.live.close(service_id, CLOSES_ADMISSION[action], detail.service.revision)
        self.notify(service_id)
        return detail

    async def pin(
        self, principal: Principal, service_id: str, pinned: bool, revision: int | None = None
    ) -> ServiceDetail:
        """Pin a scaled service (never scaled to zero; an idle one wakes now) or unpin it."""
        now = self.clock()

        def write(tx: Transaction) -> ServiceDetail:
            record = writable(tx, principal.project_id, service_id)
            if revision is not None:
                check_revision(record, revision)
            if record.specification().scaling is None:
                raise FiccError(
                    f"service {record.alias!r} has no scaling: every placement runs while it "
                    "runs, so there is nothing to pin",
                    code="not_scaled",
                    status=422,
                    details={"service": service_id},
                )
            scaling.set_pin(tx, record, pinned, principal.id, now)
            return _detail(tx, service_id)

        detail = await self.store.write(write)
        self.notify(service_id)
        if pinned and detail.service.desired == Desired.RUNNING:
            await self.autoscaler.look(service_id)  # an idle pinned service wakes now
            detail = await self.get(principal.project_id, service_id)
        return detail

    # -- operations on a running service ------------------------------------------------------

    async def rollout(
        self,
        principal: Principal,
        service_id: str,
        revision: int,
        document: Any,
        strategy: str = "auto",
        keep_limits: bool = False,
    ) -> RolloutStart:
        """Start a running service's next generation by the rollout's strategy, or apply a
        scale-down at once (see :mod:`~ficc_core.inference.operations.rollout`)."""
        current = (await self.get(principal.project_id, service_id)).service.specification()
        specification, model = await self._check(principal.project_id, document)
        adjusted: list[dict[str, Any]] = []
        if not keep_limits:
            specification, adjusted = recomputed_limits(current, specification, model)
        now = self.clock()

        def write(tx: Transaction) -> RolloutStart:
            started, choice = rollout.begin(
                tx,
                principal.project_id,
                service_id,
                revision,
                specification,
                model,
                now=now,
                timeout=self.mover.ready_timeout,
                strategy=strategy,
            )
            return RolloutStart(
                detail=_detail(tx, service_id),
                rollout=started,
                choice=choice,
                adjusted=tuple(adjusted),
            )

        result = await self.store.write(write)
        self.notify(service_id)
        return result

    async def rollout_preview(
        self,
        principal: Principal,
        service_id: str,
        document: Any,
        strategy: str = "auto",
        keep_limits: bool = False,
    ) -> tuple[Preview, Choice, builtins.list[dict[str, Any]]]:
        """A rollout's preview: the plan once it serves alone (the service's own
        reservations not counted against it), the strategy it takes (with the plan beside
        the serving generation) and the memory limits it recomputes."""
        current = (await self.get(principal.project_id, service_id)).service.specification()
        specification, model = await self._check(principal.project_id, document)
        adjusted: list[dict[str, Any]] = []
        if not keep_limits:
            specification, adjusted = recomputed_limits(current, specification, model)
        choice = await self.store.read(
            lambda tx: rollout.preview(
                tx, principal.project_id, service_id, specification, model, strategy
            )
        )
        warnings = (*memory_warnings(specification, model), *self._retry_warning(specification))
        preview = Preview(specification=specification, plan=choice.alone, warnings=warnings)
        return preview, choice, adjusted

    async def rollout_status(self, project_id: str, service_id: str) -> dict[str, Any]:
        """The service's pending rollout (if any) beside its generation, state and reason."""

        def read(tx: Transaction) -> dict[str, Any]:
            record = _detail(tx, service_id, project_id).service
            return rollout.rollout_view(repository.rollout(tx, service_id), record)

        return await self.store.read(read)

    async def events(
        self,
        project_id: str,
        service_id: str,
        *,
        after: int | None,
        limit: int,
        before: int | None = None,
    ) -> builtins.list[Event]:
        """The service's events (with its nodes' state changes), oldest first: the first
        ``limit`` after ``after``, or the newest ``limit`` (before ``before``)."""

        def read(tx: Transaction) -> list[Event]:
            found = _detail(tx, service_id, project_id)
            nodes = {a.node_id for a in found.attempts} | {r.node_id for r in found.reservations}
            return history.read(tx, found.service, nodes, after=after, limit=limit, before=before)

        return await self.store.read(read)

    async def usage_summary(
        self, project_id: str, service_id: str, since: float | None = None
    ) -> UsageSummary:
        """What the service's invoke requests used: totals, per credential, the latest."""
        await self.get(project_id, service_id)
        return await self.usage.summary(service_id, since=since)

    # -- invoke tokens -----------------------------------------------------------------------------

    async def create_token(
        self,
        principal: Principal,
        service_id: str,
        *,
        lifetime: float,
        name: str | None,
        band: str | None = None,
    ) -> tuple[Credential, str]:
        """Issue one invoke credential bound to this service (shown once), in ``band``
        (None: the project's)."""
        detail = await self.get(principal.project_id, service_id)
        return await self.auth.create_credential(
            principal.project_id,
            name=name or f"invoke-{detail.service.alias}"[:64],
            generated_name=not name,
            scopes=frozenset({"inference:invoke"}),
            user_id=principal.user_id,
            lifetime=lifetime,
            issuer=principal,
            service_id=service_id,
            band=band,
        )

    async def list_tokens(self, principal: Principal, service_id: str) -> builtins.list[Credential]:
        """The invoke credentials bound to this service."""
        await self.get(principal.project_id, service_id)
        return [
            credential
            for credential in await self.auth.list_credentials(principal.project_id)
            if credential.service_id == service_id
        ]

    async def revoke_token(
        self, principal: Principal, service_id: str, token_id: str
    ) -> Revocation:
        """Revoke one of this service's invoke credentials, by ID or name (in-flight
        requests end too)."""
        await self.get(principal.project_id, service_id)
        try:
            found = await self.auth.get_credential(principal.project_id, token_id)
        except NotFound:
            found = None
        if found is None or found.service_id != service_id:
            raise NotFound(
                f"no invoke credential {token_id!r} for service {service_id!r}",
                code="credential_not_found",
                details={"id": token_id},
            )
        return await self.auth.revoke_credential(principal.project_id, found.id)
