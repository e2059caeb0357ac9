"""The reconciler: drives every inference service's attempts towards what operators asked.

One driver task per service reads the durable record, acts, publishes the
service's routing view to the :class:`~ficc_core.inference.live.LiveTable`, and
waits for a change (or a short period). For a service that should run, one
replica task per placement launches attempts and watches them:

``pending`` → ``launching`` (inputs are staged on the node, the adapter's job is
launched through the node's agent) → ``loading`` (the engine is up, its readiness
probe not yet answering) → ``ready``. An attempt that ends by itself or never
becomes ready is ``failed`` and the replica retries with a new attempt after a
capped exponential backoff. An attempt whose node is lost while it runs becomes
``unknown`` and is never retried by itself: a stop, then a start with
``acknowledge_unknown: true``, gives it up.

Stopping asks each attempt's node to stop it; a reservation is released only when
the executor confirms the attempt ended. Draining publishes ``draining`` (new
requests refused: the manager already closed admission when the drain answered),
waits for in-flight requests up to the drain bound, then stops.

An unexpected exception while driving one service (a defect, not a refusal) is
logged with its traceback and shown as the service's reason; that service's driver
starts again after the same backoff, and every other service goes on.

The record survives a controller restart: a new reconciler finds the attempts
that were running and watches them (adopts them) instead of launching new ones;
the node's reconnection keeps the ones the controller still wants.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import FiccError
from ..schema import Specification, Workload, canonical_json, structure
from ..store import Transaction
from .live import LiveReplica, LiveService
from .manager import ACTIVE, InferenceManager, bump

if TYPE_CHECKING:
    from ..schema import Fence
    from .manager import ModelContext

log = logging.getLogger("ficc.inference")

#: Attempt states that count as ended by the executor (its reservation may go).
ENDED = frozenset({"stopped", "failed"})


def _new_attempt_id(service_id: str, index: int, generation: int, number: int) -> str:
    return f"{service_id}.r{index}.g{generation}.a{number}.{secrets.token_hex(3)}"


@attrs.define
class _ReplicaTask:
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)


@attrs.define
class _Driver:
    scope: trio.CancelScope
    wake: trio.Event = attrs.Factory(trio.Event)
    #: Set (with no checkpoint before the task ends) once the driver decided to finish:
    #: a later wake starts a new driver instead of waking this one.
    finished: bool = False
    replicas: dict[int, _ReplicaTask] = attrs.Factory(dict)
    capabilities: dict[int, tuple[str, ...]] = attrs.Factory(dict)
    #: The reason shown for the last unexpected exception, until a step goes through.
    fault: str | None = None


@attrs.define
class _Backoff:
    """A capped exponential wait: one second, doubling up to ``cap``."""

    cap: float
    delay: float = 1.0

    async def wait(self) -> None:
        await trio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)

    def reset(self) -> None:
        self.delay = 1.0


class Reconciler:
    """Drive desired state to actual state for every inference service.

    :param manager: the service records and the collaborators (store, contributors, live).
    :param period: seconds between checks when nothing wakes a driver.
    :param ready_period: seconds between status checks of a ready attempt.
    """

    def __init__(
        self,
        manager: InferenceManager,
        *,
        period: float = 1.0,
        ready_period: float = 1.0,
        loading_period: float = 0.2,
    ) -> None:
        self.manager = manager
        self.store = manager.store
        self.contributors = manager.contributors
        self.live = manager.live
        self.period = period
        self.ready_period = ready_period
        self.loading_period = loading_period
        self.retry_max = max(1.0, manager.config.replica_retry_max)
        self._drivers: dict[str, _Driver] = {}
        self._nursery: trio.Nursery | None = None
        self._models: dict[tuple[str, str], ModelContext] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start a driver for every service on record; start more as services are created."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.manager.on_change = self.wake
            ids = await self.store.read(
                lambda tx: [r["id"] for r in tx.fetch_all("SELECT id FROM inference_services")]
            )
            for service_id in ids:
                self.wake(service_id)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self.manager.on_change = lambda _service_id: None
                self._nursery = None

    def wake(self, service_id: str) -> None:
        """Make the service's driver act now (starting one if there is none)."""
        driver = self._drivers.get(service_id)
        if driver is not None and not driver.finished:
            driver.wake.set()
            return
        if self._nursery is None:
            return
        driver = self._drivers[service_id] = _Driver(scope=trio.CancelScope())
        self._nursery.start_soon(self._drive, service_id, driver)

    # -- reading and writing -------------------------------------------------------------------

    async def _read(self, service_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        def read(tx: Transaction) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
            row = tx.fetch_one("SELECT * FROM inference_services WHERE id = ?", (service_id,))
            attempts = tx.fetch_all(
                "SELECT * FROM inference_attempts WHERE service_id = ?"
                " ORDER BY replica, generation, number",
                (service_id,),
            )
            return row, attempts

        return await self.store.read(read)

    async def _set_attempt(self, service_id: str, attempt_id: str, **fields: Any) -> None:
        now = self.manager.clock()

        def write(tx: Transaction) -> None:
            row = tx.fetch_one(
                "SELECT * FROM inference_attempts WHERE attempt_id = ?", (attempt_id,)
            )
            if row is None or all(row[name] == value for name, value in fields.items()):
                return
            assignments = ", ".join(f"{name} = ?" for name in fields)
            tx.execute(
                f"UPDATE inference_attempts SET {assignments}, updated_at = ? WHERE attempt_id = ?",
                (*fields.values(), now, attempt_id),
            )
            bump(tx, service_id, now)

        await self.store.write(write)
        driver = self._drivers.get(service_id)
        if driver is not None:
            driver.wake.set()

    async def _set_service(self, service_id: str, **fields: Any) -> None:
        now = self.manager.clock()

        def write(tx: Transaction) -> None:
            row = tx.fetch_one("SELECT * FROM inference_services WHERE id = ?", (service_id,))
            if row is None or all(row[name] == value for name, value in fields.items()):
                return
            bump(tx, service_id, now, **fields)

        await self.store.write(write)

    async def _model(self, row: Mapping[str, Any], specification: Specification) -> ModelContext:
        key = (row["project_id"], specification.model_id)
        model = self._models.get(key)
        if model is None:
            model = await self.manager.model_context(row["project_id"], specification.model_id)
            self._models[key] = model
        return model

    # -- one service -----------------------------------------------------------------------------

    async def _drive(self, service_id: str, driver: _Driver) -> None:
        backoff = _Backoff(self.retry_max)
        try:
            with driver.scope:
                while True:
                    began = trio.current_time()
                    fault: BaseException | None = None
                    try:
                        if await self._session(service_id, driver):
                            return
                    except* Exception as group:
                        fault = group  # cancellation is not caught: it goes on up
                    # A defect met while driving this one service (a bug, never an
                    # expected refusal) must not end the others or the API: it is
                    # shown on the service and the driver starts again after a backoff.
                    if trio.current_time() - began > self.retry_max:
                        backoff.reset()  # it had run well for a while
                    driver.replicas.clear()  # their tasks ended with the session
                    await self._fault(service_id, driver, fault, backoff.delay)
                    if driver.finished:
                        return  # it had decided to end: the next wake starts a new driver
                    await backoff.wait()
        finally:
            if self._drivers.get(service_id) is driver:
                del self._drivers[service_id]

    async def _session(self, service_id: str, driver: _Driver) -> bool:
        """Step the service (and run its replica tasks) until it is done: ``True``."""
        async with trio.open_nursery() as nursery:
            while True:
                driver.wake = trio.Event()
                done = await self._step(service_id, driver, nursery)
                if driver.fault is not None:
                    await self._clear_fault(service_id, driver)
                # A change recorded while the step ran (a start right after a stop
                # settled) is acted on before the driver may finish.
                if done and not driver.wake.is_set():
                    driver.finished = True
                    nursery.cancel_scope.cancel()
                    return True
                with trio.move_on_after(self.period):
                    await driver.wake.wait()

    async def _fault(
        self, service_id: str, driver: _Driver, fault: BaseException | None, delay: float
    ) -> None:
        """Log the unexpected exception with its traceback and show it on the service."""
        log.error(
            "service %s: internal error while driving it; retrying in %g s",
            service_id,
            delay,
            exc_info=fault,
        )
        driver.fault = (
            f"internal error in the controller while driving this service "
            f"({_describe(fault)}); retrying in {delay:g} s"
        )
        try:
            await self._set_service(service_id, reason=driver.fault)
        except Exception:
            log.exception("service %s: cannot record its internal error", service_id)

    async def _clear_fault(self, service_id: str, driver: _Driver) -> None:
        """A step went through again: the fault's reason goes (unless a step replaced it)."""
        fault, driver.fault = driver.fault, None
        now = self.manager.clock()

        def write(tx: Transaction) -> None:
            row = tx.fetch_one("SELECT reason FROM inference_services WHERE id = ?", (service_id,))
            if row is not None and row["reason"] == fault:
                bump(tx, service_id, now, reason=None)

        await self.store.write(write)

    async def _step(self, service_id: str, driver: _Driver, nursery: trio.Nursery) -> bool:
        row, attempts = await self._read(service_id)
        if row is None:
            self.live.remove(service_id)
            return True
        specification = structure(json_spec(row), Specification, what="stored specification")
        desired = row["desired"]
        try:
            if desired == "running":
                await self._run_replicas(row, specification, attempts, driver, nursery)
            elif desired == "draining":
                await self._drain(row, specification, attempts, driver)
            else:
                return await self._stop_all(row, specification, attempts, driver)
        except FiccError as exc:
            log.warning("service %s: %s (%s)", service_id, exc.message, exc.code)
            await self._set_service(service_id, reason=exc.message)
        return False

    def _latest(self, attempts: list[dict[str, Any]], generation: int) -> dict[int, dict[str, Any]]:
        latest: dict[int, dict[str, Any]] = {}
        for attempt in attempts:
            if attempt["generation"] == generation:
                latest[attempt["replica"]] = attempt  # ordered by number
        return latest

    async def _ensure_capabilities(
        self, row: Mapping[str, Any], specification: Specification, driver: _Driver
    ) -> None:
        """Know what the engine serves before publishing (an adopted attempt was never
        launched by this reconciler): the adapter's translation is pure, so ask it."""
        if driver.capabilities:
            return
        try:
            model = await self._model(row, specification)
            job = self.manager.adapters[specification.engine].job(
                specification, model.record, specification.placements[0], model.inputs
            )
        except Exception as exc:
            log.warning("service %s: cannot compute its capabilities: %s", row["id"], exc)
            return
        driver.capabilities[0] = tuple(job.capabilities)

    def _publish(
        self,
        row: Mapping[str, Any],
        specification: Specification,
        attempts: list[dict[str, Any]],
        driver: _Driver,
        admission: str,
    ) -> None:
        generation = row["generation"]
        replicas = []
        if admission != "stopped":
            for index, attempt in sorted(self._latest(attempts, generation).items()):
                # A node not (yet) connected here cannot be reached; the next step adds it.
                if attempt["state"] in ("ready", "draining") and self.contributors.connected_here(
                    attempt["node_id"]
                ):
                    replicas.append(
                        LiveReplica(
                            index=index,
                            node_id=attempt["node_id"],
                            fence=_fence(attempt),
                        )
                    )
        capabilities = next(iter(driver.capabilities.values()), ())
        self.live.publish(
            LiveService(
                id=row["id"],
                project_id=row["project_id"],
                alias=specification.alias,
                generation=generation,
                admission=admission,  # type: ignore[arg-type]
                concurrency=specification.concurrency,
                request_deadline=specification.request_deadline,
                capabilities=capabilities,
                replicas=tuple(replicas),
            ),
            revision=row["revision"],
        )

    async def _run_replicas(
        self,
        row: Mapping[str, Any],
        specification: Specification,
        attempts: list[dict[str, Any]],
        driver: _Driver,
        nursery: trio.Nursery,
    ) -> None:
        generation = row["generation"]
        for index in range(len(specification.placements)):
            if index not in driver.replicas:
                task = driver.replicas[index] = _ReplicaTask()
                nursery.start_soon(
                    self._replica, row["id"], index, generation, specification, driver, task
                )
        latest = self._latest(attempts, generation)
        states = [
            latest[i]["state"] if i in latest else "pending"
            for i in range(len(specification.placements))
        ]
        if all(state == "ready" for state in states):
            state = "ready"
        elif any(state == "ready" for state in states):
            state = "degraded"
        elif all(state in ("failed", "unknown") for state in states):
            state = "unknown" if "unknown" in states else "failed"
        else:
            state = "starting"
        failures = [
            a["message"] for a in latest.values() if a["state"] == "failed" and a["message"]
        ]
        reason = failures[0] if failures and state != "ready" else None
        await self._set_service(row["id"], state=state, reason=reason)
        await self._ensure_capabilities(row, specification, driver)
        self._publish(row, specification, attempts, driver, "serving")

    async def _drain(
        self,
        row: Mapping[str, Any],
        specification: Specification,
        attempts: list[dict[str, Any]],
        driver: _Driver,
    ) -> None:
        await self._ensure_capabilities(row, specification, driver)
        self._publish(row, specification, attempts, driver, "draining")
        deadline = row["drain_deadline"] or self.manager.clock()
        remaining = max(0.0, deadline - self.manager.clock())
        with trio.move_on_after(min(remaining, self.period)):
            await self.live.wait_idle(row["id"])
        if self.live.inflight(row["id"]) and self.manager.clock() < deadline:
            return  # the next step waits again
        now = self.manager.clock()

        def write(tx: Transaction) -> None:
            current = tx.fetch_one(
                "SELECT desired FROM inference_services WHERE id = ?", (row["id"],)
            )
            if current is not None and current["desired"] == "draining":
                bump(tx, row["id"], now, desired="stopped", state="stopping")

        await self.store.write(write)
        driver.wake.set()

    async def _stop_all(
        self,
        row: Mapping[str, Any],
        specification: Specification,
        attempts: list[dict[str, Any]],
        driver: _Driver,
    ) -> bool:
        service_id = row["id"]
        self._publish(row, specification, attempts, driver, "stopped")
        # Replica tasks end at a safe point (a launch in flight completes first), so no
        # engine starts after it was stopped.
        for task in driver.replicas.values():
            task.scope.cancel()
        for task in driver.replicas.values():
            await task.done.wait()
        driver.replicas.clear()
        _, attempts = await self._read(service_id)
        open_attempts = [a for a in attempts if not a["released"]]
        async with trio.open_nursery() as nursery:
            for attempt in open_attempts:
                nursery.start_soon(self._stop_attempt, service_id, attempt)
        _, attempts = await self._read(service_id)
        unreleased = [a for a in attempts if not a["released"]]
        busy = [a for a in unreleased if a["state"] != "unknown"]
        if busy:
            await self._set_service(
                service_id, state="stopping" if row["desired"] == "stopped" else "removing"
            )
            return False
        now = self.manager.clock()
        held = {a["replica"] for a in unreleased}

        def write(tx: Transaction) -> bool:
            current = tx.fetch_one("SELECT * FROM inference_services WHERE id = ?", (service_id,))
            if current is None:
                return True
            if current["desired"] not in ("stopped", "removed"):
                return False  # started again meanwhile
            if current["desired"] == "removed" and not held:
                tx.execute("DELETE FROM inference_services WHERE id = ?", (service_id,))
                return True
            # A stopped service keeps no reason of its own: what its unknown replicas
            # mean is derived from them in the view, so it goes when they resolve.
            if current["state"] == "stopped":
                # A created service keeps the reservations its plan made.
                if current["reason"] is not None:
                    bump(tx, service_id, now, reason=None)
                return False
            # Executors confirmed every attempt but the unknown ones ended: release.
            for reservation in tx.fetch_all(
                "SELECT replica FROM inference_reservations WHERE service_id = ?",
                (service_id,),
            ):
                if reservation["replica"] not in held:
                    tx.execute(
                        "DELETE FROM inference_reservations WHERE service_id = ? AND replica = ?",
                        (service_id, reservation["replica"]),
                    )
            state = "removing" if current["desired"] == "removed" else "stopped"
            if (current["state"], current["reason"]) != (state, None):
                bump(tx, service_id, now, state=state, reason=None)
            return False

        removed = await self.store.write(write)
        if removed:
            self.live.remove(service_id)
            return True
        return not held and row["desired"] == "stopped"

    async def _stop_attempt(self, service_id: str, attempt: Mapping[str, Any]) -> None:
        fence = _fence(attempt)
        node_id = attempt["node_id"]
        if attempt["state"] == "unknown":
            await self._resolve_unknown(service_id, attempt)
            return
        if attempt["plan_digest"] is None:
            await self._never_launched(service_id, attempt, "stopped")
            return
        if attempt["state"] not in ENDED:
            await self._set_attempt(service_id, attempt["attempt_id"], state="stopping")
        try:
            status = await self.contributors.stop(node_id, fence, grace=10.0)
        except FiccError as exc:
            if exc.code in ("unknown_attempt", "stale_fence"):
                # The node does not run it (any more): confirmed ended.
                await self._set_attempt(
                    service_id,
                    attempt["attempt_id"],
                    state="stopped" if attempt["state"] not in ENDED else attempt["state"],
                    released=1,
                )
                return
            await self._node_trouble(service_id, attempt, exc)
            return
        state = "stopped" if attempt["state"] != "failed" else "failed"
        await self._set_attempt(
            service_id,
            attempt["attempt_id"],
            state=state,
            reason=attempt["reason"] if state == "failed" else status.reason or "stopped",
            released=1,
        )

    async def _never_launched(
        self, service_id: str, attempt: Mapping[str, Any], state: str
    ) -> None:
        """An attempt recorded but never sent to its node (the controller stopped between):
        nothing can be running, so it ends at once."""
        await self._set_attempt(
            service_id, attempt["attempt_id"], state=state, reason="never_launched", released=1
        )

    async def _embedded(self, node_id: str) -> bool:
        row = await self.store.read(
            lambda tx: tx.fetch_one("SELECT labels FROM nodes WHERE id = ?", (node_id,))
        )
        return row is not None and json.loads(row["labels"]).get("ficc/embedded") == "true"

    async def _node_state(self, node_id: str) -> str | None:
        row = await self.store.read(
            lambda tx: tx.fetch_one("SELECT state FROM nodes WHERE id = ?", (node_id,))
        )
        return None if row is None else row["state"]

    async def _node_trouble(
        self, service_id: str, attempt: Mapping[str, Any], exc: FiccError
    ) -> None:
        """The node could not be asked: lost means unknown, revoked means it cannot run it."""
        state = await self._node_state(attempt["node_id"])
        if state == "lost":
            await self._set_attempt(
                service_id,
                attempt["attempt_id"],
                state="unknown",
                reason="node_lost",
                message=f"node {attempt['node_id']} was lost while the attempt ran; whether it "
                "still runs is unknown",
            )
        elif state in ("revoked", None):
            await self._set_attempt(
                service_id,
                attempt["attempt_id"],
                state="stopped",
                reason="node_revoked",
                message=f"node {attempt['node_id']} was revoked; it can no longer run anything",
                released=1,
            )
        else:
            log.info(
                "attempt %s on node %s: %s; trying again",
                attempt["attempt_id"],
                attempt["node_id"],
                exc.message,
            )

    async def _resolve_unknown(self, service_id: str, attempt: Mapping[str, Any]) -> None:
        """An unknown attempt ends when its node is back and no longer runs it (or is revoked)."""
        node_id = attempt["node_id"]
        state = await self._node_state(node_id)
        if state in ("revoked", None):
            await self._set_attempt(
                service_id, attempt["attempt_id"], reason="node_revoked", released=1
            )
            return
        if state != "connected" or not self.contributors.connected_here(node_id):
            return
        try:
            status = await self.contributors.stop(node_id, _fence(attempt), grace=10.0)
        except FiccError as exc:
            if exc.code in ("unknown_attempt", "stale_fence"):
                await self._set_attempt(
                    service_id,
                    attempt["attempt_id"],
                    state="stopped",
                    reason="not_running_after_reconnect",
                    released=1,
                )
            return
        await self._set_attempt(
            service_id,
            attempt["attempt_id"],
            state="stopped",
            reason=status.reason or "stopped_after_reconnect",
            released=1,
        )

    # -- one replica -------------------------------------------------------------------------------

    async def _replica(
        self,
        service_id: str,
        index: int,
        generation: int,
        specification: Specification,
        driver: _Driver,
        task: _ReplicaTask,
    ) -> None:
        try:
            await self._replica_loop(service_id, index, generation, specification, driver, task)
        finally:
            task.done.set()
            if driver.replicas.get(index) is task and not task.scope.cancel_called:
                # It ended by itself (an unknown outcome): let the driver see it.
                driver.wake.set()

    async def _replica_loop(
        self,
        service_id: str,
        index: int,
        generation: int,
        specification: Specification,
        driver: _Driver,
        task: _ReplicaTask,
    ) -> None:
        with task.scope:
            backoff = _Backoff(self.retry_max)
            while True:
                row, attempts = await self._read(service_id)
                if row is None or row["desired"] != "running" or row["generation"] != generation:
                    return
                mine = [
                    a for a in attempts if a["replica"] == index and a["generation"] == generation
                ]
                latest = mine[-1] if mine else None
                if latest is not None and latest["state"] == "unknown":
                    return  # never retried by itself: stop, then start with acknowledgement
                if latest is not None and latest["state"] in ACTIVE and not latest["released"]:
                    await self._watch(service_id, row, specification, index, latest, driver)
                    continue
                if latest is not None:
                    # The previous attempt failed: wait, doubling up to the cap.
                    await backoff.wait()
                number = (latest["number"] if latest else 0) + 1
                await self._launch(service_id, row, specification, index, number, driver)

    async def _launch(
        self,
        service_id: str,
        row: Mapping[str, Any],
        specification: Specification,
        index: int,
        number: int,
        driver: _Driver,
    ) -> None:
        placement = specification.placements[index]
        generation = row["generation"]
        attempt_id = _new_attempt_id(service_id, index, generation, number)
        provider = specification.runtime.executor_provider
        now = self.manager.clock()

        def insert(tx: Transaction) -> None:
            tx.execute(
                "INSERT INTO inference_attempts (attempt_id, service_id, replica, generation,"
                " number, node_id, provider, state, released, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?)",
                (
                    attempt_id,
                    service_id,
                    index,
                    generation,
                    number,
                    placement.node_id,
                    provider,
                    now,
                    now,
                ),
            )
            bump(tx, service_id, now)

        await self.store.write(insert)
        try:
            model = await self._model(row, specification)
            adapter = self.manager.adapters[specification.engine]
            job = adapter.job(specification, model.record, placement, model.inputs)
        except Exception as exc:  # the model vanished, or the adapter refused
            message = exc.message if isinstance(exc, FiccError) else f"{type(exc).__name__}: {exc}"
            await self._set_attempt(
                service_id,
                attempt_id,
                state="failed",
                reason="job_refused",
                message=message,
                released=1,
            )
            return
        driver.capabilities[index] = tuple(job.capabilities)
        workload = Workload(
            workload_id=f"{service_id}/{index}",
            project_id=row["project_id"],
            node_id=placement.node_id,
            runtime=specification.runtime,
            argv=job.argv,
            limits=placement.limits,
            generation=generation,
            model_revision=model.record.revision,
            endpoint=job.endpoint,
        )
        fence = workload.fence(attempt_id)
        # A remote node first stages the model's files it lacks (the embedded node reads
        # the controller's blob store in place); the launch call covers both.
        embedded = await self._embedded(placement.node_id)
        if embedded and model.directories:
            try:
                for files in model.directories.values():
                    await self.manager.blobs.assemble_tree(files)
            except FiccError as exc:
                await self._refused(service_id, attempt_id, exc)
                return
        await self._set_attempt(
            service_id,
            attempt_id,
            state="launching" if embedded else "staging",
            plan_digest=fence.plan_digest,
            workload=canonical_json(workload).decode("utf-8"),
        )
        try:
            # Shielded: a launch cut short could leave an engine nobody recorded.
            with trio.CancelScope(shield=True):
                status = await self.contributors.launch(
                    placement.node_id,
                    provider,
                    job,
                    fence,
                    limits=placement.limits,
                    runtime=specification.runtime,
                    blobs=model.blobs,
                    directories=model.directories,
                )
        except FiccError as exc:
            await self._refused(service_id, attempt_id, exc)
            return
        await self._set_attempt(
            service_id, attempt_id, state="ready" if status.state == "ready" else "loading"
        )

    async def _refused(self, service_id: str, attempt_id: str, exc: FiccError) -> None:
        """The attempt never started (its inputs or its launch were refused): it failed."""
        await self._set_attempt(
            service_id, attempt_id, state="failed", reason=exc.code, message=exc.message, released=1
        )

    async def _watch(
        self,
        service_id: str,
        row: Mapping[str, Any],
        specification: Specification,
        index: int,
        attempt: Mapping[str, Any],
        driver: _Driver,
    ) -> None:
        """Follow an attempt until it ends (failed or unknown) or the replica task is cancelled."""
        if attempt["plan_digest"] is None:
            await self._never_launched(service_id, attempt, "failed")
            return
        fence = _fence(attempt)
        node_id = attempt["node_id"]
        state = attempt["state"]
        while True:
            try:
                status = await self.contributors.status(node_id, fence)
            except FiccError as exc:
                if exc.code in ("unknown_attempt", "stale_fence"):
                    await self._set_attempt(
                        service_id,
                        attempt["attempt_id"],
                        state="failed",
                        reason="not_reported",
                        message=f"node {node_id} no longer runs attempt {attempt['attempt_id']}",
                        released=1,
                    )
                    return
                node_state = await self._node_state(node_id)
                if node_state in ("lost", "revoked", None):
                    await self._node_trouble(service_id, attempt, exc)
                    return
                await trio.sleep(self.loading_period)
                continue
            if status.state == "ready":
                new = "ready"
            elif status.state == "starting":
                new = "loading"
            else:
                await self._set_attempt(
                    service_id,
                    attempt["attempt_id"],
                    state="failed",
                    reason=status.reason or status.state,
                    message=status.message or f"the engine {status.state}",
                    released=1,
                )
                return
            if new != state:
                await self._set_attempt(service_id, attempt["attempt_id"], state=new)
                state = new
            await trio.sleep(self.ready_period if state == "ready" else self.loading_period)


def _fence(attempt: Mapping[str, Any]) -> Fence:
    from ..schema import Fence

    return Fence(
        attempt_id=attempt["attempt_id"],
        generation=attempt["generation"],
        plan_digest=attempt["plan_digest"] or "sha256:" + "0" * 64,
    )


def _describe(fault: BaseException | None) -> str:
    while isinstance(fault, BaseExceptionGroup) and len(fault.exceptions) == 1:
        fault = fault.exceptions[0]
    return "unknown" if fault is None else f"{type(fault).__name__}: {fault}"


def json_spec(row: Mapping[str, Any]) -> Any:
    return json.loads(row["spec"])
