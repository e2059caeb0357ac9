"""The deadline every trio test runs under (tests/support/deadline.py), in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from . import deadline

ROOT = Path(__file__).resolve().parents[2]

SUITE = """
import time

import pytest
import trio


async def test_hangs():
    await trio.sleep_forever()


@pytest.mark.deadline(1)
async def test_hangs_under_an_autojump_clock(autojump_clock):
    await trio.sleep_forever()


@pytest.mark.deadline(1)
async def test_waits_on_a_thread_under_an_autojump_clock(autojump_clock):
    await trio.to_thread.run_sync(time.sleep, 0.3)  # a virtual bound would fire at once


@pytest.mark.deadline(1)
async def test_sleeps_for_virtual_hours(autojump_clock):
    await trio.sleep(7200)


@pytest.mark.deadline(0.5)
async def test_takes_a_second_marked_half(autojump_clock):
    await trio.to_thread.run_sync(time.sleep, 1)


@pytest.mark.deadline(1)
async def test_hangs_in_a_fixtures_teardown(hanging_teardown):
    pass


@pytest.fixture
async def hanging_teardown():
    yield
    await trio.sleep_forever()


def test_not_a_trio_test():
    time.sleep(0.1)
"""


def _run(tmp_path: Path) -> str:
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.support.deadline",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-o",
            "trio_mode=true",
            "--rootdir",
            str(tmp_path),
            "-rA",
            "test_suite.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


def test_a_hanging_trio_test_fails_at_the_deadline_naming_the_marker(tmp_path):
    began = time.monotonic()
    out = _run(tmp_path)
    assert time.monotonic() - began < 60, out
    assert "FAILED test_suite.py::test_hangs - " in out, out
    assert "test_suite.py::test_hangs ran past its deadline of 10 s (the default" in out, out
    assert "mark it @pytest.mark.deadline(SECONDS)" in out, out
    assert "trio.Cancelled" in out, out  # where the test was: the traceback of its await
    # A marked bound is the one that holds, in wall-clock time (whatever trio's clock).
    assert "FAILED test_suite.py::test_hangs_under_an_autojump_clock - " in out, out
    assert "PASSED test_suite.py::test_waits_on_a_thread_under_an_autojump_clock" in out, out
    assert "PASSED test_suite.py::test_sleeps_for_virtual_hours" in out, out
    assert "FAILED test_suite.py::test_takes_a_second_marked_half - " in out, out
    assert "past its deadline of 0.5 s and was cancelled" in out, out
    # It covers the trio fixtures' teardown too; a plain test has none.
    assert "FAILED test_suite.py::test_hangs_in_a_fixtures_teardown - " in out, out
    assert "PASSED test_suite.py::test_not_a_trio_test" in out, out
    assert "4 failed, 3 passed" in out, out


async def test_a_trio_test_here_runs_under_the_default_deadline(request, autojump_clock):
    """tests/conftest.py gives every trio test under tests/ the default deadline."""
    runs = [m.kwargs["run"] for m in request.node.iter_markers("trio") if "run" in m.kwargs]
    assert getattr(runs[0], deadline.BOUNDED)  # the run pytest-trio takes: the first
    assert deadline.deadline_of(request.node) == deadline.DEFAULT_SECONDS == 10.0
    await trio.sleep(3600)  # virtual: the deadline is wall-clock time


@pytest.mark.deadline(60)
async def test_a_marked_trio_test_here_runs_under_its_own(request, autojump_clock):
    assert deadline.deadline_of(request.node) == 60.0
    await trio.sleep(30)
