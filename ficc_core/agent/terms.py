"""The highest leader term a node has seen, kept in its state directory across restarts.

Several controllers share one store and one of them at a time holds the leader
lease, with a term that grows at each takeover. A node refuses ``launch`` and
``stop`` from a term below the highest it has seen, so a deposed leader that has
not noticed yet cannot place or remove work. That fence would open again if an
agent restart forgot the term, so the term is written (atomically: a temporary
file, fsynced, renamed over ``term.json``, the directory fsynced) before the
command that raised it runs, and read back when the agent starts.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import trio

from ..base.digests import fsync_directory

log = logging.getLogger("ficc.agent")

#: The file in the agent's state directory that holds the highest term seen.
TERM_FILE = "term.json"


def read_term(state_dir: Path) -> int:
    """The term recorded in ``state_dir`` (0 when none is, or the file is unreadable)."""
    path = Path(state_dir) / TERM_FILE
    try:
        term = json.loads(path.read_text(encoding="utf-8"))["term_seen"]
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError):
        log.warning("%s is unreadable; starting from term 0", path)
        return 0
    if not isinstance(term, int) or isinstance(term, bool) or term < 0:
        log.warning("%s holds no term; starting from term 0", path)
        return 0
    return term


def write_term(state_dir: Path, term: int) -> None:
    """Record ``term`` in ``state_dir`` atomically and durably (blocking: run it in a thread)."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    part = state_dir / f".{TERM_FILE}.part"
    with open(part, "w", encoding="utf-8") as handle:
        json.dump({"term_seen": term}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(part, state_dir / TERM_FILE)
    fsync_directory(state_dir)


class TermRecord:
    """The node's highest seen term: raised in memory at once, written in order behind it.

    :param state_dir: the agent's state directory (``term.json`` lives there).
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        #: The highest term seen (what commands are checked against).
        self.seen = 0
        self._written = 0
        self._lock = trio.Lock()

    async def load(self) -> int:
        """Read the recorded term (off the event loop); it only ever raises :attr:`seen`."""
        recorded = await trio.to_thread.run_sync(read_term, self.state_dir)
        self.seen = max(self.seen, recorded)
        self._written = max(self._written, recorded)
        return self.seen

    async def raise_to(self, term: int) -> None:
        """Make ``term`` the highest seen, if it is higher, and write it before returning.

        :attr:`seen` moves before the write, so a command of an older term that
        arrives meanwhile is already refused. A write that fails (a full disk) is
        logged and the term still holds in memory: refusing the new leader's
        commands for it would stop the node from working at all.
        """
        if term <= self.seen:
            return
        self.seen = term
        log.info("leader term %d seen; commands of older terms are refused from now on", term)
        async with self._lock:
            wanted = self.seen
            if wanted <= self._written:
                return  # a later call wrote a higher term already
            try:
                await trio.to_thread.run_sync(write_term, self.state_dir, wanted)
            except OSError as exc:
                log.warning(
                    "could not record leader term %d in %s: %r", wanted, self.state_dir, exc
                )
                return
            self._written = wanted
