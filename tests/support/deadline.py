"""A deadline for every trio test: a hang fails in seconds, naming the marker to raise.

Each trio test (setup of its trio fixtures, the test, their teardown) runs under a
cancel scope of ``DEFAULT_SECONDS``; a test that needs longer says so with
``@pytest.mark.deadline(SECONDS)`` (on the test, its class or its module's
``pytestmark``). The bound is wall-clock time, kept by a timer thread: a trio deadline
would be the next one an ``autojump_clock`` jumps to whenever every task waits on a
thread (a store's query, say), so a virtual bound would fire at once there.

``tests/conftest.py`` applies it to the tests under tests/; as a pytest plugin
(``-p tests.support.deadline``) it applies to every test of a run.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest
import trio

DEFAULT_SECONDS = 10.0
MARKER = "deadline"
BOUNDED = "_ficc_deadline"  # set on the runs this module made


class DeadlineExceeded(Exception):
    """A trio test ran past its deadline (and was cancelled there)."""


def deadline_of(item: pytest.Item) -> float:
    """The item's bound in seconds: its closest ``deadline`` marker's, else the default."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return DEFAULT_SECONDS
    seconds = marker.args[0] if marker.args else marker.kwargs.get("seconds")
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.deadline takes positive seconds")
    return float(seconds)


def bounded_run(
    nodeid: str, seconds: float, inner: Callable[..., Any] = trio.run
) -> Callable[..., Any]:
    """A ``run`` for pytest-trio's ``trio`` marker: ``inner`` (``trio.run``) in the deadline."""

    def run(async_fn: Callable[[], Awaitable[Any]], **run_kwargs: Any) -> Any:
        async def bounded() -> Any:
            cause: BaseException | None = None
            scope = trio.CancelScope()
            timer = threading.Timer(
                seconds, _cancel_from_thread, (trio.lowlevel.current_trio_token(), scope)
            )
            timer.daemon = True
            timer.start()
            try:
                with scope:
                    try:
                        result = await async_fn()
                    except BaseException as error:
                        cause = error  # where the test was when the deadline came
                        raise
                if not scope.cancel_called:
                    return result  # (a test that ended past it without a checkpoint fails)
            except BaseException as error:
                if scope.cancel_called:
                    raise DeadlineExceeded(_message(nodeid, seconds)) from error
                raise
            finally:
                timer.cancel()
            raise DeadlineExceeded(_message(nodeid, seconds)) from cause

        return inner(bounded, **run_kwargs)

    setattr(run, BOUNDED, True)
    return run


def _cancel_from_thread(token: trio.lowlevel.TrioToken, scope: trio.CancelScope) -> None:
    try:
        token.run_sync_soon(scope.cancel)
    except trio.RunFinishedError:
        pass  # the test ended meanwhile


def _message(nodeid: str, seconds: float) -> str:
    default = " (the default for every trio test)" if seconds == DEFAULT_SECONDS else ""
    return (
        f"{nodeid} ran past its deadline of {seconds:g} s{default} and was "
        f"cancelled there. If it hangs, the traceback above says where; if it needs longer, "
        f"mark it @pytest.mark.{MARKER}(SECONDS)."
    )


def pytest_configure(config: pytest.Config) -> None:
    if any(line.startswith(f"{MARKER}(") for line in config.getini("markers")):
        return  # registered in pyproject.toml already
    config.addinivalue_line(
        "markers",
        f"{MARKER}(seconds): the trio test's bound, raised from the default "
        f"{DEFAULT_SECONDS:g} s (wall-clock time)",
    )


@pytest.hookimpl(trylast=True)  # after pytest-trio marked the async tests as trio tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    apply(items)


def apply(items: Iterable[pytest.Item]) -> None:
    """Run each of ``items`` that is a trio test under its deadline."""
    for item in items:
        runs = [m.kwargs["run"] for m in item.iter_markers("trio") if "run" in m.kwargs]
        if item.get_closest_marker("trio") is None or getattr(
            runs[0] if runs else None, BOUNDED, 0
        ):
            continue
        if hasattr(getattr(item, "obj", None), "hypothesis"):
            continue  # pytest-trio runs Hypothesis's inner test with plain trio.run
        run = bounded_run(item.nodeid, deadline_of(item), runs[0] if runs else trio.run)
        # pytest-trio takes the first ``run`` it meets, the item's own markers first.
        item.own_markers.insert(0, pytest.mark.trio(run=run).mark)
