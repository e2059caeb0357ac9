"""Affinity: send a request where its prompt's prefix is likely cached, but never pile load there.

Two tiers, tried in order by the router (:mod:`.scoring`):

* **Session** (tier 0): a client that sends the ``session_header`` (default
  ``x-session-id``) is kept on the replica its session was last served by, for
  ``session_ttl`` after its last request. The value is the client's own: one longer
  than :data:`MAX_SESSION_ID` characters is not used, and it never names a metric series.
* **Prefix** (tier 1): an approximate index of the prompts served. The prompt is the
  request's JSON from its ``messages`` array on (chat: every message in order, role
  and content, as sent) or its ``prompt`` (completions), at most :data:`MAX_BYTES`;
  it is cut into :data:`BLOCK`-byte blocks and each block's hash is chained onto
  the previous one's (Python's 64-bit ``hash``, salted per process, so a client cannot
  aim collisions), so a block's hash names the whole prefix up to its end. The
  index maps a prefix hash to the replicas that served it (at most
  :data:`HOLDERS`, most recent first) and is an LRU of ``prefix_max_entries``
  hashes. A match counts when it is at least ``prefix_min_match`` bytes and
  ``prefix_match_ratio`` of the prompt, and its entry is younger than
  ``prefix_ttl`` (an engine evicts on its own schedule, so an old entry may
  describe a cache that is gone). A hash collision only costs a cache miss.

  A prompt's last, partial block is indexed too, in :data:`PIECE`-byte pieces chained
  onto its last full block. Conversations that share a long system prompt differ only
  after it, and a turn adds less than a block: without the pieces, every such
  conversation's deepest match would be the shared blocks, held by every replica, and
  load would decide where its history goes. A lookup reads, after the deepest full
  block it knows, as many of these pieces as match.

Entries name a replica by its attempt ID: one engine process, the one whose cache
it is. A successor (a move's target, a restart, a rollout's next generation) has
another attempt ID, so nothing routes to it on its predecessor's account, and
:meth:`Affinity.prune` drops entries of attempts no longer routed to.

The imbalance guard (:func:`imbalanced`) is the router's: affinity is abandoned
only when the preferred replica is ahead of the least loaded one by more than
``affinity_balance_abs`` requests *and* by more than ``affinity_balance_rel`` times.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

if TYPE_CHECKING:
    from .request import Request

#: Bytes per prefix block: the index's granularity (about 250 tokens of English).
BLOCK = 1024
#: Bytes per piece of a prompt's last, partial block (so a block holds 8).
PIECE = 128
#: The most of a prompt hashed: longer prompts that share this much are one prefix.
MAX_BYTES = 64 * 1024
#: Replicas remembered per prefix (the same prefix cached on several engines).
HOLDERS = 4
#: The longest session header value used for affinity.
MAX_SESSION_ID = 256

_PROMPT_STARTS = {
    "/v1/chat/completions": re.compile(rb'"messages"\s*:\s*\['),
    "/v1/completions": re.compile(rb'"prompt"\s*:\s*'),
}


def imbalanced(preferred: float, least: float, *, absolute: float, relative: float) -> bool:
    """Whether affinity to a replica at load ``preferred`` must yield to one at ``least``:
    both sides of the guard trip (ahead by more than ``absolute`` requests, and by more
    than ``relative`` times)."""
    return preferred - least > absolute and preferred > relative * least


@attrs.frozen
class Prompt:
    """Where a request's prompt is in its payload, and its hashes (see the module docs)."""

    #: The chained hashes of its full blocks.
    blocks: tuple[int, ...]
    #: Those of its last, partial block's full pieces, chained onto the last full block.
    pieces: tuple[int, ...]
    #: Its first byte in the payload, and its length (at most :data:`MAX_BYTES`).
    start: int
    length: int


def _chain(digest: int, payload: bytes, start: int, end: int, size: int) -> list[int]:
    hashes = []
    for at in range(start, end - size + 1, size):
        digest = hash((digest, payload[at : at + size]))
        hashes.append(digest)
    return hashes


