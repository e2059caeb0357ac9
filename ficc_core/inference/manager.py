"""Managed inference services: validation, placement, transactional submit, revisions, control.

Everything durable lives in three tables: ``inference_services`` (the specification,
``desired`` and observed ``state``, ``revision`` and ``generation``),
``inference_reservations`` (what each replica holds on its node) and
``inference_attempts`` (each try at running a replica, with its fence and state).
Every change of a service or of one of its attempts bumps the service's
revision; a request naming another revision is refused with 409 and the current
one. The :class:`~ficc_core.inference.reconciler.Reconciler` drives the attempts
towards ``desired``; this module only records what operators ask.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..auth import secrets as sec
from ..errors import Conflict, FiccError, InvalidRequest, NotFound
from ..models.records import ModelState
from ..schema import (
    FieldError,
    JobInput,
    ModelManifest,
    ModelMetadata,
    ModelRecord,
    SchemaError,
    Specification,
    canonical_json,
    structure,
    unstructure,
)
from ..schema._convert import MAX_SAFE_INTEGER, integer
from ..store import Store, Transaction
from .live import LiveTable
from .placement import (
    NodeState,
    Plan,
    node_state_from_row,
    plan,
    reservation_from_row,
    reservation_row,
)
from .usage import UsageLedger

if TYPE_CHECKING:
    from ..auth import AuthService, Principal
    from ..auth.records import Credential, Revocation
    from ..config import Config
    from ..contributors import NodeRegistry
    from ..models.blobs import BlobStore
    from ..models.registry import ModelRegistry
    from ..plugins import AdapterRegistry

log = logging.getLogger("ficc.inference")

#: What operators ask of a service.
DESIRED = ("stopped", "running", "draining", "removed")
#: Replica (attempt) states. ``unknown``: the node was lost while it ran.
REPLICA_STATES = (
    "pending",
    "staging",
    "launching",
    "loading",
    "ready",
    "draining",
    "stopping",
    "stopped",
    "failed",
    "unknown",
)
#: Attempt states in which the engine may be running (the executor has not confirmed an end).
ACTIVE = frozenset({"pending", "staging", "launching", "loading", "ready", "draining", "stopping"})
CONTROL_ACTIONS = ("start", "drain", "stop", "remove")
#: What each control action that closes admission leaves the gateway admitting.
CLOSES_ADMISSION = {"drain": "draining", "stop": "stopped", "remove": "stopped"}


class UnknownOutcome(FiccError):
    """A stopped service has a replica whose end was never confirmed."""

    status = 409
    code = "inference_unknown_outcome"


class StaleRevision(FiccError):
    """The request named a revision other than the service's current one."""

    status = 409
    code = "stale_revision"


class PlacementFailed(FiccError):
    """At least one replica does not fit on its node."""

    status = 409
    code = "placement_failed"


def _not_found(service_id: str) -> NotFound:
    return NotFound(
        f"no inference service {service_id!r} in this project",
        code="service_not_found",
        details={"id": service_id},
    )


def _field_errors(errors: list[dict[str, str]], what: str = "specification") -> SchemaError:
    return SchemaError(errors, what=what)


@attrs.frozen(kw_only=True)
class ModelContext:
    """A verified model as the adapters and the launch need it."""

    record: ModelRecord
    size: int = integer(0, MAX_SAFE_INTEGER)
    inputs: tuple[JobInput, ...]
    blobs: Mapping[str, int]
    directories: Mapping[str, Mapping[str, tuple[str, int]]]


@attrs.frozen(kw_only=True)
class ControlBody:
    """``POST /inference/{id}/control/{action}``."""

    revision: int = integer(0, MAX_SAFE_INTEGER)
    acknowledge_unknown: bool = False


@attrs.frozen(kw_only=True)
class ReplaceBody:
    """``PUT /inference/{id}``: the revision read, and the new specification."""

    revision: int = integer(0, MAX_SAFE_INTEGER)
    spec: dict[str, Any]


