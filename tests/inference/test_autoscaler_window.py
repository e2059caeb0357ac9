"""When a scale-out window starts and when the autoscaler looks again.

The window counts from when the signal began, as the waiting requests tell, not from
the look that first saw it, and the look that decides comes when the window has held,
not up to a period later. Driven here on a clock of the test's own through the
autoscaler's decision step; the whole path with the real engine is in
``test_scaling_core.py`` and ``bench/scaling_bench.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio

from ficc_core.config import Config
from ficc_core.inference.scaling.autoscaler import Autoscaler, _Watch
from ficc_core.routing.demand import Demand

from ..support.clock import FakeClock

WINDOW, PERIOD = 3.0, 0.5


def autoscaler(clock: FakeClock, **settings: Any) -> tuple[Autoscaler, list[tuple[float, str]]]:
    config = attrs.evolve(
        Config(), scale_out_window=WINDOW, scale_out_queue=2.0, scale_out_wait=1.0, **settings
    )
    reconciler = SimpleNamespace(on_demand=SimpleNamespace(count=None))
    scaler = Autoscaler(
        store=None,  # type: ignore[arg-type]
        reconciler=reconciler,  # type: ignore[arg-type]
        contexts=None,  # type: ignore[arg-type]
        live=None,  # type: ignore[arg-type]
        config=config,
        metrics=None,  # type: ignore[arg-type]
        clock=clock,
        period=PERIOD,
    )
    decided: list[tuple[float, str]] = []

    async def grow(service_id: str, reason: str, figures: dict[str, Any]) -> object:
        decided.append((clock.now, reason))
        return object()

    scaler._grow = grow  # type: ignore[method-assign]
    return scaler, decided


RECORD = SimpleNamespace(id="svc", specification=lambda: SimpleNamespace(max_replicas=3))
ONE_READY = SimpleNamespace(replicas=("first",))


def queue(joined: list[float], now: float) -> Demand:
    """The demand of requests that joined the queue at ``joined`` (the test's clock)."""
    waits = sorted((now - at for at in joined if at <= now), reverse=True)
    return Demand(waits=tuple(waits))


async def run_looks(
    scaler: Autoscaler, clock: FakeClock, demand, watch: _Watch, until: float = 60.0
) -> None:
    """Look as ``Autoscaler.run`` does: after each look, wait ``_pause()``."""
    scaler._watch["svc"] = watch
    while clock.now < until:
        decided = await scaler._scale_out(
            RECORD, ONE_READY, demand(clock.now), (0,), watch, clock.now, True
        )
        if decided:
            return
        clock.now += scaler._pause()


async def test_queue_window_counts_from_the_request_that_took_the_queue_past_its_target():
    clock = FakeClock(0.0)
    clock.now = 0.9
    scaler, decided = autoscaler(clock)
    # A calm look at 0.9 s; at 1.0 s sixteen requests come at once (16 > 2 a replica).
    watch = _Watch()
    await scaler._scale_out(RECORD, ONE_READY, Demand(), (0,), watch, clock.now, True)
    assert watch.not_before == 0.9
    clock.now = 1.4  # the next look, a period later
    await run_looks(scaler, clock, lambda now: queue([1.0] * 16, now), watch)
    # Decided when the window had held from 1.0 s, not from the 1.4 s look.
    assert decided == [(pytest.approx(1.0 + WINDOW, abs=0.01), "scale_out_queue")]
    # The next window counts from the decision.
    assert watch.pressed_since is None and watch.not_before == decided[0][0]


async def test_queue_onset_is_the_third_longest_wait_with_a_target_of_two():
    clock = FakeClock(0.0)
    scaler, decided = autoscaler(clock)
    watch = _Watch(not_before=0.0)
    clock.now = 5.0
    # Waiting since 0.5, 1.0 (the queue was 2: at its target) and 2.0 s (past it: 3).
    demand = queue([0.5, 1.0, 2.0], clock.now)
    assert demand.waited(3) == pytest.approx(3.0)
    await scaler._scale_out(RECORD, ONE_READY, demand, (0,), watch, clock.now, True)
    assert decided == [(5.0, "scale_out_queue")]  # held from 2.0 s: exactly the window


async def test_onset_never_reaches_back_past_a_look_that_saw_no_signal():
    clock = FakeClock(0.0)
    scaler, decided = autoscaler(clock)
    clock.now = 10.0
    # The waits say 8 s, but a look at 9 s saw no signal (a replica was loading then).
    watch = _Watch(not_before=9.0)
    demand = queue([2.0] * 8, clock.now)
    await scaler._scale_out(RECORD, ONE_READY, demand, (0,), watch, clock.now, True)
    assert watch.pressed_since == 9.0 and decided == []
    await run_looks(scaler, clock, lambda now: queue([2.0] * 8, now), watch)
    assert decided == [(pytest.approx(9.0 + WINDOW, abs=0.01), "scale_out_queue")]


async def test_the_first_look_a_service_gets_counts_its_window_from_itself():
    clock = FakeClock(0.0)
    scaler, decided = autoscaler(clock)
    clock.now = 100.0
    watch = _Watch()  # no look before: nothing vouches for the time before this one
    await scaler._scale_out(
        RECORD, ONE_READY, queue([0.0] * 8, clock.now), (0,), watch, clock.now, True
    )
    assert watch.pressed_since == 100.0 and decided == []


async def test_wait_window_counts_from_when_the_oldest_wait_passed_its_target():
    clock = FakeClock(0.0)
    scaler, decided = autoscaler(clock)
    watch = _Watch(not_before=0.0)
    clock.now = 2.2
    # One request waiting since 0.0 s: its wait passed the 1 s target at 1.0 s.
    await run_looks(scaler, clock, lambda now: queue([0.0], now), watch)
    assert decided == [(pytest.approx(1.0 + WINDOW, abs=0.01), "scale_out_wait")]


async def test_a_replica_loading_restarts_the_window():
    clock = FakeClock(0.0)
    scaler, decided = autoscaler(clock)
    watch = _Watch(not_before=0.0, pressed_since=0.5)
    clock.now = 2.0
    # Two placements active, one ready: what the loading one brings is not seen yet.
    await scaler._scale_out(
        RECORD, ONE_READY, queue([0.5] * 9, clock.now), (0, 1), watch, clock.now, True
    )
    assert watch.pressed_since is None and watch.not_before == 2.0 and decided == []


def test_pause_is_a_period_or_the_time_left_of_a_window():
    clock = FakeClock(0.0)
    scaler, _ = autoscaler(clock)
    assert scaler._pause() == PERIOD
    clock.now = 10.0
    scaler._watch["far"] = _Watch(pressed_since=8.0)  # due at 11.0: a period first
    assert scaler._pause() == PERIOD
    scaler._watch["near"] = _Watch(pressed_since=7.2)  # due at 10.2
    assert scaler._pause() == pytest.approx(0.205)
    scaler._watch["past"] = _Watch(pressed_since=1.0)  # due long ago (cooling down)
    assert scaler._pause() == pytest.approx(0.205)  # not a look at once, again and again


def test_demand_waited_counts_from_the_longest_wait():
    demand = Demand(waits=(4.0, 2.0, 1.0))
    assert [demand.waited(n) for n in range(5)] == [0.0, 4.0, 2.0, 1.0, 0.0]
    assert (demand.queued, demand.oldest_wait) == (3, 4.0)
    assert (Demand().queued, Demand().oldest_wait, Demand().waited(1)) == (0, 0.0, 0.0)


async def test_run_sleeps_until_the_window_ends(autojump_clock):
    # The run loop's own sleeps, on trio's clock: a look at 0.5, then at the window's end.
    looks: list[float] = []
    clock = trio.current_time
    scaler, _ = autoscaler(clock)  # type: ignore[arg-type]
    scaler.live = SimpleNamespace(
        services=lambda: [SimpleNamespace(id="svc", scaled=True)], get=lambda _id: object()
    )

    async def look(service_id: str) -> None:
        looks.append(clock())
        if len(looks) == 1:
            scaler._watch["svc"] = _Watch(pressed_since=clock() - 2.8)

    scaler.look = look  # type: ignore[method-assign]
    start = clock()
    with trio.move_on_after(1.5):
        await scaler.run()
    assert [round(t - start, 3) for t in looks[:2]] == [0.5, 0.705]
