"""Fixtures only the tests of tests/gateway/ use (shared ones are in tests/conftest.py)."""

import pytest
import trio.testing


@pytest.fixture
def idle_clock() -> trio.testing.MockClock:
    """A trio clock that follows real time until ``gateway_env(..., clock=idle_clock)`` is
    up; from then on it jumps to the next deadline whenever the process has been idle
    for a tenth of a real second: a stalled engine's timeout passes at once, a healthy
    engine answers long before any bound. (Jumping while the controller opens would
    skip a guard's deadline during its thread work.)"""
    return trio.testing.MockClock(rate=1.0)
