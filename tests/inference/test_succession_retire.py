"""Retiring an attempt whose node cannot be asked: tried again after a pause, not at once."""

from __future__ import annotations

from types import SimpleNamespace

import trio

from ficc_core.inference.reconciliation.succession import Succession
from ficc_core.inference.records import AttemptState

READY_PERIOD = 1.0


class _Attempts:
    ready_period = READY_PERIOD

    def __init__(self, released: bool) -> None:
        self.released = released
        self.stops: list[tuple[float, str | None]] = []

    async def stop(self, attempt, reason=None) -> bool:
        self.stops.append((trio.current_time(), reason))
        return self.released


class _Store:
    def __init__(self, attempt) -> None:
        self.attempt = attempt

    async def read(self, fn):
        return self.attempt


def _retiring(released: bool):
    attempt = SimpleNamespace(
        attempt_id="a1", state=AttemptState.STOPPING, generation=1, replica=0, released=False
    )
    attempts = _Attempts(released)
    reconciler = SimpleNamespace(store=_Store(attempt), attempts=attempts, drain_timeout=5.0)
    driver = SimpleNamespace(
        replicas={}, dismissed={"a1": "restarted"}, retiring={"a1"}, wake=trio.Event()
    )
    return Succession(reconciler), attempt, attempts, driver


async def test_a_stop_the_node_could_not_take_is_retried_after_a_pause(autojump_clock):
    succession, attempt, attempts, driver = _retiring(released=False)
    began = trio.current_time()
    await succession.retire(SimpleNamespace(generation=1), attempt, driver)
    assert attempts.stops == [(began, "restarted")]
    # The driver is woken (to retire it again) only after the pause, and meanwhile the
    # attempt stays marked retiring, so no second retire starts beside it.
    assert trio.current_time() - began == READY_PERIOD
    assert driver.wake.is_set() and driver.retiring == set()


async def test_a_confirmed_stop_wakes_the_driver_at_once(autojump_clock):
    succession, attempt, attempts, driver = _retiring(released=True)
    began = trio.current_time()
    await succession.retire(SimpleNamespace(generation=1), attempt, driver)
    assert len(attempts.stops) == 1
    assert trio.current_time() == began
    assert driver.wake.is_set()
