"""``ficc doctor``: what this node can and cannot do, each finding with what to do.

Every check reads the same facts the agent reports (its providers' isolation probes and
limit mechanisms, the runtimes it checked, GPU discovery, free disk), so the doctor
never disagrees with what the controller is told; the controller checks (reachability,
TLS, clock skew) ask the controller as the agent does.
"""

from __future__ import annotations

import enum
import os
import re
import ssl
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx

from ..executor.errors import RuntimeDirUnusable
from ..executor.runtime_dir import FIX, MAX_RUNTIME_DIR, MAX_SOCKET_PATH, probe_socket

if TYPE_CHECKING:
    from .agent import Agent

GIB = 1024**3
#: Free disk under the agent directory below which staging a model fails / may fail.
DISK_FAIL = 1 * GIB
DISK_WARN = 20 * GIB
#: Clock skew against the controller (seconds): credential lifetimes, TLS validity and
#: log timestamps are read on both sides.
SKEW_WARN = 2.0
SKEW_FAIL = 30.0


class Status(enum.StrEnum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@attrs.frozen
class Finding:
    """One check's result: ``status``, what was found, and (unless OK) what to do."""

    check: str
    status: Status
    message: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        found = {"check": self.check, "status": str(self.status), "message": self.message}
        if self.fix:
            found["fix"] = self.fix
        return found

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(
            str(data["check"]), Status(data["status"]), str(data["message"]), data.get("fix")
        )


_LIMITS = {
    "limits.memory": (
        "memory",
        "rlimit-as",
        "memory is bounded only by RLIMIT_AS (address space, not resident memory)",
        "delegate the cgroup v2 memory controller to this agent (systemd: Delegate=yes)",
    ),
    "limits.cpu": (
        "CPU",
        "affinity",
        "CPUs are bounded only by affinity to whole cores",
        "delegate the cgroup v2 cpu controller to this agent (systemd: Delegate=yes)",
    ),
    "limits.pids": (
        "process count",
        "none",
        "the number of processes an engine starts is not bounded",
        "delegate the cgroup v2 pids controller to this agent (systemd: Delegate=yes)",
    ),
}


def isolation_findings(labels: dict[str, str], providers: Iterable[str]) -> list[Finding]:
    """Network isolation and which resource limits are enforceable, from the labels."""
    found = []
    network = labels.get("isolation.network")
    names = ", ".join(providers)
    if network in (None, "unavailable"):
        problem = labels.get("isolation.problem", "the provider could not isolate engines")
        found.append(
            Finding(
                "isolation",
                Status.FAIL,
                f"engines cannot be run without a network ({names}): {problem}",
                "run the agent where it may create network namespaces (as root, or with "
                "unprivileged user namespaces enabled); nothing is placed here until then",
            )
        )
    else:
        how = {"netns": "in their own network namespace", "container-none": "--network none"}
        found.append(
            Finding(
                "isolation", Status.OK, f"engines run with no network ({how.get(network, network)})"
            )
        )
    for label, (what, weak, warning, fix) in _LIMITS.items():
        value = labels.get(label)
        if value is None:
            continue  # a provider that does not report it (container: podman enforces)
        if value == weak:
            found.append(Finding(label, Status.WARN, warning, fix))
        else:
            found.append(Finding(label, Status.OK, f"{what} limits are enforced ({value})"))
    return found


def runtime_findings(installed: Sequence[Any], problems: dict[str, str]) -> list[Finding]:
    """Each runtime: its digest and executable, or why it was refused and the fix."""
    found = []
    for runtime in installed:
        where = f", {runtime.executable}" if runtime.executable else ""
        found.append(
            Finding(
                f"runtime/{runtime.name}",
                Status.OK,
                f"{runtime.executor_provider}: {runtime.image_digest}{where}",
            )
        )
    for name, problem in problems.items():
        digest = re.search(r"has digest (sha256:[0-9a-f]{64}), not the declared", problem)
        if digest:
            fix = (
                f"if this executable is the one specifications should bind, declare "
                f'image_digest = "{digest.group(1)}" for {name} in the agent configuration; '
                "otherwise reinstall the runtime whose digest they bind"
            )
        elif "cannot read" in problem:
            fix = "install the runtime's executable at that path, or correct 'executable'"
        else:
            fix = "correct the runtime's declaration in the agent configuration"
        found.append(Finding(f"runtime/{name}", Status.FAIL, problem, fix))
    return found


def gpu_findings(devices: Sequence[Any], source: str | None, driver: str | None, error: str | None):
    """GPUs and the driver."""
    if error:
        return [
            Finding(
                "gpus",
                Status.FAIL,
                f"GPU discovery failed: {error}",
                "check the NVIDIA driver (nvidia-smi must answer); set skip_gpus = true in "
                "the agent configuration to run this node without its GPUs",
            )
        ]
    if not devices:
        return [Finding("gpus", Status.OK, "no GPUs (no NVIDIA driver on this node)")]
    names = ", ".join(f"{d.index}: {d.name} ({d.memory_bytes / GIB:.0f} GiB)" for d in devices)
    return [
        Finding("gpus", Status.OK, f"{len(devices)} GPU(s) via {source}, driver {driver}: {names}")
    ]


def disk_findings(free: int, where: str) -> list[Finding]:
    shown = f"{free / GIB:.1f} GiB free under {where}"
    if free < DISK_FAIL:
        return [Finding("disk", Status.FAIL, shown, "free space there: models are staged in it")]
    if free < DISK_WARN:
        return [
            Finding(
                "disk",
                Status.WARN,
                shown,
                "a model is staged whole before it runs: keep its size free (a 40 GB model "
                "needs 40 GB)",
            )
        ]
    return [Finding("disk", Status.OK, shown)]


def directory_findings(agent_dir: Path, runtime_dir: Path) -> list[Finding]:
    """The agent directory is writable, and an engine's socket can be bound in the
    runtime directory at the longest path an engine may need (blocking)."""
    found = []
    try:
        agent_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=agent_dir):
            pass
    except OSError as exc:
        found.append(
            Finding(
                "agent_dir",
                Status.FAIL,
                f"cannot write the agent directory {agent_dir}: {exc.strerror or exc}",
                "choose another with --agent-dir (FICC_AGENT_DIR, setting agent_dir) or fix "
                "its permissions",
            )
        )
    else:
        found.append(Finding("agent_dir", Status.OK, f"{agent_dir} is writable"))
    try:
        probe_socket(runtime_dir)
    except RuntimeDirUnusable as exc:
        # One line that names the setting: every launch would fail with it.
        found.append(Finding("runtime_dir", Status.FAIL, exc.message))
    except OSError as exc:
        found.append(
            Finding(
                "runtime_dir",
                Status.FAIL,
                f"cannot bind an engine socket in {runtime_dir}: {exc.strerror or exc}",
                FIX.replace("shorter", "writable"),
            )
        )
    else:
        length = len(os.fsencode(runtime_dir))
        found.append(
            Finding(
                "runtime_dir",
                Status.OK,
                f"engine sockets in {runtime_dir} ({length} of at most {MAX_RUNTIME_DIR} "
                f"bytes; the longest socket path fits in {MAX_SOCKET_PATH})",
            )
        )
    return found


