"""The process provider passes the executor conformance kit, check by check."""

from __future__ import annotations

import pytest
import trio

from ficc_core.testing import executor_kit as kit


@pytest.mark.parametrize("check", kit.CHECKS, ids=lambda check: check.__name__)
async def test_conformance(provider, check):
    with trio.fail_after(90):
        await check(provider)
