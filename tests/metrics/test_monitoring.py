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

from ficc_core.controller.metrics import Metrics
from ficc_core.devtools.docs_metrics import DOC, rendered

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
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


def _minutes(present) -> str:
    """A promtool series' values for 31 minutes: 1 where ``present(minute)``, else stale."""
    return " ".join("1" if present(minute) else "stale" for minute in range(31))


def test_the_alerts_fire_for_what_they_say_and_name_services_by_alias(tmp_path):
    # chat runs (degraded): replica 0 loads for half an hour, replica 1 crash-loops
    # (failed two minutes, loading one, again and again), replica 2 is unknown. It fails
    # half its requests and they wait 5-10 s for a slot. idle is stopped, its replica
    # failed: nothing about it fires.
    chat = {"service": "svc_1", "alias": "chat", "instance": "c1"}
    replica = {**chat, "node": "n1"}
    series = [
        _series("ficc_service_state", "1x30", **chat, project="p", state="degraded"),
        _series("ficc_replica_state", "1x30", **replica, index="0", state="loading"),
        _series(
            "ficc_replica_state",
            _minutes(lambda m: m % 3 < 2),
            **replica,
            index="1",
            state="failed",
        ),
        _series(
            "ficc_replica_state",
            _minutes(lambda m: m % 3 == 2),
            **replica,
            index="1",
            state="loading",
        ),
        _series("ficc_replica_state", "1x30", **replica, index="2", state="unknown"),
        _series("ficc_gateway_requests_total", "0+60x30", **chat, replica="a"),
        _series("ficc_gateway_errors_total", "0+30x30", **chat, replica="a", code="engine_failed"),
        _series("ficc_gateway_queue_wait_seconds_bucket", "0x30", **chat, le="5"),
        _series("ficc_gateway_queue_wait_seconds_bucket", "0+60x30", **chat, le="10"),
        _series("ficc_gateway_queue_wait_seconds_bucket", "0+60x30", **chat, le="+Inf"),
    ]
    idle = {"service": "svc_2", "alias": "idle", "instance": "c1"}
    series += [
        _series("ficc_service_state", "1x30", **idle, project="p", state="stopped"),
        _series("ficc_replica_state", "1x30", **idle, node="n1", index="0", state="failed"),
    ]
    show = "See `ficc inference show chat` and `ficc inference logs chat --replica {index}`."

    def replica_alert(index: str, severity: str, summary: str, **extra: str) -> dict:
        return {
            "exp_labels": {
                "severity": severity,
                "service": "svc_1",
                "alias": "chat",
                "node": "n1",
                "index": index,
                **extra,
            },
            "exp_annotations": {"summary": summary, "description": show.format(index=index)},
        }

    not_ready = "Replica {} of chat on n1 has not been ready for 10 minutes"
    tests = [
        {"alertname": "FiccReplicaNotReady", "eval_time": "9m", "exp_alerts": []},
        {
            "alertname": "FiccReplicaNotReady",
            "eval_time": "20m",
            "exp_alerts": [
                replica_alert("0", "warning", not_ready.format(0)),
                replica_alert("1", "warning", not_ready.format(1)),
            ],
        },
        {
            "alertname": "FiccReplicaDown",
            "eval_time": "20m",
            "exp_alerts": [
                replica_alert(
                    "2", "critical", "Replica 2 of chat on n1 is unknown", state="unknown"
                )
            ],
        },
        {
            "alertname": "FiccServiceErrorRate",
            "eval_time": "20m",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "warning", "service": "svc_1", "alias": "chat"},
                    "exp_annotations": {
                        "summary": "More than 5% of requests to service chat fail",
                        "description": "See `ficc usage --service chat --since 1h`, the access "
                        "log and `ficc inference logs chat`.",
                    },
                }
            ],
        },
        {
            "alertname": "FiccQueueWait",
            "eval_time": "20m",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "warning", "service": "svc_1", "alias": "chat"},
                    "exp_annotations": {
                        "summary": "Requests to chat wait over 5 s for a replica slot (p95)"
                    },
                }
            ],
        },
    ]
    shutil.copy(RULES, tmp_path / RULES.name)
    unit = {
        "rule_files": [RULES.name],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}],
    }
    (tmp_path / "alerts-test.yml").write_text(json.dumps(unit))
    checked = subprocess.run(
        [_promtool(), "test", "rules", "alerts-test.yml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
