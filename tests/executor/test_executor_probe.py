"""The readiness probe's schedule: soon at first, then a tenth of the time loaded so far.

An engine is seen ready a small share of its load time late, never more than the
adapter's ``interval`` late, and asked no more often than that once it loads for long.
Driven on trio's autojump clock against an engine that answers 503 until it is ready
(the probe's only edge: what an engine answers, and when).
"""

from __future__ import annotations

from itertools import pairwise

import attrs
import pytest
import trio

from ficc_core.executor.bootstrap import FIRST_PROBE, probe_until_ready
from ficc_core.schema import ReadinessProbe
from ficc_core.testing import executor_kit as kit


class Engine:
    """Answers ``GET /health`` 503 until ``ready_at`` seconds after it was made, then 200."""

    def __init__(self, ready_at: float) -> None:
        self.start = trio.current_time()
        self.ready_at = ready_at
        self.asked: list[float] = []

    async def request(self, attempt_id: str, method: str, path: str, *args, **kwargs):
        now = trio.current_time() - self.start
        self.asked.append(now)
        return (200 if now >= self.ready_at else 503), b""


def job(interval: float):
    return attrs.evolve(
        kit.standin_job(), readiness=ReadinessProbe(path="/health", timeout=600, interval=interval)
    )


@pytest.mark.parametrize("ready_at", [0.3, 1.2, 2.3, 4.0])
@pytest.mark.deadline(70)
async def test_an_engine_is_seen_ready_about_a_tenth_of_its_load_late(autojump_clock, ready_at):
    engine = Engine(ready_at)
    with trio.fail_after(60):
        assert await probe_until_ready(engine, "a1", job(0.5)) is None  # type: ignore[arg-type]
    seen = engine.asked[-1]
    # A tenth of the time loaded plus the first wait: at 2.3 s, seen by 2.55 s (a
    # quarter longer each time, as before, saw it up to 0.5 s late: at 2.8 s).
    assert ready_at <= seen <= ready_at * 1.1 + FIRST_PROBE
    gaps = [b - a for a, b in pairwise(engine.asked)]
    assert gaps[0] == pytest.approx(FIRST_PROBE)
    assert all(later >= earlier for earlier, later in pairwise(gaps))


@pytest.mark.deadline(310)
async def test_a_long_load_is_asked_no_more_often_than_the_interval(autojump_clock):
    engine = Engine(120.0)
    with trio.fail_after(300):
        assert await probe_until_ready(engine, "a1", job(1.0)) is None  # type: ignore[arg-type]
    gaps = [b - a for a, b in pairwise(engine.asked)]
    assert max(gaps) == pytest.approx(1.0)
    # Soon at first, then once a second: about 40 probes in the 10 s it takes the
    # waits to grow to the interval, then one a second for the rest of the two minutes.
    assert len([t for t in engine.asked if t < 10.0]) <= 42
    assert len([t for t in engine.asked if t >= 10.0]) <= 111
    assert engine.asked[-1] - 120.0 <= 1.0
