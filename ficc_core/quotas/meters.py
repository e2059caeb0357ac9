"""Meters: one subject's requests, tokens and spend, counted in memory.

Rates use a *sliding window counter*: counts are kept per wall-clock minute, and
the rate at time ``t`` is ``previous x (1 - elapsed / 60) + current``, where
``elapsed`` is how far ``t`` is into the current minute. A burst is held to the
limit inside one minute, and the edge between two minutes does not let twice the
limit through (the previous minute's count weighs on the next one as it slides
out). Spend is counted for both budget periods at once, the current UTC day and the
current calendar month, whatever budget a subject has (or none): a budget set or
moved to the other period later sees what was already spent in it.

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
#: Pending writes: (subject, kind, window start) to [requests, tokens, spend]; the kind
#: is ``minute``, ``day`` or ``month``.
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
        "d_day_spend",
        "d_month_spend",
        "d_requests",
        "d_tokens",
        "day",
        "day_spend",
        "inflight",
        "minute",
        "month",
        "month_spend",
        "prev_requests",
        "prev_tokens",
        "requests",
        "reserved",
        "subject",
        "tokens",
    )

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.minute = 0
        self.requests = self.tokens = self.prev_requests = self.prev_tokens = 0
        self.d_requests = self.d_tokens = 0
        #: The UTC day and calendar month counted (their starts, Unix seconds; 0: none yet)
        #: and the spend in each (milli-units, every process as of the last sync plus this
        #: one's since); ``d_*``: this process's, not yet handed to the store.
        self.day = self.month = 0
        self.day_spend = self.d_day_spend = 0
        self.month_spend = self.d_month_spend = 0
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

    def roll_periods(self, day: int, month: int, pending: Pending) -> None:
        """Move to the UTC day starting at ``day`` and the month starting at ``month``;
        unsynced spend goes to ``pending``. Never back, as :meth:`roll`."""
        if day > self.day:
            if self.d_day_spend:
                add(pending, (self.subject, "day", self.day), 0, 0, self.d_day_spend)
            self.day = day
            self.day_spend = self.d_day_spend = 0
        if month > self.month:
            if self.d_month_spend:
                add(pending, (self.subject, "month", self.month), 0, 0, self.d_month_spend)
            self.month = month
            self.month_spend = self.d_month_spend = 0

    def spent(self, period: str) -> int:
        """The spend (milli-units) counted in this meter's ``period`` (``day``, else the
        month)."""
        return self.day_spend if period == "day" else self.month_spend

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
    """The current UTC day and calendar month, recomputed only when the day ends (a
    month always ends with a day).

    :ivar day: the current day's start (Unix seconds); :ivar day_end: the next day's.
    :ivar month: the current month's start; :ivar month_end: the next month's.
    """

    __slots__ = ("day", "day_end", "month", "month_end")

    def __init__(self) -> None:
        self.day = self.month = 0
        self.day_end = self.month_end = 0

    def at(self, now: float) -> None:
        """Make :attr:`day` and :attr:`month` the ones holding ``now``."""
        if now >= self.day_end or now < self.day:
            self._refresh(now)

    def start(self, period: str, now: float) -> int:
        """When ``period`` (``day`` or ``month``) holding ``now`` started, in Unix seconds."""
        if now >= self.day_end or now < self.day:
            self._refresh(now)
        return self.day if period == "day" else self.month

    def end(self, period: str, now: float) -> int:
        """When ``period`` holding ``now`` ends (the next one starts)."""
        if now >= self.day_end or now < self.day:
            self._refresh(now)
        return self.day_end if period == "day" else self.month_end

    def _refresh(self, now: float) -> None:
        self.day = int(now // 86400) * 86400
        self.day_end = self.day + 86400
        moment = time.gmtime(now)
        self.month = calendar.timegm((moment.tm_year, moment.tm_mon, 1, 0, 0, 0))
        year, month = (
            (moment.tm_year + 1, 1) if moment.tm_mon == 12 else (moment.tm_year, moment.tm_mon + 1)
        )
        self.month_end = calendar.timegm((year, month, 1, 0, 0, 0))


def seconds(value: float) -> int:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return max(1, math.ceil(value))
