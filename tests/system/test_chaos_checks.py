"""The soak's request invariant (bench/chaos_checks.py): a 500 is a defect, not a refusal."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos_checks.py"


def _checks():
    spec = importlib.util.spec_from_file_location("chaos_checks", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chaos_checks", module)
    spec.loader.exec_module(module)
    return module


def _outcome(cc, result: str, code: str = ""):
    return cc.Outcome("chat", "project", "ctl-a", 1.0, 2.0, result, code)


def test_refusals_by_design_hold_and_an_internal_error_fails_the_invariant():
    cc = _checks()
    designed = [_outcome(cc, cc.ANSWERED), _outcome(cc, cc.REFUSED, "no_ready_replica")]
    assert cc.check_requests(designed).held
    verdict = cc.check_requests([*designed, _outcome(cc, cc.REFUSED, "internal_error")])
    assert not verdict.held
    assert "1 internal errors" in verdict.summary
    assert any("internal_error" in line for line in verdict.details)
