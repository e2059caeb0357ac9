"""The node agent: executor providers behind one interface, a snapshot, fenced attempts, leases.

The embedded agent (inside ``ficc serve``) and the remote one (``ficc executor``)
are this same class; only the transport that calls it differs.

Every attempt the agent runs holds a lease. The controller renews leases from a
task of its own (never from a request path, so slow endpoint reads cannot starve
it); when a lease runs out without renewal the agent stops that attempt itself,
so a partitioned node never keeps serving a generation the controller has moved
on from. Each grant and renewal is also passed to the provider (its optional
``hold``), so an engine is stopped on the node when its lease passes even if the
agent itself died.

With several controllers, only the leader launches, stops and renews, and each
of its messages carries its leader term: the agent keeps the highest term seen
(:attr:`Agent.term_seen`, in ``term.json`` of its state directory, see
:mod:`~ficc_core.agent.terms`), and renewals of an older term extend nothing.
"""

from __future__ import annotations

import logging
import math
import os
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..executor.base import SupervisingProvider
from ..executor.endpoint import check_fence
from ..executor.errors import ExecutorError, LaunchFailed
from ..executor.node import measure_resources
from ..nodelink.wire import StaleTerm
from ..schema import ExecutorSnapshot, GpuDevice, NodeResources
from ..schema.snapshot import ENDPOINT_VERSION
from .gpus import GpuDiscovery, GpuInventory, visible_devices
from .runtimes import AgentSettings, RuntimeCheck, check_runtime
from .staging import Stager, stage_job_inputs
from .terms import TermRecord

if TYPE_CHECKING:
    from ..executor.protocol import ExecutorProvider, Headers
    from ..executor.types import AttemptStatus, ReadEvent
    from ..plugins import ExecutorRegistry
    from ..schema import Fence, Job, ResourceLimits, Runtime

log = logging.getLogger("ficc.agent")

#: How long a lease lasts when the controller does not say.
DEFAULT_LEASE = 30.0
#: Attempts whose logs stay readable here after they ended (the newest launched kept).
LOGS_KEPT = 256


@attrs.define(eq=False)
class Lease:
    """One running attempt the agent holds, and until when (trio clock) it may run."""

    provider: str
    fence: Fence
    deadline: float
    expiring: bool = False


@attrs.define(eq=False)
class _Stop:
    """One attempt's stop in progress: what its provider answered once the engine ended."""

    done: trio.Event = attrs.Factory(trio.Event)
    status: AttemptStatus | None = None
    error: Exception | None = None