def prompt_of(path: str, payload: bytes, salt: str) -> Prompt | None:
    """The prompt in ``payload`` (see the module docs), or None (a route with none).

    ``salt`` (the service ID) keeps two services' equal prompts apart.
    """
    start = _PROMPT_STARTS.get(path)
    found = None if start is None else start.search(payload)
    if found is None:
        return None
    begin = found.start()
    end = min(len(payload), begin + MAX_BYTES)
    blocks = _chain(hash(salt), payload, begin, end, BLOCK)
    last = begin + len(blocks) * BLOCK
    # Pieces count only after a block (a shorter prompt is under any useful match).
    pieces = _chain(blocks[-1], payload, last, end, PIECE) if blocks else []
    return Prompt(tuple(blocks), tuple(pieces), begin, end - begin)


@attrs.define(eq=False, slots=True)
class _Session:
    replica: str
    at: float


@attrs.define(eq=False, slots=True)
class _Entry:
    holders: tuple[str, ...]
    at: float


@attrs.define(eq=False, slots=True)
class Preference:
    """Where affinity would send a request: ``replicas`` (keys), and ``reason`` (``session``
    or ``prefix``)."""

    reason: str
    replicas: Collection[str]
    matched: int = 0


#: The prompt of a request with none (or of every request while the index is off).
_NO_PROMPT = Prompt((), (), 0, 0)


