"""Installed, the distribution is discovered by ``ficc plugins`` and its adapter loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

DISTRIBUTION = "ficc-example-sglang"


def ficc_plugins_json() -> dict:
    env = {key: value for key, value in os.environ.items() if key != "FICC_DISABLE_PLUGIN_AUTOLOAD"}
    result = subprocess.run(
        [sys.executable, "-m", "ficc_core", "plugins", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    return json.loads(result.stdout)


def test_ficc_plugins_lists_the_sglang_adapter_from_this_distribution():
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pytest.fail(f"{DISTRIBUTION} is not installed: pip install it (see README.md)")
    report = ficc_plugins_json()
    [record] = [p for p in report["plugins"] if p["name"] == "sglang" and p["kind"] == "adapter"]
    assert record == {
        "api_version": 1,
        "distribution": DISTRIBUTION,
        "kind": "adapter",
        "name": "sglang",
        "plugin": "sglang",
        "reason": None,
        "status": "loaded",
        "version": version,
    }


def test_the_plugin_module_declares_api_version_1_and_registers_through_the_hook():
    from ficc_example_sglang import plugin

    added = []

    class Registry:
        def add(self, name, factory):
            added.append((name, factory))

    assert plugin.API_VERSION == 1
    plugin.ficc_register_adapters(registry=Registry())
    assert [name for name, _ in added] == ["sglang"]
