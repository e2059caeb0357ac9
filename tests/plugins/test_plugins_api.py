"""The public plugin API: what ``ficc_core`` exports, and that plugins use nothing else."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ficc_core
from ficc_core import plugins, schema

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = sorted(
    [
        *ROOT.glob("adapters/*/ficc_adapter_*/**/*.py"),
        *ROOT.glob("executors/*/ficc_executor_*/**/*.py"),
    ]
)


@pytest.mark.parametrize("name", ficc_core.__all__)
def test_every_public_name_resolves(name):
    assert getattr(ficc_core, name) is not None


def test_public_names_are_the_objects_core_uses():
    assert ficc_core.hookimpl is plugins.hookimpl
    assert ficc_core.AdapterRegistry is plugins.AdapterRegistry
    assert ficc_core.Job is schema.Job
    assert ficc_core.Specification is schema.Specification


def test_the_data_model_is_re_exported():
    assert set(schema.__all__) - set(ficc_core.__all__) <= {
        "SchemaError",
        "canonical_json",
        "digest",
        "structure",
        "unstructure",
    }


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError):
        ficc_core.no_such_name  # noqa: B018


def test_importing_ficc_core_is_cheap():
    code = (
        "import sys, ficc_core; "
        "print(sorted(m for m in ('pluggy', 'attrs', 'cattrs', 'ficc_core.schema', "
        "'ficc_core.plugins') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_there_are_plugin_sources_to_check():
    assert len(PLUGIN_SOURCES) >= 10


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_builtin_plugins_import_only_public_ficc_core_names(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("ficc_core."), f"{path}: import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("ficc_core."):
                pytest.fail(f"{path}: from {node.module} import ...")
            if node.module == "ficc_core":
                private = [a.name for a in node.names if a.name not in ficc_core.__all__]
                assert not private, f"{path}: from ficc_core import {private}"


def test_no_module_level_plugin_manager_exists():
    import pluggy

    assert not any(isinstance(value, pluggy.PluginManager) for value in vars(plugins).values())