class Agent:
    """Run what a controller asks on this node, through the loaded executor providers.

    :param node_id: the node's ID, reported in the snapshot.
    :param providers: provider instances by name (not yet started; :meth:`run` starts them).
    :param state_dir: the agent's directory; free disk is measured here.
    :param settings: labels and declared runtimes.
    :param lease_duration: seconds an attempt may run past its last renewal.
    :param stop_grace: seconds between SIGTERM and SIGKILL when a lease expires.
    :param gpu_query: how GPUs are found (by default :class:`~ficc_core.agent.gpus.
        GpuDiscovery`: NVML, then ``nvidia-smi``, unless the settings say ``skip_gpus``);
        tests pass a fake returning devices or a :class:`~ficc_core.agent.gpus.GpuInventory`.
    """

    def __init__(
        self,
        *,
        node_id: str,
        providers: Mapping[str, ExecutorProvider],
        state_dir: str | os.PathLike[str],
        settings: AgentSettings | None = None,
        lease_duration: float = DEFAULT_LEASE,
        stop_grace: float = 10.0,
        gpu_query: Callable[[], Awaitable[tuple[GpuDevice, ...] | GpuInventory]] | None = None,
    ) -> None:
        if not providers:
            raise LaunchFailed("an agent needs at least one executor provider")
        self.node_id = node_id
        self.providers = dict(providers)
        self.state_dir = Path(state_dir)
        self.settings = settings or AgentSettings()
        self.lease_duration = lease_duration
        self.stop_grace = stop_grace
        if gpu_query is None:
            gpu_query = GpuDiscovery(skip=self.settings.skip_gpus).inventory
        self._gpu_query = gpu_query
        self._leases: dict[str, Lease] = {}
        self._changed = trio.Event()
        self._started = False
        #: Attempt IDs the agent stopped because their lease expired, oldest first.
        self.expired: list[str] = []
        #: Declared runtimes the last snapshot refused, by name, with the reason.
        self.runtime_problems: dict[str, str] = {}
        #: Fetches blob inputs this node lacks (a remote agent sets it; the embedded
        #: agent reads the controller's blob store in place and needs none).
        self.stager: Stager | None = None
        #: The provider and fence of the attempts launched here, for their logs (bounded).
        self._launched: OrderedDict[str, tuple[str, Fence]] = OrderedDict()
        #: Log follows running on this agent now (a follow ends with its stream or attempt).
        self.open_follows = 0
        self._terms = TermRecord(self.state_dir)
        #: Stops in progress, by attempt ID (each runs in :attr:`_nursery` to its end).
        self._stops: dict[str, _Stop] = {}
        self._nursery: trio.Nursery | None = None

    @classmethod
    def from_plugins(
        cls,
        executors: ExecutorRegistry,
        *,
        names: Sequence[str],
        state_dir: str | os.PathLike[str],
        node_id: str,
        runtime_dir: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Agent:
        """Instantiate the named provider classes, each with a state directory of its own.

        Providers built on :class:`SupervisingProvider` also get ``runtime_dir``, where
        their engines' sockets live (None: its default).

        A name that no plugin registered raises :class:`LaunchFailed`, naming it.
        """
        providers = {}
        for name in names:
            try:
                provider_class = executors[name]
            except KeyError:
                raise LaunchFailed(
                    f"no executor provider {name!r} is installed; see 'ficc plugins'",
                    details={"provider": name},
                ) from None
            extra: dict[str, Any] = {}
            if runtime_dir is not None and issubclass(provider_class, SupervisingProvider):
                extra["runtime_dir"] = runtime_dir
            providers[name] = provider_class(
                state_dir=Path(state_dir) / name[:8], node_id=node_id, **extra
            )
        return cls(node_id=node_id, providers=providers, state_dir=state_dir, **options)

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every provider and the lease watcher; serve until cancelled.

        Cancelling it stops every attempt (each provider stops its own engines).
        """
        await trio.to_thread.run_sync(lambda: self.state_dir.mkdir(parents=True, exist_ok=True))
        # Before any command is admitted: a restart must not accept an old leader again.
        if await self._terms.load():
            log.info("leader term %d recorded here; older terms are refused", self.term_seen)
        async with trio.open_nursery() as nursery:
            for provider in self.providers.values():
                await nursery.start(provider.run)
            nursery.start_soon(self._expire_leases)
            self._started = True
            self._nursery = nursery
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._started = False
                self._nursery = None

    # -- leader terms --------------------------------------------------------------------------

    @property
    def term_seen(self) -> int:
        """The highest leader term a command, renewal or leader's welcome carried here."""
        return self._terms.seen

    async def see_term(self, term: int) -> None:
        """Raise :attr:`term_seen` to ``term`` if it is higher, recording it durably first."""
        await self._terms.raise_to(term)

    async def doctor(self) -> list[dict[str, Any]]:
        """What ``ficc doctor`` finds on this node (its agent and runtime directories,
        isolation, limits, runtimes, GPUs, disk)."""
        from .doctor import directory_findings, node_findings

        found = []
        runtime_dirs = {
            provider.runtime_dir
            for provider in self.providers.values()
            if isinstance(provider, SupervisingProvider)
        }
        for runtime_dir in sorted(runtime_dirs):
            for finding in await trio.to_thread.run_sync(
                directory_findings, self.state_dir, runtime_dir
            ):
                if finding not in found:
                    found.append(finding)
        found += await node_findings(self)
        return [finding.to_json() for finding in found]

    # -- snapshot ----------------------------------------------------------------------------

    async def gpu_inventory(self) -> GpuInventory:
        """The node's GPUs as discovery last saw them (it refreshes free memory itself)."""
        found = await self._gpu_query()
        return found if isinstance(found, GpuInventory) else GpuInventory(tuple(found))

    async def gpus(self) -> tuple[GpuDevice, ...]:
        """The node's GPUs."""
        return (await self.gpu_inventory()).devices

    async def snapshot(self) -> ExecutorSnapshot:
        """Describe this node: providers, measured resources, checked runtimes, labels."""
        provider_snapshots = [await provider.snapshot() for provider in self.providers.values()]
        infos = [info for snap in provider_snapshots for info in snap.providers]
        package_digests = {info.name: info.package_digest for info in infos}
        measured = await trio.to_thread.run_sync(measure_resources, self.state_dir)
        inventory = await self.gpu_inventory()
        resources = NodeResources(
            cpus=measured.cpus,
            memory_bytes=measured.memory_bytes,
            disk_free_bytes=measured.disk_free_bytes,
            gpus=inventory.devices,
            gpu_source=inventory.source,
            gpu_driver=inventory.driver,
            gpu_error=inventory.error,
        )
        checks: list[RuntimeCheck] = [
            await check_runtime(declared, package_digests) for declared in self.settings.runtimes
        ]
        self.runtime_problems = {
            check.declared.name: check.problem for check in checks if check.problem is not None
        }
        labels: dict[str, str] = {}
        for snap in provider_snapshots:
            labels.update(snap.labels)
        for name, problem in self.runtime_problems.items():
            labels[f"runtime/{name}"[:63]] = f"refused: {problem}"[:256]
        labels.update(self.settings.labels)
        # One provider without the endpoint contract is enough to refuse inference here.
        versions = {snap.endpoint_version for snap in provider_snapshots}
        return ExecutorSnapshot(
            node_id=self.node_id,
            providers=infos,
            resources=resources,
            runtimes=[check.installed for check in checks if check.installed is not None],
            labels=labels,
            endpoint_version=ENDPOINT_VERSION if versions == {ENDPOINT_VERSION} else None,
        )

    # -- attempts ----------------------------------------------------------------------------

    async def launch(
        self,
        provider: str,
        job: Job,
        fence: Fence,
        *,
        limits: ResourceLimits | None = None,
        runtime: Runtime | None = None,
        lease: float | None = None,
        blobs: Mapping[str, int] | None = None,
        directories: Mapping[str, Mapping[str, tuple[str, int]]] | None = None,
        origin: str | None = None,
        term: int | None = None,
    ) -> AttemptStatus:
        """Launch ``job`` as attempt ``fence`` on ``provider``, holding a fresh lease.

        ``blobs`` maps the digests of the job's blob inputs to their sizes, and
        ``directories`` a directory input's id to its files (path -> digest, size);
        with a :attr:`stager`, those inputs are staged on this node first (verified,
        read-only; fetched from ``origin``, the controller that sent the launch,
        first) and the job is rewritten to their local paths. ``term`` is the
        sender's leader term: should a newer one be seen while the inputs stage
        (a download takes minutes), the launch is refused
        :class:`~ficc_core.nodelink.wire.StaleTerm` before anything starts.
        """
        if provider not in self.providers:
            raise LaunchFailed(
                f"no executor provider {provider!r} on node {self.node_id!r}",
                details={"provider": provider, "loaded": sorted(self.providers)},
            )
        if (blobs or directories) and self.stager is not None:
            job = await stage_job_inputs(self.stager, job, blobs or {}, directories, source=origin)
        if term is not None and term < self.term_seen:
            raise StaleTerm(term=term, current=self.term_seen)
        # The engine sees exactly the GPUs its placement reserved (none when it reserved none).
        shown = visible_devices(limits, await self.gpus())
        if shown:
            job = attrs.evolve(job, env={**job.env, **shown})
        status = await self.providers[provider].launch(job, fence, limits=limits, runtime=runtime)
        held = self._leases[fence.attempt_id] = Lease(
            provider, fence, trio.current_time() + (lease or self.lease_duration)
        )
        self._launched[fence.attempt_id] = (provider, fence)
        while len(self._launched) > LOGS_KEPT:
            self._launched.popitem(last=False)
        self._hold(held)
        self._wake()
        return status

    def renew(
        self,
        attempt_ids: Iterable[str] | None = None,
        duration: float | None = None,
        *,
        term: int | None = None,
    ) -> list[str]:
        """Extend the leases of ``attempt_ids`` (every lease when None); return those renewed.

        A lease already expiring is not revived: its attempt is being stopped. A
        renewal of a ``term`` below :attr:`term_seen` renews nothing: it comes from a
        controller that is no longer the leader, and only the leader keeps work alive.
        """
        if term is not None and term < self.term_seen:
            log.debug("renewal of term %d ignored (term %d seen)", term, self.term_seen)
            return []
        deadline = trio.current_time() + (duration or self.lease_duration)
        ids = list(self._leases) if attempt_ids is None else list(attempt_ids)
        renewed = []
        for attempt_id in ids:
            lease = self._leases.get(attempt_id)
            if lease is not None and not lease.expiring:
                lease.deadline = max(lease.deadline, deadline)
                self._hold(lease)
                renewed.append(attempt_id)
        self._wake()
        return renewed

    def leases(self) -> list[Lease]:
        """The attempts the agent holds, in launch order."""
        return list(self._leases.values())

    async def stop(self, fence: Fence, grace: float | None = None) -> AttemptStatus:
        """Stop the attempt; return once its engine ended, its lease dropped then.

        The stop runs in the agent's own task, to its end (``grace``, then SIGKILL),
        whatever becomes of the caller: a leader whose link drops in the middle (its
        process killed, its lease lost) leaves the stop going on. Until the engine
        ended the attempt stays held (reported, its status answered, its lease no
        longer renewed), and a second stop of it (a new leader's) waits for that same
        end: nobody learns the attempt is gone while its engine still runs, so no
        replacement is launched beside it.
        """
        lease = self._lease(fence)
        stopping = self._stops.get(fence.attempt_id)
        if stopping is None:
            stopping = self._stops[fence.attempt_id] = _Stop()
            lease.expiring = True  # renewals no longer extend it; no second stop at expiry
            seconds = self.stop_grace if grace is None else grace
            if self._nursery is None:  # not running (a test's bare agent): the caller's task
                await self._run_stop(lease, seconds, stopping)
            else:
                self._nursery.start_soon(self._run_stop, lease, seconds, stopping)
        await stopping.done.wait()
        if stopping.error is not None:
            raise stopping.error
        if stopping.status is None:  # the agent itself is stopping: its providers stop it
            raise ExecutorError(
                f"the agent stopped while attempt {fence.attempt_id!r} was being stopped"
            )
        return stopping.status

    async def _run_stop(self, lease: Lease, grace: float, stopping: _Stop) -> None:
        attempt_id = lease.fence.attempt_id
        try:
            stopping.status = await self.providers[lease.provider].stop(lease.fence, grace)
        except Exception as exc:  # each caller waiting on this stop raises it
            stopping.error = exc
        finally:
            if self._stops.get(attempt_id) is stopping:
                del self._stops[attempt_id]
            if self._leases.get(attempt_id) is lease:
                del self._leases[attempt_id]
            stopping.done.set()
            self._wake()

    async def status(self, fence: Fence) -> AttemptStatus:
        """Where the attempt stands, as its provider reports it."""
        return await self.providers[self._lease(fence).provider].status(fence)

    async def report(self) -> list[dict[str, Any]]:
        """Every held attempt with its fence, state and remaining lease (for heartbeats)."""
        now = trio.current_time()
        found = []
        for lease in self.leases():
            state: str  # an attempt state, or "unknown" when its provider cannot say
            try:
                state = (await self.providers[lease.provider].status(lease.fence)).state
            except ExecutorError:
                state = "unknown"
            found.append(
                {
                    "attempt_id": lease.fence.attempt_id,
                    "generation": lease.fence.generation,
                    "plan_digest": lease.fence.plan_digest,
                    "provider": lease.provider,
                    "state": state,
                    "lease_remaining": max(0.0, lease.deadline - now),
                }
            )
        return found

    # -- logs (an attempt's log stays readable after it ended) -------------------------------

    def _log_provider(self, fence: Fence) -> ExecutorProvider:
        known = self._launched.get(fence.attempt_id)
        if known is None:
            # Launched before this agent restarted: a provider that keeps logs across
            # restarts (docs/operations.md, "Logs") knows it by its kept log.
            for name, provider in self.providers.items():
                kept = getattr(provider, "kept_fence", None)
                fenced = None if kept is None else kept(fence.attempt_id)
                if fenced is not None:
                    known = (name, fenced)
                    break
        check_fence({} if known is None else {fence.attempt_id: known[1]}, fence)
        assert known is not None  # check_fence refused an unknown attempt
        return self.providers[known[0]]

    async def logs(self, fence: Fence, tail: int = 100) -> list[str]:
        """The last ``tail`` lines of the attempt's log, while it runs and after it ended."""
        return await self._log_provider(fence).logs(fence, tail)

    def follow_logs(self, fence: Fence, tail: int | None = None) -> AsyncGenerator[str, None]:
        """The attempt's log lines (the last ``tail``, then new ones) until the attempt ends.

        Refuses an unknown attempt or a stale fence at once; closing the generator
        ends the follow. :attr:`open_follows` counts those running.
        """
        return self._follow(self._log_provider(fence), fence, tail)

    async def _follow(
        self, provider: ExecutorProvider, fence: Fence, tail: int | None
    ) -> AsyncGenerator[str, None]:
        self.open_follows += 1
        log.info("following the log of attempt %s", fence.attempt_id)
        ended = False
        lines = provider.follow_logs(fence, tail)
        try:
            async for line in lines:
                yield line
            ended = True
        finally:
            self.open_follows -= 1
            log.info(
                "stopped following the log of attempt %s (%s; %d follows open)",
                fence.attempt_id,
                "the log ended" if ended else "the follow was closed",
                self.open_follows,
            )
            close = getattr(lines, "aclose", None)
            if close is not None:
                await close()

    # -- the endpoint action (no lease work happens here) ----------------------------------

    async def open(
        self,
        fence: Fence,
        stream_id: str,
        method: str,
        path: str,
        headers: Headers,
        body: bytes,
        *,
        input_id: str | None = None,
    ) -> None:
        """Open an endpoint stream on the attempt's provider."""
        provider = self.providers[self._lease(fence).provider]
        await provider.open(fence, stream_id, method, path, headers, body, input_id=input_id)

    async def read(self, fence: Fence, stream_id: str) -> ReadEvent:
        """Read the stream's next event."""
        return await self.providers[self._lease(fence).provider].read(fence, stream_id)

    async def cancel(self, fence: Fence, stream_id: str) -> None:
        """Close the stream at once."""
        await self.providers[self._lease(fence).provider].cancel(fence, stream_id)

    def held(self, fence: Fence, stream_id: str) -> int:
        """How many of the stream's events are queued (``read`` takes one without
        waiting); 0 where the attempt's provider does not say."""
        held = getattr(self.providers[self._lease(fence).provider], "held", None)
        return 0 if held is None else held(fence, stream_id)

    # -- leases ---------------------------------------------------------------------------------

    def _lease(self, fence: Fence) -> Lease:
        held = self._leases.get(fence.attempt_id)
        check_fence({} if held is None else {fence.attempt_id: held.fence}, fence)
        return self._leases[fence.attempt_id]

    def _hold(self, lease: Lease) -> None:
        # ``hold`` is optional (providers written before it lack it): a provider that
        # has it stops the engine by itself once the lease passes with this agent gone.
        hold = getattr(self.providers[lease.provider], "hold", None)
        if hold is not None:
            hold(lease.fence, lease.deadline - trio.current_time())

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _expire_leases(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                changed = self._changed
                now = trio.current_time()
                for lease in list(self._leases.values()):
                    if not lease.expiring and lease.deadline <= now:
                        lease.expiring = True
                        nursery.start_soon(self._stop_expired, lease)
                upcoming = [lease.deadline for lease in self._leases.values() if not lease.expiring]
                with trio.move_on_at(min(upcoming, default=math.inf)):
                    await changed.wait()

    async def _stop_expired(self, lease: Lease) -> None:
        attempt_id = lease.fence.attempt_id
        log.warning(
            "the lease of attempt %s (generation %s) expired without renewal; stopping it",
            attempt_id,
            lease.fence.generation,
        )
        try:
            await self.providers[lease.provider].stop(lease.fence, self.stop_grace)
        except ExecutorError as exc:
            log.info("attempt %s was already gone: %s", attempt_id, exc.message)
        finally:
            if self._leases.get(attempt_id) is lease:
                del self._leases[attempt_id]
            self.expired.append(attempt_id)
            self._wake()
