"""`ficc plugins`: a table (or JSON) of what was discovered, and why anything was refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from ficc_core.cli.plugins import plugins_command, render_table
from ficc_core.plugins import DISABLE_AUTOLOAD_ENV, PluginRecord

BUILTIN_ROWS = [
    ["llama_cpp", "adapter", "ficc-adapter-llama-cpp", "0.1.0", "1", "loaded"],
    ["ollama", "adapter", "ficc-adapter-ollama", "0.1.0", "1", "loaded"],
    ["vllm", "adapter", "ficc-adapter-vllm", "0.1.0", "1", "loaded"],
    ["container", "executor", "ficc-executor-container", "0.1.0", "1", "loaded"],
    ["process", "executor", "ficc-executor-process", "0.1.0", "1", "loaded"],
    ["llama_server", "runtime", "ficc-llama-server", "0.1.0", "1", "loaded"],
]


def test_plugins_command_lists_the_builtin_plugins(monkeypatch):
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    result = CliRunner().invoke(plugins_command, [])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()]
    assert rows[0] == ["NAME", "KIND", "DISTRIBUTION", "VERSION", "API", "STATUS"]
    for row in BUILTIN_ROWS:
        assert row in rows[1:]


def test_plugins_command_prints_json(monkeypatch):
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)
    result = CliRunner().invoke(plugins_command, ["--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["autoload"] is True
    vllm = next(p for p in report["plugins"] if p["name"] == "vllm")
    assert vllm == {
        "name": "vllm",
        "kind": "adapter",
        "plugin": "vllm",
        "distribution": "ficc-adapter-vllm",
        "version": "0.1.0",
        "api_version": 1,
        "status": "loaded",
        "reason": None,
    }


def test_plugins_command_says_when_autoloading_is_off(monkeypatch):
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    result = CliRunner().invoke(plugins_command, ["--json"])
    assert result.exit_code == 0
    assert json.loads(result.output) == {"autoload": False, "plugins": [], "runtimes": []}


def test_plugins_command_runs_as_a_real_process():
    env = {k: v for k, v in os.environ.items() if k != DISABLE_AUTOLOAD_ENV}
    result = subprocess.run(
        [sys.executable, "-c", "from ficc_core.cli.plugins import plugins_command as c; c()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    for row in BUILTIN_ROWS:
        assert row in rows


def test_table_keeps_the_whole_refusal_reason_in_the_last_column():
    records = [
        PluginRecord("vllm", "adapter", "vllm", "ficc-adapter-vllm", "0.1.0", 1, "loaded"),
        PluginRecord(
            "bad",
            "plugin",
            "bad",
            None,
            None,
            None,
            "refused",
            "plugin 'bad' failed to import",
        ),
    ]
    assert render_table(records).splitlines() == [
        "NAME  KIND     DISTRIBUTION       VERSION  API  STATUS",
        "vllm  adapter  ficc-adapter-vllm  0.1.0    1    loaded",
        "bad   plugin   -                  -        -    refused: plugin 'bad' failed to import",
    ]


def test_table_of_nothing_says_so():
    assert render_table([]) == "No plugins found."