async def node_findings(agent: Agent) -> list[Finding]:
    """Everything the node itself can tell: isolation, limits, runtimes, GPUs, disk.

    The agent must be running (its providers probed their isolation when they started).
    """
    snapshot = await agent.snapshot()
    inventory = await agent.gpu_inventory()
    return [
        *isolation_findings(snapshot.labels, [p.name for p in snapshot.providers]),
        *runtime_findings(snapshot.runtimes, agent.runtime_problems),
        *gpu_findings(inventory.devices, inventory.source, inventory.driver, inventory.error),
        *disk_findings(snapshot.resources.disk_free_bytes, str(agent.state_dir)),
    ]


def skew_finding(skew: float) -> Finding:
    """The clock against the controller's (positive: the controller is ahead)."""
    shown = f"clock differs from the controller's by {skew:+.2f} s"
    fix = "run NTP (chrony or systemd-timesyncd) on both machines"
    if abs(skew) > SKEW_FAIL:
        return Finding("clock", Status.FAIL, shown, fix)
    if abs(skew) > SKEW_WARN:
        return Finding("clock", Status.WARN, shown, fix)
    return Finding("clock", Status.OK, shown)


async def controller_findings(url: str, ssl_context: ssl.SSLContext | None) -> list[Finding]:
    """Reach the controller's health route as the agent would: reachability, TLS, clock."""
    verify: Any = ssl_context if ssl_context is not None else True
    health = url.rstrip("/") + "/api/v1/health"
    try:
        async with httpx.AsyncClient(verify=verify, timeout=10) as http:
            before = time.time()
            response = await http.get(health)
            after = time.time()
    except httpx.ConnectError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY" in str(exc):
            return [
                Finding(
                    "tls",
                    Status.FAIL,
                    f"the controller's certificate is not trusted: {exc}",
                    "pass --ca-bundle with the CA that signed it (or install it system-wide)",
                )
            ]
        return [
            Finding(
                "controller",
                Status.FAIL,
                f"cannot reach {url}: {exc}",
                "check the URL, that ficc serve listens there, and the firewall",
            )
        ]
    except httpx.HTTPError as exc:
        return [Finding("controller", Status.FAIL, f"cannot reach {url}: {exc!r}", None)]
    if response.status_code != 200:
        return [
            Finding(
                "controller",
                Status.FAIL,
                f"{health} answered {response.status_code}, not FICC's health",
                "check that the URL is the controller's",
            )
        ]
    body = response.json()
    found = [Finding("controller", Status.OK, f"{url} answers (FICC {body.get('version')})")]
    host = httpx.URL(url).host
    if url.startswith("https"):
        found.append(Finding("tls", Status.OK, "the controller's certificate is trusted"))
    elif host in ("127.0.0.1", "::1", "localhost"):
        found.append(Finding("tls", Status.OK, "plain HTTP on loopback"))
    else:
        found.append(
            Finding(
                "tls",
                Status.WARN,
                "plain HTTP: the node credential and every prompt cross the network in clear",
                "serve the controller with TLS (tls_cert/tls_key) and use https://",
            )
        )
    if isinstance(body.get("time"), int | float):
        found.append(skew_finding(float(body["time"]) - (before + after) / 2))
    return found


def render(findings: Iterable[Finding]) -> str:
    """One line per finding (status, check, message), its fix indented below."""
    lines = []
    for finding in findings:
        lines.append(f"{finding.status!s:<5} {finding.check:<22} {finding.message}")
        if finding.fix and finding.status != Status.OK:
            lines.append(f"{'':<5} {'':<22} -> {finding.fix}")
    return "\n".join(lines)


__all__ = [
    "Finding",
    "Status",
    "controller_findings",
    "directory_findings",
    "node_findings",
    "render",
    "skew_finding",
]
