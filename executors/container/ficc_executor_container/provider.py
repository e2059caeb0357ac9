"""The container executor provider: engines as podman (or docker) containers.

Every attempt is one container named ``ficc-<state>-<attempt key>``, so whatever
a crashed provider left behind can always be found and removed (``rm -f``). The
container runs with ``--network none``, a read-only root, no capabilities,
``no-new-privileges``, the job's memory, CPU, pids and open-file limits, its
inputs bind-mounted read-only and its socket directory bind-mounted at
``/ficc/sock``. The image is pinned: the runtime's image digest must be the local
image's ID, or the launch is refused.
"""

from __future__ import annotations

import hashlib
import math
import os
import resource
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import trio

from ficc_core import (
    ExecutorAttempt,
    ExecutorSnapshot,
    ImageDigestMismatch,
    InstalledRuntime,
    IsolationUnavailable,
    Job,
    LaunchFailed,
    ProviderInfo,
    ResourceLimits,
    Runtime,
    SupervisingProvider,
    measure_resources,
    package_digest,
)

#: Where the attempt's socket directory and working directory appear in the container.
CONTAINER_SOCKET_DIR = "/ficc/sock"
CONTAINER_WORKDIR = "/ficc/work"
SOCKET_ENV = "FICC_ENDPOINT_SOCKET"
ATTEMPT_DIR_ENV = "FICC_ATTEMPT_DIR"
SOCKET_PLACEHOLDER = "{endpoint_socket}"
V1_MEMORY = Path("/sys/fs/cgroup/memory")


def default_ulimits() -> tuple[str, ...]:
    """Explicit ulimits: the host's hard open-file limit and 32768 processes.

    podman's defaults ask the runtime to *raise* limits, which an unprivileged
    or nested host refuses ("error setting rlimit ... operation not permitted").
    """
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    files = 1048576 if hard < 0 else hard
    return (f"nofile={files}:{files}", "nproc=32768:32768")


#: What the agent sets to show a process its GPUs; a container's devices say it instead.
GPU_VISIBILITY_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})


def gpu_device_args(limits: ResourceLimits | None) -> list[str]:
    """The device requests for the reserved GPUs: CDI names (``nvidia.com/gpu=<index>``,
    what ``nvidia-ctk cdi generate`` writes by default), one per GPU; podman then puts
    exactly those devices, and the driver's libraries, in the container."""
    if limits is None:
        return []
    return [arg for gpu in limits.gpus for arg in ("--device", f"nvidia.com/gpu={gpu.index}")]


