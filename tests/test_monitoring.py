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
            names.add(base + "_total")
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


def _give_a_sample(collector) -> None:
    """One sample of every family: a counter counts, a histogram observes, a gauge is set."""
    labels = ["x"] * len(collector._labelnames)
    child = collector.labels(*labels) if labels else collector
    if collector._type == "counter":
        child.inc()
    elif collector._type == "histogram":
        child.observe(1.0)
    else:
        child.set(1.0)


def test_a_scrape_has_only_the_documented_families_and_no_created_series():
    metrics = Metrics()
    for collector in metrics.registry._collector_to_names:
        _give_a_sample(collector)
    text = metrics.render()[0].decode()
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    documented = set(re.findall(r"^\| `(ficc_[a-z_]+)`", DOC.read_text(encoding="utf-8"), re.M))
    assert "_created" not in text
    # A counter's family is named without _total in the text format.
    assert {f + "_total" if f + "_total" in documented else f for f in families} == documented
    assert set(re.findall(r"^(ficc_[a-z_]+)[{ ]", text, re.M)) <= _exported()


def test_the_metrics_reference_is_current():
    text = DOC.read_text(encoding="utf-8")
    assert text == rendered(text), "run `python -m ficc_core.devtools.docs_metrics`"


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    shown = ",".join(f'{key}="{value}"' for key, value in {**labels, "job": "ficc"}.items())
    return {"series": f"{name}{{{shown}}}", "values": values}


def _two_services() -> list[dict[str, str]]:
    """Two services (aliases chat and code), each with one replica that served: the series
    a controller exports for them, as Prometheus stores them (instance and job added)."""
    series = []
    for service, alias in (("svc_1", "chat"), ("svc_2", "code")):
        ident = {"service": service, "instance": "c1"}
        replica = {**ident, "replica": f"{service}.r0.g1.a1"}
        series += [
            _series("ficc_service_state", "1x10", **ident, alias=alias, project="p", state="ready"),
            _series("ficc_replica_info", "1x10", **replica, alias=alias, index="0", node="local"),
            _series("ficc_gateway_requests_total", "0+60x10", **replica),
            _series("ficc_gateway_errors_total", "0+60x10", **replica, code="rate_limited"),
            _series("ficc_gateway_inflight_requests", "1x10", **replica),
            _series("ficc_gateway_engine_running_requests", "1x10", **replica),
            _series("ficc_gateway_engine_waiting_requests", "1x10", **replica),
            _series("ficc_gateway_engine_kv_cache_usage_ratio", "0.5x10", **replica),
        ]
        for kind in ("prompt", "completion"):
            series.append(_series("ficc_gateway_tokens_total", "0+60x10", **replica, kind=kind))
        for name, labels in (
            ("ficc_gateway_queue_wait_seconds", ident),
            ("ficc_gateway_time_to_first_byte_seconds", replica),
            ("ficc_gateway_output_tokens_per_second", replica),
            ("ficc_gateway_request_duration_seconds", replica),
        ):
            for le in ("0.1", "+Inf"):
                series.append(_series(f"{name}_bucket", "0+60x10", **labels, le=le))
    return series


def test_every_per_service_panel_shows_only_the_chosen_aliases_by_alias(tmp_path):
    # The Service variable ($alias) set to one of two services: every panel about the
    # gateway's requests shows that service alone, named by its alias (one series per
    # alias, or per alias and token kind), never the other or a service ID.
    panels = [
        (panel["title"], target)
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel["targets"]
        if "ficc_gateway_" in target["expr"]
    ]
    assert len(panels) >= 12
    tests = []
    for title, target in panels:
        assert "{{service}}" not in target["legendFormat"], title
        assert "{{alias}}" in target["legendFormat"], title
        assert '$alias"' in target["expr"], title
        concrete = target["expr"].replace("$__rate_interval", "5m").replace("$alias", "chat")
        tests.append(
            {
                "expr": f"count by (alias) ({concrete})",
                "eval_time": "10m",
                "exp_samples": [
                    {
                        "labels": '{alias="chat"}',
                        "value": 2 if "ficc_gateway_tokens_total" in concrete else 1,
                    }
                ],
            }
        )
    (tmp_path / "none.yml").write_text('{"groups": []}')
    unit = {
        "rule_files": ["none.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _two_services(), "promql_expr_test": tests}],
    }
    path = tmp_path / "dashboard-test.yml"
    path.write_text(json.dumps(unit))
    checked = subprocess.run(
        [_promtool(), "test", "rules", path.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
