"""The quota gate: rate limits and budgets decided in memory, before a replica is taken.

:meth:`Quotas.admit` reads the request's scopes (its credential, its person if it
has one, its project unless the key is personal), their limits (one dict lookup
each) and their :class:`~.meters.Meter`, refuses with a 429 or reserves the
request's estimated tokens and cost; :meth:`Quotas.settle` replaces the estimate
with what the engine reported and returns the real cost. Nothing here touches the
store: :mod:`.sync` adds the counts to it and reads everyone's back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..config.prices import MILLI, Price
from . import repository
from .errors import BudgetExceeded, RateLimited
from .meters import MINUTE, Meter, Pending, Periods, retry_after, seconds
from .records import NONE, SCOPES, Limits

if TYPE_CHECKING:
    from ..config import Config
    from ..gateway.request import Request
    from ..store import Row, Store

log = logging.getLogger("ficc.quotas")

__all__ = ["Quotas", "Reservation"]

#: Outcomes whose missing token counts are paid at their estimate: the engine did the
#: work (a client that left mid-stream included). An engine failure pays only what it
#: reported.
SETTLED_IN_FULL = frozenset({"ok", "cancelled"})


class Reservation:
    """What one admitted request holds: its meters, the minute and its estimates."""

    __slots__ = ("budgeted", "completion", "cost", "meters", "minute", "price", "prompt")

    def __init__(
        self,
        meters: tuple[Meter, ...],
        budgeted: tuple[Meter, ...],
        minute: int,
        prompt: int,
        completion: int,
        price: Price,
        cost: int,
    ) -> None:
        self.meters, self.budgeted, self.minute = meters, budgeted, minute
        self.prompt, self.completion, self.price, self.cost = prompt, completion, price, cost


class Quotas:
    """The :class:`~ficc_core.quotas.QuotaGate` of one controller process (see module docs).

    :param store: where limit records and the shared counters live.
    :param config: ``default_rpm``/``default_tpm``, the personal limits, the prices.
    :param clock: wall-clock seconds (windows and periods are wall-clock, shared by
        processes); tests replace :attr:`clock`.
    """

    def __init__(
        self, store: Store, config: Config, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.clock = clock
        self.default_rpm, self.default_tpm = config.default_rpm, config.default_tpm
        self.personal_rpm, self.personal_tpm = config.personal_rpm, config.personal_tpm
        self.personal_budget, self.personal_period = config.personal_budget, config.personal_period
        self.prices: dict[str, Price] = dict(config.pricing)
        self.default_price = config.default_price
        #: Explicit limits per scope, by the scope's ID.
        self.limits: dict[str, dict[str, Limits]] = {scope: {} for scope in SCOPES}
        self._credential_limits = self.limits["credential"]
        self._user_limits = self.limits["user"]
        self._project_limits = self.limits["project"]
        #: Every meter by subject (``scope:id``), and per scope by ID.
        self.meters: dict[str, Meter] = {}
        #: Each budgeted subject's scope, budget (whole units) and period, as last checked:
        #: what the budget gauge (:class:`~.sync.QuotaSync`) reports against.
        self.budgets: dict[str, tuple[str, int, str]] = {}
        self._by_scope: dict[str, dict[str, Meter]] = {scope: {} for scope in SCOPES}
        self._credentials = self._by_scope["credential"]
        self._users = self._by_scope["user"]
        self._projects = self._by_scope["project"]
        self.periods = Periods()
        #: Counts of windows a meter left, not yet in the store.
        self.pending: Pending = {}
        #: Bumped by every limit change made here (a sync's reload does not undo one).
        self.version = 0

    # -- the request path ------------------------------------------------------------------

    def price(self, model_name: str, model_id: str) -> Price:
        """The price of a model, by its name or ID, else ``default_price``."""
        prices = self.prices
        if not prices:
            return self.default_price
        return prices.get(model_name) or prices.get(model_id) or self.default_price

    def _meter(self, table: dict[str, Meter], scope: str, key: str) -> Meter:
        meter = table.get(key)
        if meter is None:
            subject = f"{scope}:{key}"
            meter = self.meters.get(subject) or Meter(subject)
            table[key] = self.meters[subject] = meter
        return meter

    def admit(self, request: Request) -> None:
        """Refuse ``request`` (:class:`RateLimited`, :class:`BudgetExceeded`) or reserve its
        estimated tokens and cost in ``request.reservation``."""
        actor, view = request.actor, request.view
        now = self.clock()
        minute = int(now // MINUTE) * MINUTE
        elapsed = now - minute
        weight = 1.0 - elapsed / MINUTE
        pending = self.pending
        personal = actor.personal
        prompt, completion = request.prompt_estimate, request.completion_estimate
        tokens = prompt + completion
        price = self.price(view.model_name, view.model_id)
        cost = price.cost(prompt, completion)

        c_limits = self._credential_limits.get(actor.id, NONE)
        c_meter = self._meter(self._credentials, "credential", actor.id)
        user_id = actor.user_id
        u_limits = NONE if user_id is None else self._user_limits.get(user_id, NONE)
        u_rpm, u_tpm, u_budget, u_period = (
            u_limits.rpm,
            u_limits.tpm,
            u_limits.budget,
            u_limits.period,
        )
        if personal:
            if u_rpm is None and self.personal_rpm:
                u_rpm = self.personal_rpm
            if u_tpm is None and self.personal_tpm:
                u_tpm = self.personal_tpm
            if u_budget is None and self.personal_budget:
                u_budget, u_period = self.personal_budget, self.personal_period
        p_limits = NONE if personal else self._project_limits.get(actor.project_id, NONE)
        c_rpm, c_tpm = c_limits.rpm, c_limits.tpm
        if c_rpm is None and u_rpm is None and p_limits.rpm is None:
            c_rpm = self.default_rpm
        if c_tpm is None and u_tpm is None and p_limits.tpm is None:
            c_tpm = self.default_tpm

        c_meter.roll(minute, pending)
        self._check(c_meter, "credential", actor.id, c_rpm, c_tpm, tokens, weight, elapsed)
        u_meter = p_meter = None
        if user_id is not None:
            u_meter = self._meter(self._users, "user", user_id)
            u_meter.roll(minute, pending)
            self._check(u_meter, "user", user_id, u_rpm, u_tpm, tokens, weight, elapsed)
        if not personal:
            p_meter = self._meter(self._projects, "project", actor.project_id)
            p_meter.roll(minute, pending)
            self._check(
                p_meter,
                "project",
                actor.project_id,
                p_limits.rpm,
                p_limits.tpm,
                tokens,
                weight,
                elapsed,
            )
        # Every meter counts the day's and the month's spend, whatever its budget.
        periods = self.periods
        periods.at(now)
        day, month = periods.day, periods.month
        budgeted: tuple[Meter, ...] = ()
        if c_meter.day != day or c_meter.month != month:
            c_meter.roll_periods(day, month, pending)
        if c_limits.budget:
            self._budget(c_meter, "credential", c_limits.budget, c_limits.period, cost, now)
            budgeted = (c_meter,)
        if p_meter is not None:
            if p_meter.day != day or p_meter.month != month:
                p_meter.roll_periods(day, month, pending)
            if p_limits.budget:
                self._budget(p_meter, "project", p_limits.budget, p_limits.period, cost, now)
                budgeted = (*budgeted, p_meter)
        if u_meter is not None:
            if u_meter.day != day or u_meter.month != month:
                u_meter.roll_periods(day, month, pending)
            if u_budget:
                self._budget(u_meter, "user", u_budget, u_period, cost, now)
                budgeted = (*budgeted, u_meter)

        if u_meter is None:
            meters: tuple[Meter, ...] = (c_meter,) if p_meter is None else (c_meter, p_meter)
        else:
            meters = (c_meter, u_meter) if p_meter is None else (c_meter, u_meter, p_meter)
        for meter in meters:
            meter.inflight += 1
            meter.requests += 1
            meter.d_requests += 1
            meter.tokens += tokens
            meter.d_tokens += tokens
        for meter in budgeted:
            meter.reserved += cost
        request.reservation = Reservation(meters, budgeted, minute, prompt, completion, price, cost)

    @staticmethod
    def _check(
        meter: Meter,
        scope: str,
        key: str,
        rpm: int | None,
        tpm: int | None,
        tokens: int,
        weight: float,
        elapsed: float,
    ) -> None:
        if rpm:
            used = meter.prev_requests * weight + meter.requests
            if used + 1 > rpm:
                wait = retry_after(meter.prev_requests, meter.requests, 1, rpm, elapsed)
                raise _rate_limited("rpm", scope, key, rpm, 1, wait)
        if tpm:
            used = meter.prev_tokens * weight + meter.tokens
            if used + tokens > tpm:
                wait = retry_after(meter.prev_tokens, meter.tokens, tokens, tpm, elapsed)
                raise _rate_limited("tpm", scope, key, tpm, tokens, wait)

    def _budget(
        self, meter: Meter, scope: str, budget: int, period: str | None, cost: int, now: float
    ) -> None:
        period = period or "month"
        self.budgets[meter.subject] = (scope, budget, period)
        spent = (meter.day_spend if period == "day" else meter.month_spend) + meter.reserved
        if spent + cost > budget * MILLI:
            resets = self.periods.end(period, now)
            wait = seconds(resets - now)
            raise BudgetExceeded(
                f"the {scope}'s budget of {budget} units per {period} would be exceeded: "
                f"{spent / MILLI:g} spent or in flight, this request is estimated at "
                f"{cost / MILLI:g}; it renews at the start of the next {period} (UTC)",
                retry_after=wait,
                details={
                    "scope": scope,
                    "id": meter.subject.partition(":")[2],
                    "budget": budget,
                    "spent": spent / MILLI,
                    "estimate": cost / MILLI,
                    "period": period,
                    "resets_at": resets,
                },
            )

    def settle(
        self, request: Request, outcome: str, prompt: int | None, completion: int | None
    ) -> int:
        """Reconcile ``request``'s reservation with the engine's usage (None: the estimate
        stands; a request that reached no replica used nothing and is not counted as a
        request); return its cost."""
        reservation = request.reservation
        if reservation is None:
            if request.replica is None:
                return 0
            view = request.view
            return self.price(view.model_name, view.model_id).cost(prompt, completion)
        request.reservation = None
        # A request no replica took (the gateway refused it after admission, or a project
        # endpoint's fallback serves it) gives back its request as well as its tokens.
        if request.replica is None:
            prompt = completion = 0
            requests = -1
            cost = 0
        else:
            requests = 0
            # An engine that failed is paid for what it reported, nothing more; a request
            # that ended well (or whose client left) without a count pays its estimate.
            cost = reservation.price.cost(prompt, completion)
            if prompt is None:
                prompt = reservation.prompt
            if completion is None:
                completion = reservation.completion
            if outcome in SETTLED_IN_FULL:
                cost = reservation.price.cost(prompt, completion)
        delta = prompt + completion - reservation.prompt - reservation.completion
        start = reservation.minute
        for meter in reservation.meters:
            meter.inflight -= 1
            if delta or requests:
                if meter.minute == start:
                    meter.requests += requests
                    meter.d_requests += requests
                    meter.tokens += delta
                    meter.d_tokens += delta
                elif meter.minute - MINUTE == start:
                    meter.prev_requests += requests
                    meter.prev_tokens += delta
                    entry = self.pending.get((meter.subject, "minute", start))
                    if entry is not None:
                        entry[0] += requests
                        entry[1] += delta
            if cost:
                meter.day_spend += cost
                meter.d_day_spend += cost
                meter.month_spend += cost
                meter.d_month_spend += cost
        for meter in reservation.budgeted:
            meter.reserved -= reservation.cost
        return cost

    # -- limits and what operators read ------------------------------------------------------

    async def load(self) -> None:
        """Read every limit record and the current counters (at start)."""
        now = self.clock()
        minute = int(now // MINUTE) * MINUTE
        day, month = self.periods.start("day", now), self.periods.start("month", now)

        def read(tx: Any) -> tuple[list[Row], list[Row]]:
            return repository.current_counters(tx, minute, day, month), repository.all_limits(tx)

        counters, limits = await self.store.read(read)
        self.replace_limits(limits)
        self.apply_counters(counters, now)

    async def set_limits(self, scope: str, key: str, change: Mapping[str, Any]) -> Limits:
        """Change the limits of ``scope`` ``key`` (absent fields stay, null clears); they
        apply in this process at once, in the others at their next sync."""
        now = self.clock()
        limits = await self.store.write(
            lambda tx: repository.change_limits(tx, scope, key, change, now)
        )
        self._put(scope, key, limits)
        self.version += 1
        return limits

    def forget(self, scope: str, key: str, meter: Meter) -> None:
        """Drop ``meter`` (idle) from its scope's table."""
        table = self._by_scope.get(scope)
        if table is not None and table.get(key) is meter:
            del table[key]

    def _put(self, scope: str, key: str, limits: Limits) -> None:
        if limits.empty:
            self.limits[scope].pop(key, None)
        else:
            self.limits[scope][key] = limits

    def replace_limits(self, rows: list[Row]) -> None:
        """Take the stored limit records as the whole truth."""
        for table in self.limits.values():
            table.clear()
        for row in rows:
            if row["scope"] in self.limits:
                self._put(row["scope"], row["subject"], repository.limits_of(row))

    def apply_counters(self, rows: list[Row], now: float) -> None:
        """Take the store's totals (every process's counts, as of ``now``) into the meters;
        what this process counted since it handed its counts over stays on top."""
        now = max(now, self.clock())  # a sync's rows are applied after its transaction
        minute = int(now // MINUTE) * MINUTE
        self.periods.at(now)
        day, month = self.periods.day, self.periods.month
        pending = self.pending
        for row in rows:
            subject, kind, start = row["subject"], row["kind"], row["window_start"]
            meter = self.meters.get(subject)
            if meter is None:
                scope, _, key = subject.partition(":")
                table = self._by_scope.get(scope)
                if table is None:
                    continue
                meter = self._meter(table, scope, key)
            if kind == "minute":
                meter.roll(minute, pending)
                if start == minute:
                    meter.requests = row["requests"] + meter.d_requests
                    meter.tokens = row["tokens"] + meter.d_tokens
                elif start == minute - MINUTE:
                    meter.prev_requests = max(meter.prev_requests, row["requests"])
                    meter.prev_tokens = max(meter.prev_tokens, row["tokens"])
            else:
                meter.roll_periods(day, month, pending)
                if kind == "day":
                    if start == meter.day:
                        meter.day_spend = row["spend"] + meter.d_day_spend
                elif kind == "month" and start == meter.month:
                    meter.month_spend = row["spend"] + meter.d_month_spend

    def use(self, scope: str, key: str) -> dict[str, Any]:
        """What ``scope`` ``key`` used: requests and tokens in the sliding minute (every
        process, as of the last sync), spend (units) in its budget's period (the month
        when it has none) and in flight."""
        meter = self._by_scope[scope].get(key)
        if meter is None:
            return {"requests": 0, "tokens": 0, "spent": 0.0, "in_flight": 0.0, "period": None}
        now = self.clock()
        minute = int(now // MINUTE) * MINUTE
        weight = 1.0 - (now - minute) / MINUTE
        if meter.minute == minute:
            requests, tokens = meter.rate(weight)
        elif meter.minute == minute - MINUTE:
            requests, tokens = meter.requests * weight, meter.tokens * weight
        else:
            requests = tokens = 0
        period = self.budget_period(scope, key)
        current = self.periods.start(period, now) == (meter.day if period == "day" else meter.month)
        return {
            "requests": round(requests),
            "tokens": round(tokens),
            "spent": meter.spent(period) / MILLI if current else 0.0,
            "in_flight": meter.reserved / MILLI,
            "period": period,
        }

    def budget_period(self, scope: str, key: str) -> str:
        """The period of ``scope`` ``key``'s budget: its own, else (a person held to the
        personal budget) ``personal_period``; the month when it has none."""
        limits = self.limits[scope].get(key, NONE)
        if limits.budget is not None:
            return (limits.period or "month") if limits.budget else "month"
        last = self.budgets.get(f"{scope}:{key}")
        if scope == "user" and self.personal_budget and last is not None:
            return self.personal_period or "month"
        return "month"


def _rate_limited(
    limit: str, scope: str, key: str, value: int, requested: int, wait: float
) -> RateLimited:
    what = "requests" if limit == "rpm" else "tokens"
    after = seconds(wait)
    if requested > value:
        # No wait helps a request larger than the whole limit: say what would.
        message = (
            f"this request reserves {requested} tokens, more than the {scope}'s whole limit "
            f"of {value} tokens per minute ({limit}): it never fits; ask for fewer tokens "
            "(max_tokens) or send a shorter prompt"
        )
    else:
        message = (
            f"the {scope}'s limit of {value} {what} per minute ({limit}) is reached; "
            f"retry in {after} s"
        )
    return RateLimited(
        message,
        retry_after=after,
        details={
            "limit": limit,
            "scope": scope,
            "id": key,
            "value": value,
            "requested": requested,
        },
    )