class Affinity:
    """The session table and the prefix index (see the module docs).

    :param clock: the clock of the TTLs (the trio clock; tests inject their own).
    """

    def __init__(
        self,
        *,
        session_header: str,
        session_ttl: float,
        session_max_entries: int,
        prefix_enabled: bool,
        prefix_max_entries: int,
        prefix_min_match: int,
        prefix_ttl: float,
        prefix_match_ratio: float,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.session_header = session_header.lower()
        self.session_ttl = session_ttl
        self.session_max_entries = session_max_entries
        self.prefix_enabled = prefix_enabled
        self.prefix_max_entries = prefix_max_entries
        self.prefix_min_match = prefix_min_match
        self.prefix_ttl = prefix_ttl
        self.prefix_match_ratio = prefix_match_ratio
        self.clock = clock
        #: (service ID, session ID) -> its replica, least recently used first.
        self.sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()
        #: Live sessions per replica key (the router counts them as expected load).
        self.session_counts: dict[str, int] = {}
        #: Prefix hash -> the replicas holding it, least recently used first.
        self.prefixes: OrderedDict[int, _Entry] = OrderedDict()

    # -- a request -------------------------------------------------------------------------

    def session_of(self, request: Request) -> tuple[str, str] | None:
        """The request's session key, or None (no header, or one too long to use)."""
        value = request.headers.get(self.session_header)
        if not value or len(value) > MAX_SESSION_ID or request.path == "/v1/embeddings":
            return None
        return request.service_id, value

    def prompt(self, request: Request) -> Prompt:
        """The request's prompt, hashed once per request (no blocks: no prompt, or the
        index is off). Its payload is released by :meth:`remember`: a long stream does not
        hold its request body."""
        if request.prefix is None:
            request.prefix = (
                prompt_of(request.path, request.payload, request.service_id)
                if self.prefix_enabled
                else None
            ) or _NO_PROMPT
        return request.prefix

    def preferred(
        self,
        request: Request,
        eligible: Container[str],
        session: tuple[str, str] | None,
        now: float,
    ) -> Preference | None:
        """Where affinity would send ``request`` (of ``session``, :meth:`session_of`) among
        the ``eligible`` replica keys, at ``now``."""
        if session is not None:
            bound = self.sessions.get(session)
            if bound is not None:
                if now - bound.at > self.session_ttl:
                    self._unbind(session)
                elif bound.replica in eligible:
                    return Preference("session", (bound.replica,))
        prompt = self.prompt(request)
        hashes = prompt.blocks
        shortest = max(self.prefix_min_match, self.prefix_match_ratio * prompt.length)
        prefixes = self.prefixes
        deepest = True
        for number in range(len(hashes), 0, -1):
            if number * BLOCK + BLOCK - PIECE < shortest:
                break  # neither this block nor the pieces after it match enough
            entry = prefixes.get(hashes[number - 1])
            if entry is None or now - entry.at > self.prefix_ttl:
                continue
            if deepest:  # the deepest block known: the pieces after it tell conversations apart
                deepest = False
                holders = self._pieces(request, prompt, number, eligible, shortest, now)
                if holders:
                    return Preference("prefix", holders, matched=number)
            holders = [key for key in entry.holders if key in eligible]
            if holders and number * BLOCK >= shortest:
                return Preference("prefix", holders, matched=number)
        return None

    def _pieces(
        self,
        request: Request,
        prompt: Prompt,
        number: int,
        eligible: Container[str],
        shortest: float,
        now: float,
    ) -> list[str]:
        """The eligible replicas holding the most pieces of ``prompt`` after its first
        ``number`` blocks (the deepest full block the index knows), or none."""
        if number == len(prompt.blocks):
            pieces: Sequence[int] = prompt.pieces  # its own last block's
        elif request.payload:
            at = prompt.start + number * BLOCK
            # The 7 pieces a partial block can have: a whole block would have matched above.
            pieces = _chain(prompt.blocks[number - 1], request.payload, at, at + BLOCK - 1, PIECE)
        else:  # a retry: the first pick released the payload, so the blocks alone decide
            return []
        prefixes = self.prefixes
        for count in range(len(pieces), 0, -1):
            if number * BLOCK + count * PIECE < shortest:
                break
            entry = prefixes.get(pieces[count - 1])
            if entry is None or now - entry.at > self.prefix_ttl:
                continue
            holders = [key for key in entry.holders if key in eligible]
            if holders:
                return holders
        return []

    def remember(
        self,
        request: Request,
        replica: str,
        preference: Preference | None,
        session: tuple[str, str] | None,
        now: float,
    ) -> None:
        """``request`` (of ``session``) goes to ``replica`` at ``now``: bind its session, index
        its prompt's prefix (``preference``: what :meth:`preferred` found, if it was taken)."""
        if session is not None:
            self._bind(session, replica, now)
        prompt = self.prompt(request)
        request.payload = b""
        hashes = prompt.blocks
        if not hashes:  # nothing to index (pieces come only after a block)
            return
        prefixes = self.prefixes
        # The blocks already matched on this replica need only their deepest one refreshed:
        # a lookup walks from the longest prefix down.
        start = 0
        if preference is not None and preference.reason == "prefix":
            deepest = prefixes.get(hashes[preference.matched - 1])
            if deepest is not None and deepest.holders[0] == replica:
                deepest.at = now
                prefixes.move_to_end(hashes[preference.matched - 1])
                start = preference.matched
        for digest in (*hashes[start:], *prompt.pieces):
            entry = prefixes.get(digest)
            if entry is None:
                prefixes[digest] = _Entry((replica,), now)
                continue
            if entry.holders[0] != replica:
                others = tuple(key for key in entry.holders if key != replica)
                entry.holders = (replica, *others[: HOLDERS - 1])
            entry.at = now
            prefixes.move_to_end(digest)
        while len(prefixes) > self.prefix_max_entries:
            prefixes.popitem(last=False)

    # -- upkeep (off the request path) ------------------------------------------------------

    def prune(self, gone: Container[str] = ()) -> None:
        """Drop what outlived its TTL, and what names a replica in ``gone`` (no longer
        routed to). Both tables are in order of last use, so expiry reads only the
        expired; a replica leaving costs one pass over the tables."""
        now = self.clock()
        while self.sessions:
            session, bound = next(iter(self.sessions.items()))
            if now - bound.at <= self.session_ttl:
                break
            self._unbind(session)
        while self.prefixes:
            digest, entry = next(iter(self.prefixes.items()))
            if now - entry.at <= self.prefix_ttl:
                break
            del self.prefixes[digest]
        if not gone:
            return
        for session, bound in list(self.sessions.items()):
            if bound.replica in gone:
                self._unbind(session)
        for digest, entry in list(self.prefixes.items()):
            if any(key in gone for key in entry.holders):
                holders = tuple(key for key in entry.holders if key not in gone)
                if holders:
                    entry.holders = holders
                else:
                    del self.prefixes[digest]

    def _bind(self, session: tuple[str, str], replica: str, now: float) -> None:
        bound = self.sessions.get(session)
        if bound is not None and bound.replica == replica:
            bound.at = now
            self.sessions.move_to_end(session)
            return
        if bound is not None:
            self._unbind(session)
        self.sessions[session] = _Session(replica, now)
        self.session_counts[replica] = self.session_counts.get(replica, 0) + 1
        while len(self.sessions) > self.session_max_entries:
            self._unbind(next(iter(self.sessions)))

    def _unbind(self, session: tuple[str, str]) -> None:
        bound = self.sessions.pop(session, None)
        if bound is None:
            return
        left = self.session_counts.get(bound.replica, 1) - 1
        if left > 0:
            self.session_counts[bound.replica] = left
        else:
            self.session_counts.pop(bound.replica, None)
