"""The machinery both built-in providers share: attempts, readiness, logs, stop.

A concrete provider subclasses :class:`SupervisingProvider` and supplies how to
start an engine (``_start``), signal it (``_signal``), explain its exit
(``_exit_reason``), release what it held (``_release``), find what a crashed
run left behind (``_recover``) and, optionally, how to stop an engine without
the agent (``_watchdog_spec``). Everything else — fences, the endpoint action,
readiness probing, the bounded log, SIGTERM/grace/SIGKILL, the lease watchdog —
is here, once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from .attempts import (
    RECORD,
    EngineProcess,
    ExecutorAttempt,
    attempt_key,
    prepare_directory,
    read_records,
    write_record,
)
from .bootstrap import probe_until_ready
from .endpoint import DEFAULT_MAX_STREAMS, EndpointStreams, check_fence
from .errors import AttemptExists, EngineUnavailable, LaunchFailed
from .logs import KEPT_LOGS_MAX_AGE, KEPT_LOGS_MAX_BYTES, BoundedLog, KeptLogs
from .netns import open_tcp_in_netns
from .runtime_dir import (
    FIX,
    MAX_SOCKET_PATH,
    default_runtime_dir,
    ensure_runtime_dir,
    remove_socket_dir,
    socket_dir,
)
from .types import AttemptStatus, ReadEvent
from .watchdog import Watchdog, end_leftover_watchdog

if TYPE_CHECKING:
    from ..schema import Fence, Job, ResourceLimits, Runtime
    from .protocol import Headers

__all__ = ["SupervisingProvider"]

log = logging.getLogger("ficc.executor")


class SupervisingProvider:
    """Shared implementation of :class:`~ficc_core.executor.ExecutorProvider`.

    :param state_dir: where attempt directories and records live (any length).
    :param runtime_dir: where each attempt's socket directory lives (default
        ``/tmp/ficc-<uid>``): short, since an engine's socket path must fit in 107
        bytes (:mod:`~ficc_core.executor.runtime_dir`).
    :param node_id: the node ID the snapshot reports.
    :param log_max_bytes: the bound on each attempt's log.
    :param kept_logs_max_bytes: the bound on the logs of ended attempts kept across
        restarts (``<state_dir>/logs``, :class:`~ficc_core.executor.logs.KeptLogs`).
    :param kept_logs_max_age: seconds such a log is kept.
    :param max_streams: open endpoint streams allowed per attempt.
    :param stream_idle_timeout: seconds an unread stream stays open.
    :param default_grace: seconds between SIGTERM and SIGKILL when the provider shuts down.
    """

    API_VERSION: ClassVar[int] = 1
    name: ClassVar[str] = "base"

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str],
        runtime_dir: str | os.PathLike[str] | None = None,
        node_id: str = "local",
        log_max_bytes: int = 4 * 1024 * 1024,
        kept_logs_max_bytes: int = KEPT_LOGS_MAX_BYTES,
        kept_logs_max_age: float = KEPT_LOGS_MAX_AGE,
        max_streams: int = DEFAULT_MAX_STREAMS,
        stream_idle_timeout: float = 60.0,
        default_grace: float = 5.0,
    ) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.runtime_dir = (
            default_runtime_dir() if runtime_dir is None else Path(runtime_dir).absolute()
        )
        self.node_id = node_id
        self.log_max_bytes = log_max_bytes
        #: The logs of attempts whose directories went (a restart), kept and bounded.
        self.kept_logs = KeptLogs(
            self.state_dir / "logs", max_bytes=kept_logs_max_bytes, max_age=kept_logs_max_age
        )
        self.default_grace = default_grace
        self.streams = EndpointStreams(max_streams=max_streams, idle_timeout=stream_idle_timeout)
        self._attempts: dict[str, ExecutorAttempt] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def attempts_dir(self) -> Path:
        """The directory holding one sub-directory (and record) per attempt."""
        return self.state_dir / "attempts"

    # -- lifecycle -----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Clean up leftovers of an earlier run, report started, serve until cancelled."""
        await trio.to_thread.run_sync(lambda: self.attempts_dir.mkdir(parents=True, exist_ok=True))
        await trio.to_thread.run_sync(ensure_runtime_dir, self.runtime_dir)
        # An earlier run's watchdogs go first, so none acts while leftovers are removed.
        await trio.to_thread.run_sync(self._end_leftover_watchdogs)
        await self._recover()
        await trio.to_thread.run_sync(self.kept_logs.load)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.streams.run)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self._shutdown()
                await self._close()

    async def _shutdown(self) -> None:
        # Each supervisor stops its own engine when cancelled; this catches any engine
        # whose supervisor never started.
        for attempt in list(self._attempts.values()):
            if attempt.process is None or attempt.done.is_set():
                continue
            await self._stop_engine(attempt, self.default_grace)
            watchdog = attempt.extra.pop("watchdog", None)
            if watchdog is not None:
                await watchdog.end()
            await self._release(attempt)
        for attempt in list(self._attempts.values()):
            await trio.to_thread.run_sync(self._remove_record, attempt.directory)

    async def _stop_engine(self, attempt: ExecutorAttempt, grace: float) -> None:
        """SIGTERM, up to ``grace`` seconds, SIGKILL; wait (bounded) until the child is gone."""
        attempt.stop_requested = True
        if attempt.state in ("starting", "ready"):
            attempt.state, attempt.reason = "stopped", "provider_stopped"
            attempt.message = "the provider shut down and stopped the engine"
        await self._signal(attempt, signal.SIGTERM)
        with trio.move_on_after(grace):
            await attempt.process.wait()
        await self._signal(attempt, signal.SIGKILL)
        with trio.move_on_after(10):
            await attempt.process.wait()

    # -- the protocol ----------------------------------------------------------------

    async def launch(
        self,
        job: Job,
        fence: Fence,
        *,
        limits: ResourceLimits | None = None,
        runtime: Runtime | None = None,
    ) -> AttemptStatus:
        """Start ``job`` as attempt ``fence``; return at once with state ``starting``."""
        if self._nursery is None:
            raise LaunchFailed(f"the {self.name} provider is not running; start its run() first")
        if fence.attempt_id in self._attempts:
            raise AttemptExists(
                f"attempt {fence.attempt_id!r} was already launched here",
                details={"attempt_id": fence.attempt_id},
            )
        await self._check_launch(job, limits, runtime)
        key = attempt_key(fence.attempt_id)
        directory = self.attempts_dir / key
        socket_path = self._socket_dir(key) / job.endpoint.socket
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise LaunchFailed(
                f"the engine socket path {socket_path} is longer than {MAX_SOCKET_PATH} bytes; "
                f"give the endpoint a shorter socket name, or {FIX}",
                details={"socket_path": str(socket_path), "setting": "runtime_dir"},
            )
        attempt = ExecutorAttempt(
            fence=fence,
            job=job,
            key=key,
            directory=directory,
            socket_path=socket_path,
            log=BoundedLog(directory, max_bytes=self.log_max_bytes),
            limits=limits,
        )
        await trio.to_thread.run_sync(self._prepare_directory, attempt)
        self._attempts[fence.attempt_id] = attempt
        try:
            attempt.process = await self._start(attempt, limits, runtime)
            attempt.started_at = time.time()
            attempt.pid = await self._engine_pid(attempt, answered=False)
        except BaseException:
            del self._attempts[fence.attempt_id]
            with trio.CancelScope(shield=True):
                await self._release(attempt)
                await trio.to_thread.run_sync(self._remove_record, directory)
            raise
        with trio.CancelScope(shield=True):  # the engine runs: never leave it unsupervised
            await self._start_watchdog(attempt)
        self.streams.attach(
            fence,
            job.endpoint,
            lambda: self._connect(attempt),
            {item.id: item.path for item in job.inputs},
        )
        self._nursery.start_soon(self._supervise, attempt)
        return attempt.status()

    async def status(self, fence: Fence) -> AttemptStatus:
        """Return where the attempt stands (with the log tail once it has ended)."""
        attempt = self._attempt(fence)
        return await attempt.current_status()

    async def wait_ready(self, fence: Fence) -> AttemptStatus:
        """Wait until the attempt is ready or over; return its status."""
        attempt = self._attempt(fence)
        await attempt.ready.wait()
        return await attempt.current_status()

    async def wait_ended(self, fence: Fence) -> AttemptStatus:
        """Wait until the attempt is over; return its final status."""
        attempt = self._attempt(fence)
        await attempt.done.wait()
        return await attempt.current_status()

    async def stop(self, fence: Fence, grace: float = 10.0) -> AttemptStatus:
        """SIGTERM the engine (its whole group), wait ``grace`` seconds, then SIGKILL."""
        attempt = self._attempt(fence)
        if not attempt.done.is_set():
            attempt.stop_requested = True
            await self._signal(attempt, signal.SIGTERM)
            with trio.move_on_after(grace):
                await attempt.done.wait()
            if not attempt.done.is_set():
                await self._signal(attempt, signal.SIGKILL)
                await attempt.done.wait()
        return await attempt.current_status()

    def hold(self, fence: Fence, seconds: float) -> None:
        """The attempt's lease now runs ``seconds`` more (an optional provider method).

        The agent calls it on every lease grant and renewal; it never blocks. Should
        this process die, the attempt's watchdog stops the engine on the node once
        the last lease passes. An unknown or stale fence is ignored.
        """
        attempt = self._attempts.get(fence.attempt_id)
        if attempt is None or attempt.fence != fence:
            return
        until = time.monotonic() + max(0.0, seconds)
        attempt.extra["lease_until"] = until
        watchdog = attempt.extra.get("watchdog")
        if watchdog is not None:
            watchdog.hold(until)

    async def logs(self, fence: Fence, tail: int = 100) -> list[str]:
        """Return the last ``tail`` lines of the attempt's log (kept after a restart)."""
        return await self._log(fence).tail(tail)

    async def follow_logs(self, fence: Fence, tail: int | None = None) -> AsyncGenerator[str, None]:
        """Yield every log line from the start (or the last ``tail``), then new ones, until
        the attempt ends (a kept log's lines, then the end)."""
        async for line in self._log(fence).follow(tail):
            yield line

    def kept_fence(self, attempt_id: str) -> Fence | None:
        """The fence of an attempt of an earlier run whose log is kept here, or None."""
        return None if attempt_id in self._attempts else self.kept_logs.fence(attempt_id)

    def _log(self, fence: Fence) -> BoundedLog:
        kept = self.kept_fence(fence.attempt_id)
        if kept is None:
            return self._attempt(fence).log
        check_fence({fence.attempt_id: kept}, fence)
        found = self.kept_logs.log(fence.attempt_id)
        if found is None:  # pruned just now
            return self._attempt(fence).log
        return found

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
        """Send one request to the engine through its endpoint contract.

        With ``input_id``, the executor streams that admitted input file as the body.
        """
        attempt = self._attempt(fence)
        if attempt.state != "ready":
            raise EngineUnavailable(
                f"attempt {fence.attempt_id!r} is {attempt.state}, not ready",
                details={"state": attempt.state},
            )
        await self.streams.open(fence, stream_id, method, path, headers, body, input_id=input_id)

    async def read(self, fence: Fence, stream_id: str) -> ReadEvent:
        """Return the stream's next event."""
        self._attempt(fence)
        return await self.streams.read(fence, stream_id)

    async def cancel(self, fence: Fence, stream_id: str) -> None:
        """Close the stream's engine connection at once."""
        self._attempt(fence)
        await self.streams.cancel(fence, stream_id)

    def held(self, fence: Fence, stream_id: str) -> int:
        """How many of the stream's events are queued: ``read`` takes one without waiting."""
        self._attempt(fence)
        return self.streams.held(fence, stream_id)

    # -- supervision -------------------------------------------------------------------

    def _attempt(self, fence: Fence) -> ExecutorAttempt:
        held = self._attempts.get(fence.attempt_id)
        check_fence({} if held is None else {fence.attempt_id: held.fence}, fence)
        return self._attempts[fence.attempt_id]

    async def _supervise(self, attempt: ExecutorAttempt) -> None:
        process = attempt.process
        try:
            pumped = trio.Event()
            probing = trio.CancelScope()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(attempt.log.pump, process.stdout, pumped)
                nursery.start_soon(self._probe_readiness, attempt, probing)
                returncode = await process.wait()
                probing.cancel()
                # Whatever the engine left in its group or cgroup goes now, so the log
                # pipe reaches end-of-file.
                await self._signal(attempt, signal.SIGKILL)
                with trio.move_on_after(5):
                    await pumped.wait()
                nursery.cancel_scope.cancel()
            await self._conclude(attempt, returncode)
        finally:
            with trio.CancelScope(shield=True):
                if getattr(process, "returncode", 0) is None:
                    # Cancelled while the engine runs: the provider is shutting down.
                    await self._stop_engine(attempt, self.default_grace)
                self.streams.detach(attempt.fence.attempt_id)
                watchdog = attempt.extra.pop("watchdog", None)
                if watchdog is not None:
                    await watchdog.end()
                try:
                    await self._release(attempt)
                    # The engine is gone: its socket directory goes now (no litter in the
                    # shared runtime directory); the record stays until the provider stops.
                    await trio.to_thread.run_sync(remove_socket_dir, attempt.socket_path.parent)
                    await trio.to_thread.run_sync(self._write_record, attempt, {"ended": True})
                finally:
                    attempt.log.close()
                    attempt.settle()
                    attempt.done.set()

    async def _conclude(self, attempt: ExecutorAttempt, returncode: int) -> None:
        special = (
            None if attempt.state == "failed" else await self._exit_reason(attempt, returncode)
        )
        attempt.conclude(returncode, special)

    async def _probe_readiness(self, attempt: ExecutorAttempt, scope: trio.CancelScope) -> None:
        with scope:
            failure = await probe_until_ready(
                self.streams,
                attempt.fence.attempt_id,
                attempt.job,
                lambda health: attempt.answered(health, time.time()),
            )
            if failure is not None:
                await self._fail(attempt, *failure)
                return
            if attempt.pid is None:  # an engine that answers has surely started by now
                attempt.pid = await self._engine_pid(attempt, answered=True)
            attempt.state = "ready"
            attempt.settle()

    async def _fail(self, attempt: ExecutorAttempt, reason: str, message: str) -> None:
        """Mark the attempt failed before it was ready, and stop its engine."""
        attempt.state, attempt.reason, attempt.message = "failed", reason, message
        attempt.settle()
        await self._signal(attempt, signal.SIGTERM)
        await trio.sleep(self.default_grace)
        await self._signal(attempt, signal.SIGKILL)

    # -- the lease watchdog --------------------------------------------------------------------

    async def _start_watchdog(self, attempt: ExecutorAttempt) -> None:
        spec = await self._watchdog_spec(attempt)
        if spec is None:
            return
        try:
            watchdog = await Watchdog.start(spec, attempt.extra.get("lease_until"))
        except OSError as exc:
            # The agent still stops the engine when its lease expires; only its own
            # death would now leave the engine behind.
            log.warning("attempt %s runs without a lease watchdog: %s", attempt.key, exc)
            return
        attempt.extra["watchdog"] = watchdog
        await trio.to_thread.run_sync(
            lambda: self._write_record(attempt, {"watchdog": watchdog.record})
        )

    def _end_leftover_watchdogs(self) -> None:
        for _directory, record in self._records():
            end_leftover_watchdog(record)

    # -- attempt directory and record -------------------------------------------------------

    def _socket_dir(self, key: str) -> Path:
        """The attempt's socket directory, in the runtime directory (short whatever
        ``state_dir`` is)."""
        return socket_dir(self.runtime_dir, self.state_dir, key)

    def _prepare_directory(self, attempt: ExecutorAttempt) -> None:
        # Again at each launch: a cleaner may have removed the runtime directory since
        # (and someone else made one in its place).
        ensure_runtime_dir(self.runtime_dir)
        prepare_directory(attempt, self.name)

    def _write_record(self, attempt: ExecutorAttempt, changes: Mapping[str, Any]) -> None:
        """Update the attempt's record (blocking)."""
        write_record(attempt, self.name, changes)

    def _remove_record(self, directory: Path) -> None:
        """Remove an attempt's directory, record and socket directory (blocking); its
        log is kept (:class:`~ficc_core.executor.logs.KeptLogs`)."""
        remove_socket_dir(self._socket_dir(directory.name))
        try:
            record = json.loads((directory / RECORD).read_text())
            self.kept_logs.keep(directory, record if isinstance(record, dict) else {})
        except FileNotFoundError:
            pass  # no record: nothing says whose log it was
        except (OSError, ValueError) as exc:
            log.warning("the log of attempt directory %s is not kept: %s", directory.name, exc)
        shutil.rmtree(directory, ignore_errors=True)

    def _records(self) -> list[tuple[Path, dict[str, Any]]]:
        """Every attempt directory with its record (blocking)."""
        return read_records(self.attempts_dir)

    # -- what a concrete provider supplies ---------------------------------------------------

    async def _connect(self, attempt: ExecutorAttempt) -> trio.abc.Stream:
        endpoint = attempt.job.endpoint
        if endpoint.transport == "unix":
            return await trio.open_unix_socket(str(attempt.socket_path))
        netns = await self._netns_path(attempt)
        if netns is None or attempt.done.is_set():
            raise OSError(f"attempt {attempt.fence.attempt_id!r} has no running engine")
        assert endpoint.port is not None
        return await open_tcp_in_netns(netns, endpoint.port)

    async def _netns_path(self, attempt: ExecutorAttempt) -> str | None:
        """The engine's network namespace (``/proc/<pid>/ns/net``), for the TCP transport."""
        return None

    async def _check_launch(
        self, job: Job, limits: ResourceLimits | None, runtime: Runtime | None
    ) -> None:
        """Refuse what this provider cannot run safely (raise an ExecutorError)."""

    async def _start(
        self, attempt: ExecutorAttempt, limits: ResourceLimits | None, runtime: Runtime | None
    ) -> EngineProcess:
        raise NotImplementedError

    async def _signal(self, attempt: ExecutorAttempt, signum: int) -> None:
        raise NotImplementedError

    async def _engine_pid(self, attempt: ExecutorAttempt, *, answered: bool) -> int | None:
        """The engine's process ID on this host, or None where it is not known (yet).

        Asked right after ``_start`` and, while still None, once the engine answered
        its readiness probe (``answered``).
        """
        return None

    async def _exit_reason(
        self, attempt: ExecutorAttempt, returncode: int
    ) -> tuple[str, str] | None:
        """Return (reason, message) for a special ending, such as a memory-limit kill."""
        return None

    async def _release(self, attempt: ExecutorAttempt) -> None:
        """Free what the attempt held (cgroups, container) once it has ended."""

    async def _recover(self) -> None:
        """Find what an earlier run left behind and remove it, before serving."""

    async def _watchdog_spec(self, attempt: ExecutorAttempt) -> dict[str, Any] | None:
        """How a watchdog stops this attempt's engine without the agent, or None for none.

        The keys are those ``watchdog_helper.py`` reads: ``pid`` and ``start_time``
        (the process to watch), ``group`` (a process group to signal), ``procs``
        (``cgroup.procs`` files whose processes are killed), ``commands`` (argv
        lists run first) and ``grace`` (seconds between SIGTERM and SIGKILL).
        """
        return None

    async def _close(self) -> None:
        """Free what the provider itself held, after every attempt has stopped."""
