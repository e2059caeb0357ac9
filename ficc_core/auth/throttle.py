"""Bounds on failed logins: per user and client address, per address, per user.

Three tables count wrong passwords, each with its own limit:

- ``user_address``: one username from one client address (``max_failures``);
- ``address``: every username from one client address (``4 * max_failures``), against
  password spraying;
- ``user``: one username from every address (``4 * max_failures``), against guessing
  spread over many addresses.

A key at its limit is locked for ``lockout`` seconds; every further failure locks it
again for twice as long as the last time, up to 64 times ``lockout``; a key that has
not failed for that long is forgotten. A locked attempt is answered at once (429 with
``Retry-After``) without verifying the password, so it costs no argon2 work.

A lockout must not become a denial of service for the real user: a (user, address)
pair that has logged in successfully is *trusted* and only its own pair limit applies
to it, so a stranger failing for that user (or from elsewhere) cannot lock the real
user out of an address they have used before. Attempts in flight count against the
limits too, so concurrent guesses cannot overshoot them.

Everything is in memory, bounded, and forgotten on restart.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

import attrs

from ..base.errors import FiccError

log = logging.getLogger("ficc.auth")

#: The ``address`` and ``user`` tables allow this many times ``max_failures``.
WIDE_LIMIT_FACTOR = 4
#: A lock lasts at most this many times ``lockout``.
MAX_LOCK_FACTOR = 64
#: Keys kept per table (the least recently used are dropped first).
CAPACITY = 10_000
#: Characters of a username that make its key.
MAX_KEY = 128


class LoginThrottled(FiccError):
    """Too many failed logins for this user or address: wait ``Retry-After`` seconds."""

    status = 429
    code = "login_throttled"


@attrs.define
class _Counter:
    failures: int = 0
    in_flight: int = 0
    last_failure: float = 0.0
    locked_until: float = 0.0


@attrs.define
class _Table:
    name: str
    limit: int
    entries: OrderedDict[Hashable, _Counter] = attrs.Factory(OrderedDict)

    def get(self, key: Hashable, now: float, forget_after: float) -> _Counter:
        counter = self.entries.get(key)
        if counter is None or (
            counter.in_flight == 0
            and counter.locked_until <= now
            and now - counter.last_failure > forget_after
        ):
            counter = self.entries[key] = _Counter()
        self.entries.move_to_end(key)
        while len(self.entries) > CAPACITY:
            self.entries.popitem(last=False)
        return counter


class LoginThrottle:
    """Decides whether a login attempt may verify its password, and records its outcome.

    :param max_failures: wrong passwords for one user from one address before a lock.
    :param lockout: seconds of the first lock; each further failure doubles it.
    :param clock: monotonic seconds (injected in tests).
    :param on_lock: called with the table's name whenever a key is locked.
    """

    def __init__(
        self,
        *,
        max_failures: int = 5,
        lockout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_lock: Callable[[str], None] | None = None,
    ) -> None:
        self.lockout = lockout
        self.clock = clock
        self.on_lock = on_lock
        wide = WIDE_LIMIT_FACTOR * max_failures
        self._pairs = _Table("user_address", max_failures)
        self._addresses = _Table("address", wide)
        self._users = _Table("user", wide)
        self._trusted: OrderedDict[tuple[str, str], None] = OrderedDict()

    def _counters(self, username: str, address: str) -> list[tuple[_Table, Hashable, _Counter]]:
        now, forget_after = self.clock(), self.lockout * MAX_LOCK_FACTOR
        keys: list[tuple[_Table, Hashable]] = [(self._pairs, (username, address))]
        if (username, address) not in self._trusted:
            keys += [(self._addresses, address), (self._users, username)]
        return [(table, key, table.get(key, now, forget_after)) for table, key in keys]

    @contextmanager
    def attempt(self, username: str, address: str) -> Iterator[Callable[[bool], None]]:
        """Admit one login attempt or raise :class:`LoginThrottled`.

        Yields ``record(ok)``, to call once the password was checked; an attempt that
        ends without calling it (an error, a cancellation) counts as nothing.
        """
        # The key, not the name: a huge made-up username must not cost memory.
        username = username[:MAX_KEY]
        counters = self._counters(username, address)
        now = self.clock()
        waits = [
            (counter.locked_until - now, table.name)
            for table, _, counter in counters
            if counter.locked_until > now
        ]
        # Attempts in flight would reach the limit: wait for their outcome first.
        waits += [
            (1.0, table.name)
            for table, _, counter in counters
            if counter.locked_until <= now
            and counter.in_flight
            and counter.failures + counter.in_flight >= table.limit
        ]
        if waits:
            seconds, limit = max(waits)
            retry_after = max(1, math.ceil(seconds))
            raise LoginThrottled(
                f"too many failed logins; try again in {retry_after} s",
                details={"retry_after": retry_after, "limit": limit},
                headers={"Retry-After": str(retry_after)},
            )
        for _, _, counter in counters:
            counter.in_flight += 1
        outcome: list[bool] = []
        try:
            yield outcome.append
        finally:
            for _, _, counter in counters:
                counter.in_flight -= 1
            if outcome:
                self._record(username, address, counters, outcome[0])

    def _record(
        self,
        username: str,
        address: str,
        counters: list[tuple[_Table, Hashable, _Counter]],
        ok: bool,
    ) -> None:
        if ok:
            self._pairs.entries.pop((username, address), None)
            self._trusted[(username, address)] = None
            self._trusted.move_to_end((username, address))
            while len(self._trusted) > CAPACITY:
                self._trusted.popitem(last=False)
            return
        now = self.clock()
        for table, _, counter in counters:
            counter.failures += 1
            counter.last_failure = now
            if counter.failures < table.limit:
                continue
            doublings = min(counter.failures - table.limit, int(math.log2(MAX_LOCK_FACTOR)))
            seconds = self.lockout * 2**doublings
            counter.locked_until = now + seconds
            log.warning(
                "login locked (%s limit): user %r from %s after %d failed logins, for %.0f s",
                table.name,
                username,
                address,
                counter.failures,
                seconds,
            )
            if self.on_lock is not None:
                self.on_lock(table.name)
