"""The quota gate on real SQLite: sliding-window rate limits per credential, person and
project, the defaults as a fallback, reservations reconciled to the engine's usage,
budgets to the milli-unit, two processes on one store, and a failing store (those two on
PostgreSQL too)."""

from __future__ import annotations

import calendar
import logging
from typing import Any

import pytest
import trio

from ficc_core.auth import Principal
from ficc_core.auth.principal import PrincipalKind
from ficc_core.base.errors import InvalidRequest
from ficc_core.config import load_config
from ficc_core.controller.metrics import Metrics
from ficc_core.gateway.request import Request
from ficc_core.quotas import BudgetExceeded, Quotas, QuotaSync, RateLimited
from ficc_core.quotas.meters import retry_after
from ficc_core.routing.live import LiveService
from ficc_core.store import open_sqlite_store

from ..conftest import open_same_store
from ..support.clock import FakeClock

T0 = 1_800_000_000.0  # a minute's start (divisible by 60), mid-January 2027 UTC


VIEW = LiveService(
    id="svc",
    project_id="p1",
    alias="a",
    generation=1,
    admission="serving",
    concurrency=1,
    model_id="m-1",
    model_name="smol",
)


def actor(key: str = "c1", user: str | None = None, project: str = "p1", **kw: Any) -> Principal:
    return Principal(
        kind=PrincipalKind.CREDENTIAL,
        id=key,
        project_id=project,
        project_name=project,
        scopes=frozenset({"inference:invoke"}),
        user_id=user,
        **kw,
    )


def request(who: Principal, prompt: int = 10, completion: int = 10) -> Request:
    return Request(
        service_id="svc",
        path="/v1/chat/completions",
        actor=who,
        view=VIEW,
        headers={},
        started=0.0,
        deadline=float("inf"),
        prompt_estimate=prompt,
        completion_estimate=completion,
    )


def config(tmp_path, **overrides: Any):
    return load_config(overrides={"data_dir": str(tmp_path), **overrides}, environ={})


async def gate(tmp_path, clock: FakeClock, store=None, **overrides: Any) -> Quotas:
    store = store or await open_sqlite_store(tmp_path / "q.db")
    quotas = Quotas(store, config(tmp_path, **overrides), clock=clock)
    await quotas.load()
    return quotas


def served(quotas: Quotas, who: Principal, count: int, **kw: Any) -> int:
    admitted = 0
    for _ in range(count):
        try:
            quotas.admit(request(who, **kw))
        except RateLimited:
            continue
        admitted += 1
    return admitted


async def test_sixty_rpm_a_burst_of_a_hundred_serves_sixty(tmp_path):
    clock = FakeClock(T0 + 10)
    quotas = await gate(tmp_path, clock)
    await quotas.set_limits("credential", "c1", {"rpm": 60})
    assert served(quotas, actor(), 100) == 60
    with pytest.raises(RateLimited) as refused:
        quotas.admit(request(actor()))
    error = refused.value
    assert (error.status, error.code) == (429, "rate_limited")
    assert error.details == {
        "limit": "rpm",
        "scope": "credential",
        "id": "c1",
        "value": 60,
        "requested": 1,
        "retry_after": 51,
    }
    assert error.headers == {"Retry-After": "51"}


async def test_the_window_slides_no_double_burst_at_the_minute_edge(tmp_path):
    clock = FakeClock(T0 + 59)
    quotas = await gate(tmp_path, clock)
    await quotas.set_limits("credential", "c1", {"rpm": 60})
    assert served(quotas, actor(), 60) == 60
    clock.now = T0 + 61  # the next minute: the last one still weighs 58/60
    assert served(quotas, actor(), 60) == 1
    clock.now = T0 + 90  # half of it slid out: 30 + 1 counted
    assert served(quotas, actor(), 60) == 29


