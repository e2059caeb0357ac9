"""The Grafana dashboard and the Prometheus alert rules in docs/monitoring/: valid for
``promtool`` (Debian's prometheus package), and naming only metrics the controller
exports; the metrics reference in docs/monitoring.md is current."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ficc_core.devtools.docs_metrics import DOC, rendered
from ficc_core.metrics import Metrics

MONITORING = Path(__file__).resolve().parents[1] / "docs" / "monitoring"
RULES = MONITORING / "ficc-alerts.yml"
DASHBOARD = MONITORING / "ficc-dashboard.json"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool must run in CI (.ci/run installs Debian's prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def _check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def _exported() -> set[str]:
    """Every sample name the controller's registry can produce."""
    names = set()
    for collector in Metrics().registry._collector_to_names:
        base, kind = collector._name, collector._type
        if kind == "counter":
            names |= {base + "_total", base + "_created"}
        elif kind == "histogram":
            names |= {base + "_bucket", base + "_sum", base + "_count"}
        else:
            names.add(base)
    return names


def _named(expr: str) -> set[str]:
    return set(re.findall(r"\b(ficc_[a-z_]+)", expr))


def test_the_alert_rules_pass_promtool():
    checked = _check(RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout


def test_every_dashboard_query_parses(tmp_path):
    # Grafana's variables become what they stand for, then each query is a recording
    # rule: promtool parses every one with Prometheus' own parser.
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for number, expr in enumerate(_queries()):
        concrete = expr.replace("$__rate_interval", "5m").replace("$alias", ".*")
        rules["groups"][0]["rules"].append(
            {"record": f"ficc:dashboard:q{number}", "expr": concrete}
        )
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    checked = _check(path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rules_and_the_dashboard_name_only_exported_metrics():
    exported = _exported()
    named = _named(RULES.read_text())
    for expr in _queries():
        named |= _named(expr)
    assert named and named <= exported, sorted(named - exported)


def test_the_metrics_reference_is_current():
    text = DOC.read_text(encoding="utf-8")
    assert text == rendered(text), "run `python -m ficc_core.devtools.docs_metrics`"
