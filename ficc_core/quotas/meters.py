"""Meters: one subject's requests, tokens and spend, counted in memory.

Rates use a *sliding window counter*: counts are kept per wall-clock minute, and
the rate at time ``t`` is ``previous x (1 - elapsed / 60) + current``, where
``elapsed`` is how far ``t`` is into the current minute. A burst is held to the
limit inside one minute, and the edge between two minutes does not let twice the
limit through (the previous minute's count weighs on the next one as it slides
out). Spend is counted per budget period (UTC day or calendar month).

A meter holds what every process counted (read from the store at the last sync)
plus what this one counted since (``d_*``, added to the store at the next sync).
"""

from __future__ import annotations

import calendar
import math
import time

__all__ = ["MINUTE", "Meter", "Pending", "Periods", "add", "retry_after", "seconds"]

#: The rate window, in seconds.
MINUTE = 60
#: Pending writes: (subject, kind, window start) to [requests, tokens, spend].
Pending = dict[tuple[str, str, int], list[int]]


def add(
    pending: Pending, key: tuple[str, str, int], requests: int, tokens: int, spend: int
) -> None:
    entry = pending.get(key)
    if entry is None:
        pending[key] = [requests, tokens, spend]
    else:
        entry[0] += requests
        entry[1] += tokens
        entry[2] += spend


class Meter:
    """One subject's counts (a credential, a person or a project: ``kind:id``)."""

    __slots__ = (
        "d_requests",
        "d_spend",
        "d_tokens",
        "inflight",
        "minute",
        "period",
        "period_start",
        "prev_requests",
        "prev_tokens",
        "requests",
        "reserved",
        "spend",
        "subject",
        "tokens",
    )

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.minute = 0
        self.requests = self.tokens = self.prev_requests = self.prev_tokens = 0
        self.d_requests = self.d_tokens = 0
        self.period = ""
        self.period_start = 0
        self.spend = self.d_spend = 0
        #: Estimated cost of this process's requests in flight (milli-units).
        self.reserved = 0
        #: This process's requests in flight (a meter is never forgotten under one).
        self.inflight = 0

    def roll(self, minute: int, pending: Pending) -> None:
        """Move to the minute starting at ``minute``; unsynced counts go to ``pending``.
        Never back: a clock that stepped back counts on in the later minute."""
        if minute <= self.minute:
            return
        if self.d_requests or self.d_tokens:
            add(pending, (self.subject, "minute", self.minute), self.d_requests, self.d_tokens, 0)
        if minute - self.minute == MINUTE:
            self.prev_requests, self.prev_tokens = self.requests, self.tokens
        else:
            self.prev_requests = self.prev_tokens = 0
        self.minute = minute
        self.requests = self.tokens = self.d_requests = self.d_tokens = 0

    def roll_period(self, period: str, start: int, pending: Pending) -> None:
        """Move to the budget ``period`` starting at ``start`` (never back within one)."""
        if period == self.period and start <= self.period_start:
            return
        if self.d_spend:
            add(pending, (self.subject, self.period, self.period_start), 0, 0, self.d_spend)
        self.period, self.period_start = period, start
        self.spend = self.d_spend = 0

    def rate(self, weight: float) -> tuple[float, float]:
        """Requests and tokens in the sliding minute (``weight``: the previous minute's)."""
        return (
            self.prev_requests * weight + self.requests,
            self.prev_tokens * weight + self.tokens,
        )


def retry_after(previous: float, current: float, need: float, limit: int, elapsed: float) -> float:
    """Seconds until ``need`` more fits under ``limit`` in the sliding minute, when
    ``previous`` and ``current`` were counted and ``elapsed`` seconds of this minute passed
    (a full minute when it never fits)."""
    if need > limit:
        return float(MINUTE)
    left = MINUTE - elapsed
    room = limit - current - need
    if room >= 0 and previous > 0:
        wait = MINUTE * (1 - room / previous) - elapsed
        if wait <= left:
            return max(0.0, wait)
    if current <= 0:
        return left
    return left + max(0.0, MINUTE * (1 - (limit - need) / current))


class Periods:
    """The current UTC day and calendar month, recomputed only when one ends."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts = {"day": 0, "month": 0}
        self._ends = {"day": 0.0, "month": 0.0}

    def start(self, period: str, now: float) -> int:
        """When ``period`` (``day`` or ``month``) holding ``now`` started, in Unix seconds."""
        if now >= self._ends[period] or now < self._starts[period]:
            self._refresh(period, now)
        return self._starts[period]

    def end(self, period: str, now: float) -> int:
        """When ``period`` holding ``now`` ends (the next one starts)."""
        self.start(period, now)
        return int(self._ends[period])

    def _refresh(self, period: str, now: float) -> None:
        if period == "day":
            start = int(now // 86400) * 86400
            end = start + 86400
        else:
            moment = time.gmtime(now)
            start = calendar.timegm((moment.tm_year, moment.tm_mon, 1, 0, 0, 0))
            year, month = (
                (moment.tm_year + 1, 1)
                if moment.tm_mon == 12
                else (
                    moment.tm_year,
                    moment.tm_mon + 1,
                )
            )
            end = calendar.timegm((year, month, 1, 0, 0, 0))
        self._starts[period], self._ends[period] = start, float(end)


def seconds(value: float) -> int:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return max(1, math.ceil(value))