def test_retry_after_is_when_the_request_fits_again():
    # 60 counted this minute, 10 s in: the next minute, once the previous weighs 59/60.
    assert retry_after(0, 60, 1, 60, 10.0) == pytest.approx(51.0)
    # The previous minute full, the current empty, 30 s in: it fits right away... almost.
    assert retry_after(60, 0, 1, 60, 30.0) == pytest.approx(0.0)
    assert retry_after(60, 30, 1, 60, 30.0) == pytest.approx(1.0)
    assert retry_after(0, 0, 100, 60, 0.0) == 60.0


async def test_explicit_limits_win_over_the_default_above_or_below(tmp_path):
    clock = FakeClock(T0)
    quotas = await gate(tmp_path, clock, default_rpm=5)
    assert served(quotas, actor("c1"), 10) == 5  # the default, on the credential
    await quotas.set_limits("credential", "c2", {"rpm": 8})  # above the default
    assert served(quotas, actor("c2"), 10) == 8
    await quotas.set_limits("credential", "c3", {"rpm": 2})  # below it
    assert served(quotas, actor("c3"), 10) == 2
    await quotas.set_limits("project", "p2", {"rpm": 7})  # another scope sets one
    assert served(quotas, actor("c4", project="p2"), 10) == 7
    await quotas.set_limits("user", "u1", {"rpm": 0})  # an explicit "none"
    assert served(quotas, actor("c5", user="u1"), 10) == 10


async def test_a_default_of_zero_is_no_limit(tmp_path):
    quotas = await gate(tmp_path, FakeClock(T0), default_rpm=0, default_tpm=0)
    assert served(quotas, actor(), 1000, prompt=1000, completion=1000) == 1000


async def test_a_person_and_a_project_hold_all_their_keys(tmp_path):
    quotas = await gate(tmp_path, FakeClock(T0))
    await quotas.set_limits("user", "u1", {"rpm": 3})
    await quotas.set_limits("project", "p1", {"rpm": 5})
    assert served(quotas, actor("c1", user="u1"), 2) == 2
    assert served(quotas, actor("c2", user="u1"), 5) == 1  # the person's third
    with pytest.raises(RateLimited) as refused:
        quotas.admit(request(actor("c3", user="u1")))
    assert refused.value.details["scope"] == "user"
    assert served(quotas, actor("c4"), 5) == 2  # the project's fourth and fifth
    with pytest.raises(RateLimited) as refused:
        quotas.admit(request(actor("c5")))
    assert (refused.value.details["scope"], refused.value.details["id"]) == ("project", "p1")


async def test_personal_keys_meet_the_personal_limits_unless_the_person_has_some(tmp_path):
    quotas = await gate(tmp_path, FakeClock(T0), personal_rpm=4, default_rpm=100)
    personal = actor("k1", user="u1", project="", personal=True)
    assert served(quotas, personal, 10) == 4
    assert served(quotas, actor("k2", user="u2", project="", personal=True), 10) == 4
    await quotas.set_limits("user", "u3", {"rpm": 6})
    assert served(quotas, actor("k3", user="u3", project="", personal=True), 10) == 6


async def test_tpm_reserves_the_estimate_and_settles_to_the_engines_usage(tmp_path):
    quotas = await gate(tmp_path, FakeClock(T0 + 1))
    await quotas.set_limits("credential", "c1", {"tpm": 100})
    first = request(actor(), prompt=30, completion=40)
    quotas.admit(first)
    meter = quotas.meters["credential:c1"]
    assert meter.tokens == 70
    with pytest.raises(RateLimited) as refused:  # 70 + 40 > 100
        quotas.admit(request(actor(), prompt=20, completion=20))
    assert refused.value.details["limit"] == "tpm"
    assert refused.value.details["requested"] == 40
    assert "retry in" in refused.value.message
    # Larger than the whole limit: no wait helps, and the message says what would.
    with pytest.raises(RateLimited) as never:
        quotas.admit(request(actor(), prompt=60, completion=60))
    assert never.value.details["requested"] == 120
    assert "it never fits" in never.value.message and "retry in" not in never.value.message
    first.replica = object()  # type: ignore[assignment]
    quotas.settle(first, "ok", 12, 5)
    assert meter.tokens == 17
    second = request(actor(), prompt=20, completion=20)
    quotas.admit(second)
    second.replica = object()  # type: ignore[assignment]
    quotas.settle(second, "ok", 25, None)  # completion not reported: the estimate stays
    assert meter.tokens == 17 + 45
    third = request(actor(), prompt=5, completion=5)
    quotas.admit(third)
    quotas.settle(third, "no_ready_replica", None, None)  # never reached a replica
    assert meter.tokens == 62


