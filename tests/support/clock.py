"""The one fake clock of the tests: a callable that components take as their ``clock``.

It stands still until a test moves it (``clock.now += seconds``); with ``follow_trio`` it
also moves with trio's clock (an autojump clock's virtual time), so a component's waits
and its readings of the time agree while a test still adds jumps of its own.
"""

from __future__ import annotations

import trio


class FakeClock:
    """Seconds since the epoch as a test decides: ``now`` (plus trio's time if followed)."""

    def __init__(self, now: float = 1000.0, *, follow_trio: bool = False) -> None:
        self.now = now
        self.follow_trio = follow_trio

    def __call__(self) -> float:
        if self.follow_trio:
            return self.now + trio.current_time()
        return self.now
