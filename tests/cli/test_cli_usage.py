"""`ficc usage` against a live controller: client options, units, times it accepts."""

from __future__ import annotations

import datetime as dt
import json
import time

from click.testing import CliRunner

from ficc_core.cli.main import cli

ENV = {"FICC_URL": None, "FICC_TOKEN": None, "FICC_DATA_DIR": None, "FICC_CONFIG": None}


def _usage(live_server, *args: str):
    argv = ["usage", "--url", live_server.url, "--token", live_server.bootstrap["token"], *args]
    return CliRunner().invoke(cli, argv, env=ENV)


def test_usage_help_offers_the_client_options_not_the_data_directory():
    result = CliRunner().invoke(cli, ["usage", "--help"], env=ENV)
    assert result.exit_code == 0, result.output
    assert "--url" in result.output and "--token" in result.output
    assert "--data-dir" not in result.output and "--config" not in result.output
    assert "TIME" in result.output  # --since/--until say what they take


def test_every_usage_column_says_its_unit(live_server):
    result = _usage(live_server)
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0].split("  ")
    header = [cell.strip() for cell in header if cell.strip()]
    assert header == [
        "REQUESTS",
        "ERRORS",
        "PROMPT TOKENS",
        "COMPLETION TOKENS",
        "SPEND (UNITS)",
        "P50 (S)",
        "P90 (S)",
        "P99 (S)",
        "TTFB P50 (S)",
        "BY CODE",
    ]
    assert "latency in seconds, spend in the pricing setting's units" in result.stderr


def test_since_and_until_take_iso_dates_times_and_durations_ago(live_server):
    def window(*args: str) -> tuple[float, float]:
        result = _usage(live_server, *args, "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        return report["since"], report["until"]

    midnight = dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
    assert window("--since", "2026-12-01", "--until", "2026-12-01T09:30Z") == (
        midnight,
        midnight + 9.5 * 3600,
    )
    # An offset is honoured; a time without one is UTC.
    assert window("--since", "2026-12-01T10:00+01:00", "--until", "2026-12-01T10:00") == (
        midnight + 9 * 3600,
        midnight + 10 * 3600,
    )
    # Epoch seconds as before.
    assert window("--since", "1764547200", "--until", "1764547300.5") == (
        1764547200.0,
        1764547300.5,
    )
    before = time.time()
    since, _ = window("--since", "2h")
    assert before - 7200 - 1 <= since <= time.time() - 7200
    since, _ = window("--since", "7d")
    assert before - 7 * 86400 - 1 <= since <= time.time() - 7 * 86400


def test_a_time_usage_cannot_read_is_a_usage_error_saying_what_it_takes(live_server):
    result = _usage(live_server, "--since", "yesterday")
    assert result.exit_code == 2
    assert "'yesterday' is not a time" in result.stderr
    assert "ISO 8601" in result.stderr and "2h, 7d" in result.stderr