async def test_a_request_no_replica_took_gives_back_its_request_and_refusals_count_none(
    tmp_path,
):
    clock = FakeClock(T0 + 1)
    quotas = await gate(tmp_path, clock, pricing={"smol": {"prompt_per_1k": 1}})
    sync = QuotaSync(quotas, Metrics(), interval=1.0)
    await quotas.set_limits("credential", "c1", {"rpm": 2})
    await quotas.set_limits("project", "p1", {"budget": 1, "period": "day"})
    first = request(actor())
    quotas.admit(first)
    meter = quotas.meters["credential:c1"]
    assert (meter.requests, meter.tokens) == (1, 20)
    assert await sync.sync()  # the store holds the admission; the give-back follows it
    quotas.settle(first, "no_ready_replica", None, None)  # refused after admission
    assert (meter.requests, meter.tokens) == (0, 0)
    assert quotas.use("credential", "c1")["requests"] == 0
    served_one = request(actor())
    quotas.admit(served_one)
    served_one.replica = object()  # type: ignore[assignment]
    quotas.settle(served_one, "ok", 5, 5)  # an engine took it: it counts
    fallen = request(actor())
    quotas.admit(fallen)
    # A rate-limited refusal is not counted (the limit is full), nor a budget refusal.
    with pytest.raises(RateLimited):
        quotas.admit(request(actor()))
    with pytest.raises(BudgetExceeded):
        quotas.admit(request(actor("c2"), prompt=20_000))
    assert quotas.meters["credential:c2"].requests == 0
    assert quotas.meters["project:p1"].requests == 2
    clock.now = T0 + 61  # the next minute: the fallen one's minute is the previous one
    quotas.admit(request(actor("c3")))  # rolls the project's meter on
    quotas.settle(fallen, "service_saturated", None, None)
    assert quotas.meters["project:p1"].prev_requests == 1
    assert meter.requests == 1 and meter.d_requests == 0  # c1's minute not rolled yet
    assert await sync.sync()
    rows = await quotas.store.read(
        lambda tx: tx.fetch_all(
            "SELECT subject, requests FROM quota_counters WHERE kind = 'minute' "
            "AND window_start = ?",
            (int(T0),),
        )
    )
    assert {row["subject"]: row["requests"] for row in rows} == {
        "credential:c1": 1,
        "project:p1": 1,
    }


