"""The soak bench (bench/chaos_bench.py) for 3 minutes, as CI runs it (#46 item 7).

A real installation (PostgreSQL with two controllers where it is installed, SQLite
with one otherwise), real llama.cpp engines, mixed traffic and a seeded schedule of
faults; the bench exits 0 only when all six invariants held, and prints each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVARIANTS = (
    "every request answered or refused in the envelope",
    "usage records equal the requests answered",
    "no orphaned engine process",
    "no node over-committed",
    "every published blob verifies",
    "the event log explains every replica restart",
)


@pytest.mark.slow
def test_the_soak_bench_holds_every_invariant_for_three_minutes():
    seed = os.environ.get("FICC_CHAOS_SEED", "4")
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos_bench.py"), "--minutes", "3", "--seed", seed],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    print(output)
    # The schedule is printed first, every invariant is reported whatever its verdict.
    assert f"seed {seed}" in output and "schedule (offset, fault, lasting):" in output, output
    for invariant in INVARIANTS:
        assert f"] {invariant}:" in output, (invariant, output[-3000:])
    # The node's over-commit once seen here (#46: a replacement launched beside an engine
    # still stopping when its leader was lost) is fixed; no verdict is tolerated.
    assert "[FAILED]" not in output, output[-6000:]
    assert result.returncode == 0, output[-6000:]
    assert "RESULT: all invariants held" in output