def _positive_lifetime(_instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise FieldError(attribute.name, "must be a positive number of seconds")


@attrs.frozen(kw_only=True)
class TokenBody:
    """``POST /inference/{id}/tokens``: how long the invoke credential lives, in seconds."""

    lifetime: float = attrs.field(validator=_positive_lifetime)
    name: str | None = None


def service_view(
    row: Mapping[str, Any],
    attempts: list[Mapping[str, Any]],
    reservations: list[Mapping[str, Any]],
) -> dict[str, Any]:
    """A service as the API shows it: specification, revision, generation, replicas."""
    spec = json.loads(row["spec"])
    held = {r["replica"]: reservation_from_row(r).to_json() for r in reservations}
    latest: dict[int, Mapping[str, Any]] = {}
    for attempt in attempts:
        current = latest.get(attempt["replica"])
        if current is None or (attempt["generation"], attempt["number"]) > (
            current["generation"],
            current["number"],
        ):
            latest[attempt["replica"]] = attempt
    replicas = []
    for index, placement in enumerate(spec["placements"]):
        attempt = latest.get(index)
        replicas.append(
            {
                "index": index,
                "node_id": placement["node_id"],
                "state": "stopped" if attempt is None else attempt["state"],
                "reason": None if attempt is None else attempt["reason"],
                "message": None if attempt is None else attempt["message"],
                "generation": None if attempt is None else attempt["generation"],
                "attempt": None if attempt is None else attempt["number"],
                "attempt_id": None if attempt is None else attempt["attempt_id"],
                "plan_digest": None if attempt is None else attempt["plan_digest"],
                "reservation": held.get(index),
            }
        )
    unknown = [a["attempt_id"] for a in attempts if a["state"] == "unknown" and not a["released"]]
    reason = row["reason"]
    if unknown and row["state"] in ("stopped", "removing"):
        # Derived from the attempts held now, never stored: it cannot outlive them.
        held = len({a["replica"] for a in attempts if a["attempt_id"] in unknown})
        reason = f"{held} replica(s) have an unknown outcome; " + (
            "start with acknowledge_unknown: true to give them up"
            if row["state"] == "stopped"
            else "the service is removed once their node is back or revoked"
        )
    return {
        "id": row["id"],
        "project_id": row["project_id"],
        "alias": row["alias"],
        "model_id": row["model_id"],
        "engine": spec["engine"],
        "spec": spec,
        "revision": row["revision"],
        "generation": row["generation"],
        "desired": row["desired"],
        "state": row["state"],
        "reason": reason,
        "plan_digest": row["plan_digest"],
        "replicas": replicas,
        "unknown_attempts": unknown,
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def read_service(tx: Transaction, service_id: str, project_id: str | None = None) -> dict:
    """One service's view inside a transaction (any project when ``project_id`` is None)."""
    row = tx.fetch_one("SELECT * FROM inference_services WHERE id = ?", (service_id,))
    if row is None or (project_id is not None and row["project_id"] != project_id):
        raise _not_found(service_id)
    attempts = tx.fetch_all(
        "SELECT * FROM inference_attempts WHERE service_id = ?"
        " ORDER BY replica, generation, number",
        (service_id,),
    )
    reservations = tx.fetch_all(
        "SELECT * FROM inference_reservations WHERE service_id = ? ORDER BY replica",
        (service_id,),
    )
    return service_view(row, attempts, reservations)


def bump(tx: Transaction, service_id: str, now: float, **fields: Any) -> None:
    """Record a change of the service: set ``fields`` and move to the next revision."""
    assignments = "".join(f", {name} = ?" for name in fields)
    tx.execute(
        f"UPDATE inference_services SET revision = revision + 1, updated_at = ?{assignments}"
        " WHERE id = ?",
        (now, *fields.values(), service_id),
    )


def _check_revision(row: Mapping[str, Any], revision: int) -> None:
    if row["revision"] != revision:
        raise StaleRevision(
            f"service {row['id']!r} is at revision {row['revision']}, not {revision}; read it "
            "again and retry with the current revision",
            details={"revision": row["revision"], "requested": revision},
        )


def _nodes(tx: Transaction, node_ids: list[str]) -> dict[str, NodeState]:
    found = {}
    for node_id in node_ids:
        row = tx.fetch_one("SELECT * FROM nodes WHERE id = ?", (node_id,))
        if row is not None:
            found[node_id] = node_state_from_row(row)
    return found


def _plan_in(
    tx: Transaction, service_id: str, specification: Specification, model: ModelContext
) -> Plan:
    """Plan ``specification`` beside every reservation but the service's own, in ``tx``."""
    existing = [
        reservation_from_row(row)
        for row in tx.fetch_all(
            "SELECT * FROM inference_reservations WHERE service_id != ?", (service_id,)
        )
    ]
    node_ids = list(dict.fromkeys(p.node_id for p in specification.placements))
    return plan(
        service_id,
        specification,
        _nodes(tx, node_ids),
        existing,
        model_bytes=model.size,
        model_revision=model.record.revision,
    )


def _refuse_plan(result: Plan) -> PlacementFailed:
    reasons = result.reasons()
    first = reasons[0]["message"]
    more = f" (and {len(reasons) - 1} more reason(s))" if len(reasons) > 1 else ""
    return PlacementFailed(
        f"the service does not fit: {first}{more}; preview it to see every reason",
        details={"reasons": reasons, "plan": result.to_json()},
    )


def _write_reservations(tx: Transaction, result: Plan, now: float) -> None:
    for reservation in result.reservations:
        tx.execute(
            "INSERT INTO inference_reservations (service_id, replica, node_id, cpus,"
            " memory_bytes, disk_bytes, gpus, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (*reservation_row(reservation), now),
        )


def _reserve(
    tx: Transaction,
    service_id: str,
    specification: Specification,
    model: ModelContext,
    now: float,
) -> Plan:
    """Place ``specification`` and replace the service's reservations with the plan's."""
    result = _plan_in(tx, service_id, specification, model)
    if not result.fits:
        raise _refuse_plan(result)
    tx.execute("DELETE FROM inference_reservations WHERE service_id = ?", (service_id,))
    _write_reservations(tx, result, now)
    return result


class InferenceManager:
    """Operators' requests about inference services, recorded through the :class:`Store`."""

    def __init__(
        self,
        *,
        store: Store,
        config: Config,
        auth: AuthService,
        models: ModelRegistry,
        blobs: BlobStore,
        contributors: NodeRegistry,
        live: LiveTable,
        adapters: Callable[[], AdapterRegistry] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.config = config
        self.auth = auth
        self.models = models
        self.blobs = blobs
        self.contributors = contributors
        self.live = live
        self.clock = clock
        self._adapters_factory = adapters
        self._adapters: AdapterRegistry | None = None
        self._metadata: dict[str, ModelMetadata] = {}
        #: Set by the reconciler: called after every write so it acts at once.
        self.on_change: Callable[[str], None] = lambda _service_id: None
        #: The gateway (``service.inference.gateway.invoke(...)``); set by ``open_service``.
        self.gateway: Any = None
        #: The reconciler driving these services (set when the controller runs one).
        self.reconciler: Any = None
        #: Every invoke request's tokens and latency, written in batches.
        self.usage = UsageLedger(store)

    # -- adapters and models ---------------------------------------------------------------

    @property
    def adapters(self) -> AdapterRegistry:
        """The installed engine adapters (loaded once, on first use)."""
        if self._adapters is None:
            if self._adapters_factory is not None:
                self._adapters = self._adapters_factory()
            else:
                from ..plugins import build_plugin_manager

                self._adapters = build_plugin_manager().adapters
        return self._adapters

    async def model_context(self, project_id: str, model_id: str) -> ModelContext:
        """The verified model ``model_id`` of the project, with its job inputs.

        :raises SchemaError: at ``$.model_id`` when it is missing or not verified.
        """
        try:
            model = await self.models.get(project_id, model_id)
        except NotFound:
            raise _field_errors(
                [{"path": "$.model_id", "message": f"no model {model_id!r} in this project"}]
            ) from None
        if model.state != ModelState.VERIFIED:
            raise _field_errors(
                [
                    {
                        "path": "$.model_id",
                        "message": f"model {model_id!r} is {model.state}, not verified; "
                        "upload or acquire its files first",
                    }
                ]
            )
        manifest = structure(model.manifest, ModelManifest, what="stored manifest")
        files = {f.path: f for f in manifest.files}
        if manifest.format == "gguf":
            [weights] = [f for f in manifest.files if f.path.endswith(".gguf")] or [
                manifest.files[0]
            ]
            path = self.blobs.published_path(weights.sha256)
            inputs = (JobInput(id="model", path=str(path), digest="sha256:" + weights.sha256),)
            directories: dict[str, dict[str, tuple[str, int]]] = {}
            metadata = await self._gguf_metadata(model.digest, path)
        else:
            tree = {p: (f.sha256, f.size) for p, f in files.items()}
            # Where this machine assembles it (the embedded node reads it in place);
            # a remote node stages the same files and assembles its own copy.
            inputs = (JobInput(id="model", path=str(self.blobs.tree_path(tree))),)
            directories = {"model": tree}
            metadata = ModelMetadata()
        record = ModelRecord(
            id=model.id, revision=model.digest, manifest=manifest, metadata=metadata
        )
        return ModelContext(
            record=record,
            size=sum(f.size for f in manifest.files),
            inputs=inputs,
            blobs={"sha256:" + f.sha256: f.size for f in manifest.files},
            directories=directories,
        )

    async def _gguf_metadata(self, revision: str, path: Any) -> ModelMetadata:
        cached = self._metadata.get(revision)
        if cached is not None:
            return cached
        from ..models.gguf import InvalidGguf, read_gguf_file

        try:
            header = await trio.to_thread.run_sync(read_gguf_file, path)
        except (InvalidGguf, OSError) as exc:
            log.warning("cannot read the GGUF header of %s: %s", path, exc)
            return ModelMetadata()
        metadata = ModelMetadata(
            architecture=header.architecture,
            context_length=header.context_length,
            parameter_count=header.parameter_count,
            quantisation=header.quantisation,
            chat_template=header.chat_template,
            embedding=header.embedding,
        )
        self._metadata[revision] = metadata
        return metadata

    # -- validation ----------------------------------------------------------------------------

    async def validate(self, project_id: str, document: Any) -> tuple[Specification, ModelContext]:
        """Structure and check a specification; every refusal names its field path."""
        specification = structure(document, Specification, what="specification")
        errors: list[dict[str, str]] = []
        if specification.engine not in self.adapters:
            installed = ", ".join(sorted(self.adapters)) or "none"
            errors.append(
                {
                    "path": "$.engine",
                    "message": f"no engine adapter {specification.engine!r} is installed "
                    f"(installed: {installed}); see 'ficc plugins'",
                }
            )
        if specification.tensor_split is not None:
            for index, placement in enumerate(specification.placements):
                gpus = len(placement.limits.gpus)
                if gpus != len(specification.tensor_split):
                    errors.append(
                        {
                            "path": "$.tensor_split",
                            "message": f"lists {len(specification.tensor_split)} share(s), but "
                            f"placement {index} reserves {gpus} GPU(s); give one share per GPU",
                        }
                    )
                    break
        model = await self.model_context(project_id, specification.model_id)
        if not errors:
            adapter = self.adapters[specification.engine]
            for index, placement in enumerate(specification.placements):
                try:
                    adapter.job(specification, model.record, placement, model.inputs)
                except FieldError as exc:
                    errors.append({"path": f"$.{exc.field}", "message": exc.message})
                    break
                except FiccError:
                    raise
                except Exception as exc:  # a third-party adapter's own refusal
                    errors.append(
                        {
                            "path": "$",
                            "message": f"the {specification.engine} adapter refused placement "
                            f"{index}: {type(exc).__name__}: {exc}",
                        }
                    )
                    break
        if errors:
            raise _field_errors(errors)
        return specification, model

    # -- preview and submit --------------------------------------------------------------------

    async def preview(self, principal: Principal, document: Any) -> dict[str, Any]:
        """Validate and place a specification; write nothing."""
        specification, model = await self.validate(principal.project_id, document)
        result = await self.store.read(lambda tx: _plan_in(tx, "", specification, model))
        return {"spec": unstructure(specification), **result.to_json()}

    async def create(self, principal: Principal, document: Any) -> dict[str, Any]:
        """Submit a service: the service, its replicas and reservations in one transaction.

        The service starts ``stopped`` at generation 0, holding its reservations;
        ``control/start`` starts generation 1.
        """
        specification, model = await self.validate(principal.project_id, document)
        service_id = "svc_" + sec.new_id()
        now = self.clock()
        spec_json = canonical_json(specification).decode("utf-8")

        def write(tx: Transaction) -> dict[str, Any]:
            taken = tx.fetch_one(
                "SELECT id FROM inference_services WHERE project_id = ? AND alias = ?",
                (principal.project_id, specification.alias),
            )
            if taken is not None:
                raise Conflict(
                    f"this project already has a service with alias {specification.alias!r} "
                    f"({taken['id']}); replace it or choose another alias",
                    code="service_exists",
                    details={"id": taken["id"], "alias": specification.alias},
                )
            result = _plan_in(tx, service_id, specification, model)
            if not result.fits:
                raise _refuse_plan(result)
            tx.execute(
                "INSERT INTO inference_services (id, project_id, alias, model_id, spec, revision,"
                " generation, desired, state, reason, plan_digest, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, 1, 0, 'stopped', 'stopped', NULL, ?, ?, ?)",
                (
                    service_id,
                    principal.project_id,
                    specification.alias,
                    specification.model_id,
                    spec_json,
                    result.digest,
                    now,
                    now,
                ),
            )
            _write_reservations(tx, result, now)
            return read_service(tx, service_id)

        view = await self.store.write(write)
        self.on_change(service_id)
        return view

    # -- reading -------------------------------------------------------------------------------

    async def list(self, project_id: str) -> list[dict[str, Any]]:
        """Every service of the project."""

        def read(tx: Transaction) -> list[dict[str, Any]]:
            rows = tx.fetch_all(
                "SELECT id FROM inference_services WHERE project_id = ? ORDER BY created_at, id",
                (project_id,),
            )
            return [read_service(tx, row["id"]) for row in rows]

        return await self.store.read(read)

    async def get(self, project_id: str | None, service_id: str) -> dict[str, Any]:
        """One service (of ``project_id``; any project when None)."""
        return await self.store.read(lambda tx: read_service(tx, service_id, project_id))

    # -- replace and control ---------------------------------------------------------------------

    async def replace(
        self, principal: Principal, service_id: str, revision: int, document: Any
    ) -> dict[str, Any]:
        """Replace a stopped service's specification and start its next generation."""
        current = await self.get(principal.project_id, service_id)
        specification, model = await self.validate(principal.project_id, document)
        now = self.clock()
        spec_json = canonical_json(specification).decode("utf-8")

        def write(tx: Transaction) -> dict[str, Any]:
            row = self._row(tx, principal.project_id, service_id)
            _check_revision(row, revision)
            self._require_stopped(tx, row, "replace")
            if specification.alias != row["alias"]:
                taken = tx.fetch_one(
                    "SELECT id FROM inference_services WHERE project_id = ? AND alias = ?"
                    " AND id != ?",
                    (principal.project_id, specification.alias, service_id),
                )
                if taken is not None:
                    raise Conflict(
                        f"alias {specification.alias!r} is taken by service {taken['id']}",
                        code="service_exists",
                        details={"id": taken["id"], "alias": specification.alias},
                    )
            self._require_released(tx, service_id, acknowledge=False)
            result = _reserve(tx, service_id, specification, model, now)
            bump(
                tx,
                service_id,
                now,
                alias=specification.alias,
                model_id=specification.model_id,
                spec=spec_json,
                plan_digest=result.digest,
                generation=row["generation"] + 1,
                desired="running",
                state="starting",
                reason=None,
            )
            return read_service(tx, service_id)

        del current
        view = await self.store.write(write)
        self.on_change(service_id)
        return view

    async def control(
        self,
        principal: Principal,
        service_id: str,
        action: str,
        body: ControlBody,
    ) -> dict[str, Any]:
        """Start, drain, stop or remove a service at ``body.revision``."""
        if action not in CONTROL_ACTIONS:
            raise NotFound(
                f"no control action {action!r}; use one of {', '.join(CONTROL_ACTIONS)}",
                code="unknown_action",
            )
        if body.acknowledge_unknown and action != "start":
            raise InvalidRequest(
                f"acknowledge_unknown applies to start only, not {action}",
                code="acknowledge_not_allowed",
                details={"errors": [{"path": "$.acknowledge_unknown", "message": "start only"}]},
            )
        model: ModelContext | None = None
        specification: Specification | None = None
        if action == "start":
            row = await self.get(principal.project_id, service_id)
            specification = structure(row["spec"], Specification, what="stored specification")
            model = await self.model_context(principal.project_id, specification.model_id)
        now = self.clock()

        def write(tx: Transaction) -> dict[str, Any]:
            row = self._row(tx, principal.project_id, service_id)
            _check_revision(row, body.revision)
            if action == "start":
                assert specification is not None and model is not None
                self._start(tx, row, specification, model, body.acknowledge_unknown, now)
            elif action == "drain":
                if row["desired"] != "running":
                    raise Conflict(
                        f"service {service_id!r} is {row['desired']}; only a running service "
                        "drains",
                        code="invalid_transition",
                        details={"desired": row["desired"], "state": row["state"]},
                    )
                bump(
                    tx,
                    service_id,
                    now,
                    desired="draining",
                    state="draining",
                    drain_deadline=now + self.config.drain_timeout,
                )
            elif action == "stop":
                if row["desired"] in ("stopped", "removed"):
                    return read_service(tx, service_id)
                bump(tx, service_id, now, desired="stopped", state="stopping")
            else:  # remove
                bump(tx, service_id, now, desired="removed", state="removing")
            return read_service(tx, service_id)

        view = await self.store.write(write)
        if action in CLOSES_ADMISSION:
            # The gateway acts on the answer before the reconciler's next step does.
            self.live.close(service_id, CLOSES_ADMISSION[action], view["revision"])
        self.on_change(service_id)
        return view

    def _row(self, tx: Transaction, project_id: str, service_id: str) -> dict[str, Any]:
        row = tx.fetch_one("SELECT * FROM inference_services WHERE id = ?", (service_id,))
        if row is None or row["project_id"] != project_id:
            raise _not_found(service_id)
        if row["desired"] == "removed":
            raise Conflict(
                f"service {service_id!r} is being removed",
                code="service_removing",
                details={"state": row["state"]},
            )
        return row

    def _require_stopped(self, tx: Transaction, row: Mapping[str, Any], what: str) -> None:
        if row["desired"] != "stopped" or row["state"] != "stopped":
            raise Conflict(
                f"service {row['id']!r} is {row['state']}; stop it before you {what} it",
                code="invalid_transition",
                details={"desired": row["desired"], "state": row["state"]},
            )

    def _require_released(self, tx: Transaction, service_id: str, *, acknowledge: bool) -> None:
        attempts = tx.fetch_all(
            "SELECT * FROM inference_attempts WHERE service_id = ? AND released = 0",
            (service_id,),
        )
        unknown = [a for a in attempts if a["state"] == "unknown"]
        busy = [a for a in attempts if a["state"] != "unknown"]
        if busy:
            raise Conflict(
                f"service {service_id!r} still has {len(busy)} attempt(s) its executors have "
                "not confirmed ended; wait for them to stop",
                code="attempts_not_released",
                details={"attempts": [a["attempt_id"] for a in busy]},
            )
        if unknown and not acknowledge:
            raise UnknownOutcome(
                f"service {service_id!r} had {len(unknown)} replica(s) whose outcome is unknown "
                "(their node was lost while they ran); they may still be running or may have "
                "served requests. Start with acknowledge_unknown: true to give them up and "
                "start new attempts (no earlier request is replayed)",
                details={
                    "attempts": [
                        {
                            "attempt_id": a["attempt_id"],
                            "replica": a["replica"],
                            "node_id": a["node_id"],
                            "generation": a["generation"],
                        }
                        for a in unknown
                    ]
                },
            )

    def _start(
        self,
        tx: Transaction,
        row: Mapping[str, Any],
        specification: Specification,
        model: ModelContext,
        acknowledge: bool,
        now: float,
    ) -> None:
        service_id = row["id"]
        self._require_stopped(tx, row, "start")
        self._require_released(tx, service_id, acknowledge=acknowledge)
        if acknowledge:
            # Give up every attempt whose end was never confirmed: its node stops it if it
            # ever reconnects, and nothing it served is replayed.
            for attempt in tx.fetch_all(
                "SELECT * FROM inference_attempts WHERE service_id = ? AND released = 0",
                (service_id,),
            ):
                tx.execute(
                    "UPDATE node_assignments SET wanted = 0, reason = 'acknowledged_unknown',"
                    " updated_at = ? WHERE node_id = ? AND attempt_id = ?",
                    (now, attempt["node_id"], attempt["attempt_id"]),
                )
            tx.execute(
                "UPDATE inference_attempts SET released = 1, reason = 'acknowledged_unknown',"
                " updated_at = ? WHERE service_id = ? AND released = 0",
                (now, service_id),
            )
        result = _reserve(tx, service_id, specification, model, now)
        bump(
            tx,
            service_id,
            now,
            generation=row["generation"] + 1,
            plan_digest=result.digest,
            desired="running",
            state="starting",
            reason=None,
        )

    async def usage_summary(
        self, project_id: str, service_id: str, since: float | None = None
    ) -> dict[str, Any]:
        """What the service's invoke requests used: totals, per credential, the latest."""
        await self.get(project_id, service_id)
        return await self.usage.summary(service_id, since=since)

    # -- invoke tokens -----------------------------------------------------------------------------

    async def create_token(
        self, principal: Principal, service_id: str, body: TokenBody
    ) -> tuple[Credential, str]:
        """Issue one invoke credential bound to this service (shown once)."""
        service = await self.get(principal.project_id, service_id)
        return await self.auth.create_credential(
            principal.project_id,
            name=body.name or f"invoke-{service['alias']}"[:64],
            scopes=frozenset({"inference:invoke"}),
            user_id=principal.user_id,
            lifetime=body.lifetime,
            issuer=principal,
            service_id=service_id,
        )

    async def list_tokens(self, principal: Principal, service_id: str) -> list[Credential]:
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
        """Revoke one of this service's invoke credentials (in-flight requests end too)."""
        tokens = {t.id for t in await self.list_tokens(principal, service_id)}
        if token_id not in tokens:
            raise NotFound(
                f"no invoke credential {token_id!r} for service {service_id!r}",
                code="credential_not_found",
                details={"id": token_id},
            )
        return await self.auth.revoke_credential(principal.project_id, token_id)
