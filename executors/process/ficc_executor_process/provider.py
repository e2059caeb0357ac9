"""The process executor provider: engines as isolated, limited host processes.

Each attempt runs through ``sandbox.py`` (a stdlib-only pre-exec helper) in its
own session and process group, inside its own cgroups, network namespace and
mount namespace, with exactly the environment its job declares, its inputs
bind-mounted read-only and a private working directory. If the network
namespace cannot be created here, :meth:`ProcessProvider.snapshot` says so
(``endpoint_version`` is left out and ``isolation.network`` is ``unavailable``)
and every launch is refused with ``isolation_unavailable``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import trio

from ficc_core import (
    ExecutorAttempt,
    ExecutorSnapshot,
    IsolationUnavailable,
    Job,
    LaunchFailed,
    ProviderInfo,
    ResourceLimits,
    Runtime,
    SupervisingProvider,
    measure_resources,
    package_digest,
    process_start_time,
)

from . import cgroups

SANDBOX = Path(__file__).with_name("sandbox.py")
#: The open-file limit an engine gets when its limits do not say.
DEFAULT_OPEN_FILES = 65536
#: Environment variables the executor adds to the job's own.
SOCKET_ENV = "FICC_ENDPOINT_SOCKET"
ATTEMPT_DIR_ENV = "FICC_ATTEMPT_DIR"
#: ``{endpoint_socket}`` in an argv element is replaced by the socket's path.
SOCKET_PLACEHOLDER = "{endpoint_socket}"


class ProcessProvider(SupervisingProvider):
    """Run engine jobs as isolated host processes.

    :param state_dir: attempt directories and records (see ``SupervisingProvider``).
    :param cgroup_name: the name of this provider's parent cgroup; default derived
        from ``state_dir`` so two providers never share one.
    :param use_cgroups: set False to use only rlimits and CPU affinity.
    """

    API_VERSION: ClassVar[int] = 1
    name: ClassVar[str] = "process"

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] = "/var/lib/ficc/process",
        cgroup_name: str | None = None,
        use_cgroups: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(state_dir=state_dir, **options)
        self.cgroup_name = cgroup_name or (
            "ficc-process-" + hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
        )
        self.use_cgroups = use_cgroups
        self.cgroups: cgroups.CgroupLayout | None = None
        self.isolation_problem: str | None = "not probed yet"
        #: The CPUs each running engine is held to, by attempt key (without a cpu cgroup).
        self._cores: dict[str, tuple[int, ...]] = {}

    # -- start-up ------------------------------------------------------------------------

    async def _recover(self) -> None:
        if self.use_cgroups:
            self.cgroups = await trio.to_thread.run_sync(cgroups.detect, self.cgroup_name)
        self.isolation_problem = await self._probe_isolation()
        await trio.to_thread.run_sync(self._remove_leftovers)

    async def _probe_isolation(self) -> str | None:
        try:
            result = await trio.run_process(
                [sys.executable, "-I", str(SANDBOX), "--probe"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env={},
            )
            report = json.loads(result.stdout)
        except (OSError, ValueError) as exc:
            return f"the isolation probe could not run: {exc}"
        return None if report["network"] else report["reason"]

    def _remove_leftovers(self) -> None:
        """Kill and remove every engine an earlier run of this provider left behind."""
        for directory, record in self._records():
            pid, start = record.get("pid"), record.get("start_time")
            if pid and start and process_start_time(pid) == start:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if self.cgroups is not None:
                cgroups.kill_and_remove(self.cgroups.paths(directory.name))
            self._remove_record(directory)
        if self.cgroups is not None:
            for key in cgroups.leftovers(self.cgroups):
                cgroups.kill_and_remove(self.cgroups.paths(key))

    async def _close(self) -> None:
        if self.cgroups is not None:
            await trio.to_thread.run_sync(cgroups.remove_parents, self.cgroups)

    # -- snapshot --------------------------------------------------------------------------

    async def snapshot(self) -> ExecutorSnapshot:
        """Describe this node; without network isolation it does not offer inference."""
        return await trio.to_thread.run_sync(self._snapshot)

    def _snapshot(self) -> ExecutorSnapshot:
        isolated = self.isolation_problem is None
        controllers = self.cgroups.controllers if self.cgroups else frozenset()
        version = f"cgroup-v{self.cgroups.version}" if self.cgroups else None
        labels = {
            "isolation.network": "netns" if isolated else "unavailable",
            "limits.memory": version if "memory" in controllers else "rlimit-as",
            "limits.cpu": version if "cpu" in controllers else "affinity",
            "limits.pids": version if "pids" in controllers else "none",
        }
        if not isolated:
            labels["isolation.problem"] = (self.isolation_problem or "")[:256]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return ExecutorSnapshot(
            node_id=self.node_id,
            providers=[
                ProviderInfo(name=self.name, package_digest=package_digest(Path(__file__).parent))
            ],
            resources=measure_resources(self.state_dir),
            labels=labels,
            endpoint_version=1 if isolated else None,
        )

    # -- launch ------------------------------------------------------------------------------

    async def _check_launch(
        self, job: Job, limits: ResourceLimits | None, runtime: Runtime | None
    ) -> None:
        if self.isolation_problem is not None:
            raise IsolationUnavailable(
                "this host cannot isolate an engine from the network "
                f"({self.isolation_problem}); the process provider refuses to launch "
                "rather than run an engine with network access",
                details={"reason": self.isolation_problem},
            )
        if runtime is not None and (
            runtime.executor_provider != self.name or runtime.network != "none"
        ):
            raise LaunchFailed(
                f"the runtime binds executor {runtime.executor_provider!r} with network "
                f"{runtime.network!r}; this is the process provider, which runs network: none only",
            )

    async def _start(
        self, attempt: ExecutorAttempt, limits: ResourceLimits | None, runtime: Runtime | None
    ) -> trio.Process:
        cores = self._claim_cores(attempt, limits)
        spec = await trio.to_thread.run_sync(self._sandbox_spec, attempt, limits, cores)
        spec_path = attempt.directory / "sandbox.json"
        await trio.to_thread.run_sync(spec_path.write_text, json.dumps(spec))
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-I", str(SANDBOX), str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={},
                cwd=str(attempt.workdir),
            )
        except OSError as exc:
            raise LaunchFailed(f"cannot start the sandbox helper: {exc}") from None
        attempt.extra["pid"] = process.pid
        start_time = await trio.to_thread.run_sync(process_start_time, process.pid)
        attempt.extra["start_time"] = start_time
        record = {"pid": process.pid, "start_time": start_time}
        await trio.to_thread.run_sync(self._write_record, attempt, record)
        return process

    async def _watchdog_spec(self, attempt: ExecutorAttempt) -> dict[str, Any] | None:
        # Without the agent: the engine's group, then whatever is left in its cgroups.
        pid = attempt.extra["pid"]
        return {
            "pid": pid,
            "start_time": attempt.extra["start_time"],
            "group": pid,
            "procs": cgroups.procs_files(attempt.extra.get("cgroups", {})),
            "grace": self.default_grace,
        }

    def _claim_cores(self, attempt: ExecutorAttempt, limits: ResourceLimits | None) -> list[int]:
        """The CPUs an engine is held to where no cpu cgroup limits it (none otherwise):
        as many as its limit rounds up to, those the fewest of this provider's running
        engines hold, lowest first on a tie. Engines spread over the node instead of
        all sharing its first CPUs; :meth:`_release` gives them back."""
        controllers = self.cgroups.controllers if self.cgroups else frozenset()
        if limits is None or "cpu" in controllers:
            return []
        available = sorted(os.sched_getaffinity(0))
        held = Counter(core for cores in self._cores.values() for core in cores)
        wanted = max(1, math.ceil(limits.cpus))
        chosen = sorted(sorted(available, key=lambda core: (held[core], core))[:wanted])
        self._cores[attempt.key] = tuple(chosen)
        return chosen

    def _sandbox_spec(
        self, attempt: ExecutorAttempt, limits: ResourceLimits | None, cores: list[int]
    ) -> dict[str, Any]:
        job = attempt.job
        env = dict(job.env)
        env[SOCKET_ENV] = str(attempt.socket_path)
        env[ATTEMPT_DIR_ENV] = str(attempt.directory)
        if limits is not None and limits.gpus and "CUDA_VISIBLE_DEVICES" not in env:
            # The agent names the reserved devices by UUID; launched without it, by index,
            # counted in PCI order as the node's GPU inventory counts them.
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu.index) for gpu in limits.gpus)
        argv = [arg.replace(SOCKET_PLACEHOLDER, str(attempt.socket_path)) for arg in job.argv]
        executable = argv[0]
        if "/" not in executable:
            found = shutil.which(executable, path=job.env.get("PATH", os.defpath))
            if found is None:
                raise LaunchFailed(
                    f"{executable!r} is not on the job's PATH; give an absolute path",
                    details={"executable": executable},
                )
            argv[0] = found
        controllers = self.cgroups.controllers if self.cgroups else frozenset()
        paths: dict[str, Path] = {}
        if self.cgroups is not None:
            paths = cgroups.create(
                self.cgroups,
                attempt.key,
                memory_bytes=limits.memory_bytes if limits else None,
                cpus=limits.cpus if limits else None,
                pids=limits.pids if limits else None,
            )
            attempt.extra["cgroups"] = paths
        hard_files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        open_files = limits.open_files if limits and limits.open_files else None
        if open_files is None:
            open_files = (
                DEFAULT_OPEN_FILES if hard_files < 0 else min(DEFAULT_OPEN_FILES, hard_files)
            )
        rlimits = {"RLIMIT_NOFILE": open_files}
        if limits and "memory" not in controllers:
            rlimits["RLIMIT_AS"] = limits.memory_bytes
        return {
            "argv": argv,
            "env": env,
            "cwd": str(attempt.workdir),
            "read_only": [item.path for item in job.inputs],
            "cgroup_procs": cgroups.procs_files(paths),
            "rlimits": rlimits,
            "affinity": cores,
        }

    async def _netns_path(self, attempt: ExecutorAttempt) -> str | None:
        pid = attempt.extra.get("pid")
        return None if pid is None else f"/proc/{pid}/ns/net"

    async def _engine_pid(self, attempt: ExecutorAttempt, *, answered: bool) -> int | None:
        # The sandbox helper execs the engine: the child's PID is the engine's.
        return attempt.extra.get("pid")

    # -- signals, exit and release ------------------------------------------------------------

    async def _signal(self, attempt: ExecutorAttempt, signum: int) -> None:
        pid = attempt.extra.get("pid")
        if pid is not None:
            try:
                os.killpg(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        if signum == signal.SIGKILL and attempt.extra.get("cgroups"):
            # A process that left the group (setsid) is still in the cgroups.
            for leftover in await trio.to_thread.run_sync(
                cgroups.pids_in, attempt.extra["cgroups"]
            ):
                try:
                    os.kill(leftover, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    async def _exit_reason(
        self, attempt: ExecutorAttempt, returncode: int
    ) -> tuple[str, str] | None:
        if returncode == 125:
            return "isolation_failed", "the sandbox could not isolate the engine; it never ran"
        paths = attempt.extra.get("cgroups")
        if paths and self.cgroups is not None:
            if await trio.to_thread.run_sync(cgroups.oom_killed, self.cgroups, paths):
                limit = attempt.limits.memory_bytes if attempt.limits else 0
                return (
                    "memory_limit",
                    f"the engine exceeded its memory limit of {limit} bytes and was killed "
                    "by the kernel",
                )
        return None

    async def _release(self, attempt: ExecutorAttempt) -> None:
        self._cores.pop(attempt.key, None)
        paths = attempt.extra.pop("cgroups", None)
        if paths:
            await trio.to_thread.run_sync(cgroups.kill_and_remove, paths)
