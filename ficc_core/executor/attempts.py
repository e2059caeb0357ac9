"""One launched attempt as its provider tracks it, and its directory and record on disk.

Each attempt has a directory under the provider's ``attempts/`` (named by
:func:`attempt_key`) holding the engine's working directory, its bounded log and
``attempt.json``: the record an earlier run's leftovers are found by (written
atomically; ``{}`` when unreadable). Its socket directory is in the provider's
runtime directory instead (:mod:`~ficc_core.executor.runtime_dir`). Every function
here that touches the disk blocks: call it from a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from .logs import BoundedLog
from .types import AttemptState, AttemptStatus

if TYPE_CHECKING:
    from ..schema import Fence, Job, ResourceLimits

__all__ = [
    "RECORD",
    "EngineProcess",
    "ExecutorAttempt",
    "attempt_key",
    "prepare_directory",
    "read_records",
    "write_record",
]

#: The record's file name in an attempt's directory.
RECORD = "attempt.json"


def attempt_key(attempt_id: str) -> str:
    """A short, file-name-safe key for an attempt ID (deterministic, collision-resistant)."""
    return "a" + hashlib.sha256(attempt_id.encode()).hexdigest()[:20]


class EngineProcess(Protocol):
    """What ``_start`` returns: a running child whose output is the engine's log."""

    stdout: trio.abc.ReceiveStream | None

    async def wait(self) -> int:
        """Wait for the child to end; return its exit status (negative for a signal)."""
        ...


@attrs.define(eq=False)
class ExecutorAttempt:
    """One launched job, as its provider tracks it."""

    fence: Fence
    job: Job
    key: str
    directory: Path
    socket_path: Path
    log: BoundedLog
    limits: ResourceLimits | None
    state: AttemptState = "starting"
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    stop_requested: bool = False
    #: The engine's process ID and start (epoch seconds), where the provider knows them.
    pid: int | None = None
    started_at: float | None = None
    #: The readiness probe's last answer and when it came (epoch seconds).
    health: str | None = None
    health_at: float | None = None
    process: Any = None
    extra: dict[str, Any] = attrs.field(factory=dict)
    ready: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)

    @property
    def workdir(self) -> Path:
        """The engine's private working directory."""
        return self.directory / "work"

    def answered(self, health: str, at: float) -> None:
        """The readiness probe got ``health`` (an HTTP status, or why there was none)."""
        self.health, self.health_at = health, at

    def settle(self) -> None:
        """Wake everyone waiting for readiness: the attempt is ready or over."""
        self.ready.set()

    def status(self, tail: Sequence[str] = ()) -> AttemptStatus:
        """Where the attempt stands, with ``tail`` as its log tail."""
        return AttemptStatus(
            attempt_id=self.fence.attempt_id,
            state=self.state,
            exit_code=self.exit_code,
            signal=self.signal,
            reason=self.reason,
            message=self.message,
            log_tail=tuple(tail),
            pid=self.pid,
            started_at=self.started_at,
            health=self.health,
            health_at=self.health_at,
        )

    async def current_status(self) -> AttemptStatus:
        """Where the attempt stands, with the last 20 log lines once it has ended."""
        ended = self.done.is_set() or self.state not in ("starting", "ready")
        return self.status(await self.log.tail(20) if ended else ())

    def conclude(self, returncode: int, special: tuple[str, str] | None) -> None:
        """Record how the engine ended: ``special`` (reason, message) names a special end.

        An attempt that failed before it was ready keeps its failure.
        """
        self.exit_code = returncode if returncode >= 0 else None
        self.signal = -returncode if returncode < 0 else None
        if self.state == "failed":
            return
        if special is not None:
            self.state, self.reason, self.message = "exited", special[0], special[1]
        elif self.stop_requested:
            self.state, self.reason = "stopped", "stopped"
            self.message = "the engine was stopped"
        else:
            self.state = "exited"
            self.reason = "killed" if self.signal else "exited"
            how = f"signal {self.signal}" if self.signal else f"status {returncode}"
            self.message = f"the engine exited with {how}; see the log tail"


def prepare_directory(attempt: ExecutorAttempt, provider: str) -> None:
    """Create the attempt's directory afresh (private), with its first record."""
    if attempt.directory.exists():
        shutil.rmtree(attempt.directory)
    attempt.directory.mkdir(mode=0o700, parents=True)
    attempt.workdir.mkdir(mode=0o700)
    sockets = attempt.socket_path.parent
    if sockets.exists():  # an earlier attempt's, left by a crash
        shutil.rmtree(sockets)
    sockets.mkdir(mode=0o700)
    write_record(attempt, provider, {})


def write_record(attempt: ExecutorAttempt, provider: str, changes: Mapping[str, Any]) -> None:
    """Update the attempt's record with ``changes`` (atomically)."""
    path = attempt.directory / RECORD
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        record = {
            "attempt_id": attempt.fence.attempt_id,
            "generation": attempt.fence.generation,
            "plan_digest": attempt.fence.plan_digest,
            "provider": provider,
        }
    record.update(changes)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record, sort_keys=True))
    os.replace(temporary, path)


def read_records(attempts_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every attempt directory with its record (``{}`` when the record is unreadable)."""
    found: list[tuple[Path, dict[str, Any]]] = []
    if not attempts_dir.exists():
        return found
    for directory in sorted(attempts_dir.iterdir()):
        try:
            record = json.loads((directory / RECORD).read_text())
        except (OSError, ValueError):
            record = {}
        found.append((directory, record))
    return found