class ContainerProvider(SupervisingProvider):
    """Run engine jobs as containers.

    :param images: runtime name -> local image reference (``localhost/llama:1``).
    :param default_runtime: the runtime a launch without ``runtime`` uses; default
        the only configured one.
    :param command: the container command, ``("podman",)`` or ``("docker",)``.
    :param runtime: the OCI runtime (``runc``, ``crun``); None keeps the engine's default.
    :param ulimits: ``--ulimit`` values; default :func:`default_ulimits`.
    :param mounts: host paths bind-mounted read-only at the same path (a runtime
        that uses the host's interpreter, as the tests do).
    """

    API_VERSION: ClassVar[int] = 1
    name: ClassVar[str] = "container"

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] = "/var/lib/ficc/container",
        images: Mapping[str, str] | None = None,
        default_runtime: str | None = None,
        command: Sequence[str] = ("podman",),
        runtime: str | None = None,
        ulimits: Sequence[str] | None = None,
        mounts: Sequence[str] = (),
        **options: Any,
    ) -> None:
        super().__init__(state_dir=state_dir, **options)
        self.images = dict(images or {})
        if default_runtime is None and len(self.images) == 1:
            default_runtime = next(iter(self.images))
        self.default_runtime = default_runtime
        self.command = tuple(command)
        self.oci_runtime = runtime
        self.ulimits = tuple(default_ulimits() if ulimits is None else ulimits)
        self.mounts = tuple(mounts)
        self.state_hash = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:10]
        self.unavailable: str | None = "not probed yet"
        self.cgroup_parent: str | None = None

    def container_name(self, key: str) -> str:
        """The deterministic container name of an attempt key."""
        return f"ficc-{self.state_hash}-{key}"

    async def _engine(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            [*self.command, *args],
            capture_stdout=True,
            capture_stderr=True,
            check=check,
            cwd=self.state_dir,
        )

    # -- start-up ---------------------------------------------------------------------

    async def _recover(self) -> None:
        try:
            result = await self._engine("version", "--format", "{{.Client.Version}}")
            self.unavailable = None if result.returncode == 0 else result.stderr.decode()[-300:]
        except OSError as exc:
            self.unavailable = f"{self.command[0]} cannot run: {exc}"
        if self.unavailable is not None:
            return
        info = await self._engine("info", "--format", "{{.Host.CgroupManager}}")
        manager = info.stdout.decode().strip()
        if manager == "cgroupfs" and await trio.to_thread.run_sync(V1_MEMORY.is_dir):
            # podman cannot tell an out-of-memory kill on cgroup v1 (State.OOMKilled stays
            # false), so each container gets a parent cgroup of ours whose peak usage
            # survives the container.
            self.cgroup_parent = f"/ficc-container-{self.state_hash}"
        names = {self.container_name(directory.name) for directory, _ in self._records()}
        listed = await self._engine(
            "ps", "-a", "--filter", f"label=ficc.state={self.state_hash}", "--format", "{{.Names}}"
        )
        names.update(listed.stdout.decode().split())
        for name in sorted(names):
            await self._engine("rm", "-f", "-t", "0", name)
        for directory, _ in self._records():
            await trio.to_thread.run_sync(self._remove_record, directory)

    async def image_id(self, runtime_name: str) -> str | None:
        """The local image ID (``sha256:<hex>``) of a configured runtime, None if absent."""
        result = await self._engine(
            "image", "inspect", "--format", "{{.Id}}", self.images[runtime_name]
        )
        if result.returncode != 0:
            return None
        image = result.stdout.decode().strip()
        return image if image.startswith("sha256:") else f"sha256:{image}"

    # -- snapshot -------------------------------------------------------------------------

    async def snapshot(self) -> ExecutorSnapshot:
        """Describe this node and the runtime images installed for this provider."""
        runtimes = []
        if self.unavailable is None:
            for runtime_name in sorted(self.images):
                image = await self.image_id(runtime_name)
                if image is not None:
                    runtimes.append(
                        InstalledRuntime(
                            name=runtime_name,
                            executor_provider=self.name,
                            package_digest=package_digest(Path(__file__).parent),
                            image_digest=image,
                        )
                    )
        return await trio.to_thread.run_sync(self._snapshot, runtimes)

    def _snapshot(self, runtimes: list[InstalledRuntime]) -> ExecutorSnapshot:
        available = self.unavailable is None
        labels = {
            "isolation.network": "container-none" if available else "unavailable",
            "container.command": self.command[0],
        }
        if self.oci_runtime:
            labels["container.runtime"] = self.oci_runtime
        if not available:
            labels["isolation.problem"] = (self.unavailable or "")[:256]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return ExecutorSnapshot(
            node_id=self.node_id,
            providers=[
                ProviderInfo(name=self.name, package_digest=package_digest(Path(__file__).parent))
            ],
            resources=measure_resources(self.state_dir),
            runtimes=runtimes,
            labels=labels,
            endpoint_version=1 if available else None,
        )

    # -- launch ----------------------------------------------------------------------------

    async def _check_launch(
        self, job: Job, limits: ResourceLimits | None, runtime: Runtime | None
    ) -> None:
        if self.unavailable is not None:
            raise IsolationUnavailable(
                f"{self.command[0]} is not usable here ({self.unavailable}); the container "
                "provider refuses to launch",
                details={"reason": self.unavailable},
            )
        if runtime is not None and (
            runtime.executor_provider != self.name or runtime.network != "none"
        ):
            raise LaunchFailed(
                f"the runtime binds executor {runtime.executor_provider!r} with network "
                f"{runtime.network!r}; this is the container provider, which runs "
                "network: none only"
            )

    async def _pinned_image(self, runtime: Runtime | None) -> str:
        if runtime is None:
            if self.default_runtime is None:
                raise LaunchFailed("no runtime given and no default runtime image is configured")
            image = await self.image_id(self.default_runtime)
            if image is None:
                raise ImageDigestMismatch(
                    f"the image {self.images[self.default_runtime]!r} is not present locally"
                )
            return image
        local = {name: await self.image_id(name) for name in sorted(self.images)}
        if runtime.image_digest in local.values():
            return runtime.image_digest
        found = ", ".join(f"{name}: {image}" for name, image in local.items()) or "none"
        raise ImageDigestMismatch(
            f"no local runtime image has the pinned digest {runtime.image_digest} "
            f"(installed: {found}); refusing to launch an unpinned image",
            details={"image_digest": runtime.image_digest},
        )

    async def _start(
        self, attempt: ExecutorAttempt, limits: ResourceLimits | None, runtime: Runtime | None
    ) -> trio.Process:
        image = await self._pinned_image(runtime)
        name = self.container_name(attempt.key)
        attempt.extra["name"] = name
        await trio.to_thread.run_sync(self._write_record, attempt, {"container": name})
        inner_socket = f"{CONTAINER_SOCKET_DIR}/{attempt.job.endpoint.socket}"
        args = [
            "run", "--name", name, "--network", "none", "--read-only",
            "--cap-drop", "all", "--security-opt", "no-new-privileges",
            "--label", f"ficc.state={self.state_hash}",
            "--label", f"ficc.attempt={attempt.key}",
            "--workdir", CONTAINER_WORKDIR,
            "-v", f"{attempt.workdir}:{CONTAINER_WORKDIR}:rw",
            "-v", f"{attempt.socket_path.parent}:{CONTAINER_SOCKET_DIR}:rw",
            "--env", f"{SOCKET_ENV}={inner_socket}",
            "--env", f"{ATTEMPT_DIR_ENV}=/ficc",
        ]  # fmt: skip
        if self.oci_runtime:
            args += ["--runtime", self.oci_runtime]
        if self.cgroup_parent:
            args += ["--cgroup-parent", f"{self.cgroup_parent}/{attempt.key}"]
        ulimits = list(self.ulimits)
        if limits is not None and limits.open_files:
            ulimits = [u for u in ulimits if not u.startswith("nofile=")]
            ulimits.append(f"nofile={limits.open_files}:{limits.open_files}")
        for ulimit in ulimits:
            args += ["--ulimit", ulimit]
        if limits is not None:
            args += [
                "--memory",
                str(limits.memory_bytes),
                "--memory-swap",
                str(limits.memory_bytes),
            ]
            args += ["--cpus", f"{limits.cpus:g}"]
            if limits.pids:
                args += ["--pids-limit", str(limits.pids)]
        for path in self.mounts:
            args += ["-v", f"{path}:{path}:ro"]
        for item in attempt.job.inputs:
            args += ["-v", f"{item.path}:{item.path}:ro"]
        args += gpu_device_args(limits)
        for env_name, value in attempt.job.env.items():
            if limits is not None and limits.gpus and env_name in GPU_VISIBILITY_ENV:
                continue  # the container sees only its devices, numbered from 0 inside
            args += ["--env", f"{env_name}={value}"]
        argv = [arg.replace(SOCKET_PLACEHOLDER, inner_socket) for arg in attempt.job.argv]
        args += [image, *argv]
        try:
            return await trio.lowlevel.open_process(
                [*self.command, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # conmon writes marker files (an "oom" file on a memory kill) into its
                # working directory: keep them in our state directory.
                cwd=self.state_dir,
            )
        except OSError as exc:
            raise LaunchFailed(f"cannot run {self.command[0]}: {exc}") from None

    async def _watchdog_spec(self, attempt: ExecutorAttempt) -> dict[str, Any] | None:
        # Without the agent: remove the container (stopping it within the grace).
        grace = math.ceil(self.default_grace)
        name = attempt.extra["name"]
        return {"commands": [[*self.command, "rm", "-f", "-t", str(grace), name]], "grace": grace}

    async def _netns_path(self, attempt: ExecutorAttempt) -> str | None:
        pid = await self._container_pid(attempt)
        return None if pid is None else f"/proc/{pid}/ns/net"

    async def _engine_pid(self, attempt: ExecutorAttempt, *, answered: bool) -> int | None:
        # Right after `run` the container may not exist yet: ask once the engine answered.
        return await self._container_pid(attempt) if answered else attempt.extra.get("pid")

    async def _container_pid(self, attempt: ExecutorAttempt) -> int | None:
        """The container's main PID as the engine reports it (kept once known), or None."""
        pid = attempt.extra.get("pid")
        if pid is None:
            result = await self._engine(
                "inspect", "--format", "{{.State.Pid}}", attempt.extra["name"]
            )
            text = result.stdout.decode().strip()
            if result.returncode != 0 or not text.isdigit() or text == "0":
                return None
            pid = attempt.extra["pid"] = int(text)
        return pid

    async def _signal(self, attempt: ExecutorAttempt, signum: int) -> None:
        name = attempt.extra.get("name")
        if name is None:
            return
        await self._engine(
            "kill", "--signal", signal.Signals(signum).name.removeprefix("SIG"), name
        )

    async def _exit_reason(
        self, attempt: ExecutorAttempt, returncode: int
    ) -> tuple[str, str] | None:
        result = await self._engine(
            "inspect", "--format", "{{.State.OOMKilled}}", attempt.extra["name"]
        )
        oom_killed = result.stdout.decode().strip() == "true"
        if not oom_killed and returncode == 137 and attempt.limits and not attempt.stop_requested:
            peak = await trio.to_thread.run_sync(self._peak_memory, attempt.key)
            oom_killed = peak is not None and peak >= attempt.limits.memory_bytes
        if oom_killed:
            limit = attempt.limits.memory_bytes if attempt.limits else 0
            return (
                "memory_limit",
                f"the engine exceeded its memory limit of {limit} bytes and was killed "
                "by the kernel",
            )
        if returncode >= 125 and attempt.state != "ready" and not attempt.stop_requested:
            # 125-127: the container engine could not create or run the container.
            tail = "; ".join(await attempt.log.tail(3))
            return "launch_failed", f"{self.command[0]} could not run the container: {tail}"
        return None

    async def _release(self, attempt: ExecutorAttempt) -> None:
        name = attempt.extra.get("name")
        if name is not None:
            await self._engine("rm", "-f", "-t", "0", name)
        await trio.to_thread.run_sync(self._remove_cgroups, attempt.key)

    async def _close(self) -> None:
        await trio.to_thread.run_sync(self._remove_cgroups, "")

    def _peak_memory(self, key: str) -> int | None:
        if self.cgroup_parent is None:
            return None
        path = V1_MEMORY / self.cgroup_parent.lstrip("/") / key / "memory.max_usage_in_bytes"
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def _remove_cgroups(self, key: str) -> None:
        """Remove the attempt's parent cgroups (or, with key "", the provider's), bottom-up."""
        if self.cgroup_parent is None:
            return
        for hierarchy in V1_MEMORY.parent.iterdir():
            top = hierarchy / self.cgroup_parent.lstrip("/") / key
            if not top.is_dir():
                continue
            for directory, _subdirectories, _files in sorted(os.walk(top), reverse=True):
                try:
                    os.rmdir(directory)
                except OSError:
                    pass
