"""The one way tests wait for something to become true: :func:`eventually`.

A fixed sleep is either too short on a loaded machine or wasted time on an idle one;
polling a condition with a bound is neither.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import trio


async def eventually(
    check: Callable[[], Any],
    seconds: float | None = 5.0,
    *,
    until: Callable[[Any], Any] | None = None,
    every: float = 0.01,
) -> Any:
    """Call ``check()`` (plain or async) until what it returns holds; return that value.

    It holds when it is true, or, given ``until``, when ``until(value)`` is true. Fails with
    :class:`trio.TooSlowError` after ``seconds`` (``None``: bounded only by the caller's own
    bound or the test's deadline). Polls every ``every`` seconds.
    """
    with trio.fail_after(seconds) if seconds is not None else _unbounded():
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if until(value) if until is not None else value:
                return value
            await trio.sleep(every)


def _unbounded() -> trio.CancelScope:
    return trio.CancelScope()