async def test_budget_the_tenth_request_crosses_it_and_spend_is_exact(tmp_path):
    quotas = await gate(
        tmp_path, FakeClock(T0), pricing={"smol": {"prompt_per_1k": 3, "completion_per_1k": 7}}
    )
    await quotas.set_limits("project", "p1", {"budget": 1, "period": "day"})
    costs = []
    for number in range(1, 13):
        req = request(actor(), prompt=10, completion=11)  # 30 + 77 milli-units
        try:
            quotas.admit(req)
        except BudgetExceeded as refused:
            assert number >= 10
            error = refused
            continue
        assert number <= 9
        req.replica = object()  # type: ignore[assignment]
        costs.append(quotas.settle(req, "ok", 10, 11))
    assert costs == [107] * 9
    assert quotas.meters["project:p1"].day_spend == 963
    assert error.code == "budget_exceeded" and error.status == 429
    assert error.details["scope"] == "project" and error.details["budget"] == 1
    assert error.details["spent"] == 0.963 and error.details["period"] == "day"
    assert error.details["resets_at"] == (int(T0) // 86400 + 1) * 86400
    assert int(error.headers["Retry-After"]) == error.details["resets_at"] - int(T0)


async def test_limits_are_validated_field_by_field_and_nothing_changes(tmp_path):
    quotas = await gate(tmp_path, FakeClock(T0))
    await quotas.set_limits("project", "p1", {"rpm": 5})
    with pytest.raises(InvalidRequest) as refused:
        await quotas.set_limits("project", "p1", {"rpm": -1, "tpm": "x", "period": "week"})
    paths = [e["path"] for e in refused.value.details["errors"]]
    assert paths == ["$.rpm", "$.tpm", "$.period"]
    with pytest.raises(InvalidRequest) as refused:
        await quotas.set_limits("project", "p1", {"budget": 3})
    assert refused.value.details["errors"] == [
        {"path": "$.period", "message": "a budget needs a period: day or month"}
    ]
    assert quotas.limits["project"]["p1"].rpm == 5
    limits = await quotas.set_limits("project", "p1", {"budget": 3, "period": "month"})
    assert (limits.rpm, limits.budget, limits.period) == (5, 3, "month")
    cleared = await quotas.set_limits("project", "p1", {"rpm": None, "budget": None})
    assert cleared.empty and "p1" not in quotas.limits["project"]


async def test_two_processes_hold_a_limit_together_within_one_interval(tmp_path, store_backend):
    """Two processes on one SQLite file, or two controllers on one PostgreSQL database."""
    clock = FakeClock(T0 + 5)
    store_a = store_backend
    store_b = await open_same_store(store_backend)
    a = await gate(tmp_path, clock, store_a)
    b = await gate(tmp_path, clock, store_b)
    sync_a = QuotaSync(a, Metrics(), interval=1.0)
    sync_b = QuotaSync(b, Metrics(), interval=1.0)
    await a.set_limits("project", "p1", {"rpm": 60})
    assert await sync_b.sync()  # b reads the limit set through a
    assert b.limits["project"]["p1"].rpm == 60
    assert served(a, actor("c1"), 40) == 40
    assert await sync_a.sync() and await sync_b.sync()
    assert served(b, actor("c2"), 40) == 20  # 60 together
    assert await sync_b.sync() and await sync_a.sync()
    assert served(a, actor("c1"), 10) == 0
    # Between two syncs each process admits from what it knew: the drift is what the
    # other admitted in one interval, never more.
    clock.now = T0 + 65 + 55  # the next minute but one, nearly over: the last is empty
    assert served(a, actor("c1"), 60) == 60
    assert served(b, actor("c2"), 60) == 60  # b has not seen a's 60 yet
    assert await sync_a.sync() and await sync_b.sync()
    assert served(a, actor("c1"), 10) == 0 and served(b, actor("c2"), 10) == 0
    rows = await store_a.read(
        lambda tx: tx.fetch_all(
            "SELECT subject, requests FROM quota_counters WHERE kind = 'minute'"
        )
    )
    assert {r["subject"]: r["requests"] for r in rows}["project:p1"] >= 120
    await store_b.aclose()


class FailingStore:
    """The real store, whose writes fail while ``failing`` (a stalled or broken disk)."""

    def __init__(self, store) -> None:
        self.store = store
        self.failing = False
        self.stall = trio.Event()

    async def read(self, fn):
        return await self.store.read(fn)

    async def write(self, fn):
        if self.failing:
            raise OSError("disk I/O error")
        return await self.store.write(fn)


async def test_a_failing_store_never_stops_counting_and_loses_nothing(
    tmp_path, caplog, store_backend
):
    clock = FakeClock(T0 + 1)
    store = FailingStore(store_backend)
    quotas = await gate(tmp_path, clock, store)
    metrics = Metrics()
    sync = QuotaSync(quotas, metrics, interval=1.0)
    await quotas.set_limits("credential", "c1", {"rpm": 50})
    assert served(quotas, actor(), 10) == 10
    store.failing = True
    caplog.set_level(logging.WARNING, "ficc.quotas")
    for _ in range(3):
        assert not await sync.sync()
        assert served(quotas, actor(), 10) == 10  # admitted from memory
    assert served(quotas, actor(), 100) == 10  # and refused from memory
    failures = metrics.registry.get_sample_value("ficc_quota_sync_failures_total")
    assert failures == 3
    assert len([r for r in caplog.records if "did not take" in r.message]) == 1
    store.failing = False
    assert await sync.sync()
    row = await store.read(
        lambda tx: tx.fetch_one(
            "SELECT requests FROM quota_counters WHERE subject = 'credential:c1'"
        )
    )
    assert row == {"requests": 50}


# 13-20 s of wall time, at the head before the deadline too: under autojump the store's
# bounded reads on their worker thread let the clock jump past their bound, again and again.
@pytest.mark.deadline(60)
async def test_a_stalled_store_never_holds_a_request(tmp_path, autojump_clock):
    clock = FakeClock(T0 + 1)
    base = await open_sqlite_store(tmp_path / "q.db")
    stalled = trio.Event()

    class Stalled(FailingStore):
        async def write(self, fn):
            stalled.set()
            await trio.sleep_forever()

    quotas = await gate(tmp_path, clock, Stalled(base), default_rpm=30)
    sync = QuotaSync(quotas, Metrics(), interval=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(sync.run)
        await stalled.wait()
        # The gate never awaits: it answers while the sync waits on the store.
        assert served(quotas, actor(), 40) == 30
        assert sync.synced == 0
        nursery.cancel_scope.cancel()
    await base.aclose()


async def test_idle_meters_are_forgotten_unless_they_spent_this_period(tmp_path):
    clock = FakeClock(T0 + 1)
    quotas = await gate(tmp_path, clock, pricing={"smol": {"prompt_per_1k": 1}})
    sync = QuotaSync(quotas, Metrics(), interval=1.0)
    free = request(actor("c1"), prompt=0, completion=0)
    quotas.admit(free)
    paid = request(actor("c2", project="p2"))
    quotas.admit(paid)
    paid.replica = free.replica = object()  # type: ignore[assignment]
    quotas.settle(free, "ok", 0, 0)
    quotas.settle(paid, "ok", 10, 0)
    assert await sync.sync()
    clock.now = T0 + 200  # idle for three minutes
    assert await sync.sync()
    assert set(quotas.meters) == {"credential:c2", "project:p2"}


async def test_a_long_request_keeps_its_meters_and_its_spend_is_written(tmp_path):
    clock = FakeClock(T0 + 1)
    quotas = await gate(tmp_path, clock, pricing={"smol": {"completion_per_1k": 5}})
    sync = QuotaSync(quotas, Metrics(), interval=1.0)
    long = request(actor("c1"))
    quotas.admit(long)
    assert await sync.sync()
    clock.now = T0 + 300  # a five-minute stream, nobody else asking
    assert await sync.sync()
    long.replica = object()  # type: ignore[assignment]
    assert quotas.settle(long, "ok", 10, 100) == 500
    clock.now = T0 - 30  # the wall clock steps back: counting goes on in the later minute
    quotas.admit(request(actor("c1")))
    assert await sync.sync()
    rows = await quotas.store.read(
        lambda tx: tx.fetch_all(
            "SELECT subject, kind, spend FROM quota_counters WHERE kind = 'month'"
        )
    )
    assert {row["subject"]: row["spend"] for row in rows} == {
        "credential:c1": 500,
        "project:p1": 500,
    }
    meter = quotas.meters["credential:c1"]
    assert (meter.minute, meter.requests) == (T0, 2)  # not reset by the earlier minute


async def test_an_engine_failure_pays_what_it_reported_a_served_request_its_estimate(tmp_path):
    quotas = await gate(
        tmp_path, FakeClock(T0), pricing={"smol": {"prompt_per_1k": 3, "completion_per_1k": 7}}
    )
    costs = {}
    for outcome in ("engine_failed", "ok", "cancelled"):
        req = request(actor(), prompt=10, completion=100)
        quotas.admit(req)
        req.replica = object()  # type: ignore[assignment]
        costs[outcome] = quotas.settle(req, outcome, None, None)
    failed = request(actor(), prompt=10, completion=100)
    quotas.admit(failed)
    failed.replica = object()  # type: ignore[assignment]
    costs["engine_timeout, prompt reported"] = quotas.settle(failed, "engine_timeout", 10, None)
    # The failure is billed nothing (it reported nothing) or only what it reported; the
    # requests the engine did the work for pay their estimate (30 + 700 milli-units).
    assert costs == {
        "engine_failed": 0,
        "ok": 730,
        "cancelled": 730,
        "engine_timeout, prompt reported": 30,
    }
    # Every one of them spent the engine's capacity: tpm holds their estimates.
    assert quotas.meters["credential:c1"].tokens == 4 * 110


#: One unit per token: a request of 10 + 27 tokens costs 37 units (37,000 milli-units).
UNIT_A_TOKEN = {"smol": {"prompt_per_1k": 1000, "completion_per_1k": 1000}}
DAY = 86400


def paid(quotas: Quotas, who: Principal, count: int) -> int:
    """Up to ``count`` requests of 37 units, each served (engine usage = the estimate)
    until the budget refuses one; how many were served."""
    for number in range(count):
        req = request(who, prompt=10, completion=27)
        try:
            quotas.admit(req)
        except BudgetExceeded:
            return number
        req.replica = object()  # type: ignore[assignment]
        assert quotas.settle(req, "ok", None, None) == 37_000
    return count


@pytest.mark.parametrize("scope, key", [("project", "p1"), ("credential", "c1")])
async def test_a_day_budget_moved_to_a_month_keeps_the_months_spend(tmp_path, scope, key):
    clock = FakeClock(T0 - DAY)  # yesterday (the same month)
    quotas = await gate(tmp_path, clock, pricing=UNIT_A_TOKEN)
    await quotas.set_limits(scope, key, {"budget": 200, "period": "day"})
    assert paid(quotas, actor(), 2) == 2  # 74 yesterday
    clock.now = T0  # a new day: the day budget renews
    assert paid(quotas, actor(), 10) == 5  # 185 today, the sixth would make 222
    use = quotas.use(scope, key)
    assert (use["spent"], use["period"]) == (185.0, "day")
    await quotas.set_limits(scope, key, {"period": "month", "budget": 350})
    # The month holds yesterday's 74 and today's 185: 2 more fit (333), not 9.
    assert quotas.use(scope, key)["spent"] == 259.0
    assert paid(quotas, actor(), 10) == 2
    with pytest.raises(BudgetExceeded) as refused:
        quotas.admit(request(actor(), prompt=10, completion=27))
    details = refused.value.details
    assert (details["scope"], details["spent"], details["period"]) == (scope, 333.0, "month")
    assert quotas.use(scope, key) == {
        "requests": 7,  # this minute's: today's 5 and 2
        "tokens": 7 * 37,
        "spent": 333.0,
        "in_flight": 0.0,
        "period": "month",
    }


async def test_a_day_budget_below_todays_spend_refuses_at_once(tmp_path):
    clock = FakeClock(T0 - DAY)
    quotas = await gate(tmp_path, clock, pricing=UNIT_A_TOKEN)
    assert paid(quotas, actor(), 3) == 3  # 111 yesterday, no budget anywhere
    clock.now = T0
    await quotas.set_limits("credential", "c1", {"budget": 10_000, "period": "month"})
    assert paid(quotas, actor(), 13) == 13  # 481 today, 592 this month
    await quotas.set_limits("credential", "c1", {"budget": 50, "period": "day"})
    assert quotas.use("credential", "c1")["spent"] == 481.0
    with pytest.raises(BudgetExceeded) as refused:
        quotas.admit(request(actor(), prompt=10, completion=27))
    details = refused.value.details
    assert (details["spent"], details["period"], details["budget"]) == (481.0, "day", 50)
    assert details["resets_at"] == (int(T0) // DAY + 1) * DAY
    # No budget, then a day's, on the project: today's spend counted there too.
    await quotas.set_limits("project", "p1", {"budget": 500, "period": "day"})
    with pytest.raises(BudgetExceeded) as refused:
        quotas.admit(request(actor("c2"), prompt=10, completion=27))
    assert (refused.value.details["scope"], refused.value.details["spent"]) == ("project", 481.0)
    # Back to a month: its 592 counted (and nothing of yesterday in the day's).
    await quotas.set_limits("project", "p1", {"budget": 600, "period": "month"})
    with pytest.raises(BudgetExceeded) as refused:
        quotas.admit(request(actor("c2"), prompt=10, completion=27))
    assert (refused.value.details["spent"], refused.value.details["period"]) == (592.0, "month")
    await quotas.set_limits("project", "p1", {"budget": 630})
    assert paid(quotas, actor("c2"), 2) == 1  # 629


async def test_two_processes_share_the_day_and_the_month_spend(tmp_path, store_backend):
    clock = FakeClock(T0 - DAY)
    store_b = await open_same_store(store_backend)
    a = await gate(tmp_path, clock, store_backend, pricing=UNIT_A_TOKEN)
    b = await gate(tmp_path, clock, store_b, pricing=UNIT_A_TOKEN)
    sync_a = QuotaSync(a, Metrics(), interval=1.0)
    sync_b = QuotaSync(b, Metrics(), interval=1.0)
    assert paid(a, actor("c1"), 2) == 2  # 74 yesterday, through a, no budget
    assert await sync_a.sync()
    clock.now = T0
    assert paid(a, actor("c1"), 5) == 5  # 185 today
    assert await sync_a.sync()
    today = int(T0) // DAY * DAY
    month = calendar.timegm((2027, 1, 1, 0, 0, 0))  # T0 is in mid-January 2027
    assert month < today - DAY
    rows = await store_backend.read(
        lambda tx: tx.fetch_all(
            "SELECT subject, kind, window_start, spend FROM quota_counters "
            "WHERE kind IN ('day', 'month')"
        )
    )
    # Yesterday's day no longer decides (dropped); today's and the month's both synced.
    assert {(r["subject"], r["kind"], r["window_start"]): r["spend"] for r in rows} == {
        ("credential:c1", "day", today): 185_000,
        ("project:p1", "day", today): 185_000,
        ("credential:c1", "month", month): 259_000,
        ("project:p1", "month", month): 259_000,
    }
    # b, which served nothing, reads both and holds either budget to them.
    assert await sync_b.sync()
    await b.set_limits("project", "p1", {"budget": 200, "period": "day"})
    assert paid(b, actor("c2"), 1) == 0  # 185 + 37 > 200
    await b.set_limits("project", "p1", {"budget": 300, "period": "month"})
    assert paid(b, actor("c2"), 3) == 1  # 296; 333 would not fit
    assert await sync_b.sync() and await sync_a.sync()
    assert a.limits["project"]["p1"].period == "month"
    assert a.use("project", "p1")["spent"] == 296.0
    await a.set_limits("project", "p1", {"period": "day", "budget": 230})
    assert a.use("project", "p1")["spent"] == 222.0
    assert paid(a, actor("c1"), 1) == 0  # 259 > 230
    await store_b.aclose()
