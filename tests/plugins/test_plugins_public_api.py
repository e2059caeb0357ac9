"""Plugins use only public names: ``ficc_core.__all__`` and the kits of ``ficc_core.testing``.

``lint-imports`` (make lint) checks the same by module for every built-in plugin
distribution; these tests check the *names*, which an import graph does not show, and
that the contract's list of private modules misses none.
"""

from __future__ import annotations

import ast
import pkgutil
import tomllib
from pathlib import Path

import pytest

import ficc_core
import ficc_core.testing

ROOT = Path(__file__).resolve().parents[2]
#: Every plugin distribution of this repository: its import package, beside its tests/.
PLUGIN_PACKAGES = sorted(
    path
    for pattern in (
        "adapters/*/ficc_*",
        "executors/*/ficc_*",
        "runtimes/*/ficc_*",
        "plugins-*/ficc_*",
    )
    for path in ROOT.glob(pattern)
    if path.is_dir() and not path.name.endswith(".egg-info")
)
PACKAGE_SOURCES = sorted(source for package in PLUGIN_PACKAGES for source in package.rglob("*.py"))
EXAMPLE_TEST_SOURCES = sorted((ROOT / "plugins-example").glob("tests/**/*.py"))
PUBLIC_MODULES = {"ficc_core", "ficc_core.testing"}


def ficc_core_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every import of ficc_core or below it; name None for ``import m``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "ficc_core"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "ficc_core":
                found += [(node.module, a.name) for a in node.names]
    return found


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_there_are_plugin_sources_to_check():
    assert {package.name for package in PLUGIN_PACKAGES} >= {
        "ficc_adapter_llama_cpp",
        "ficc_adapter_ollama",
        "ficc_adapter_vllm",
        "ficc_executor_process",
        "ficc_executor_container",
        "ficc_llama_server",
        "ficc_example_sglang",
    }
    assert len(EXAMPLE_TEST_SOURCES) >= 3


@pytest.mark.parametrize("path", PACKAGE_SOURCES, ids=_relative)
def test_a_plugin_package_imports_only_ficc_core_public_names(path):
    for module, name in ficc_core_imports(path):
        assert module == "ficc_core" and name in ficc_core.__all__, (
            f"{path}: imports {module}.{name}, which is not in ficc_core.__all__"
        )


@pytest.mark.parametrize("path", EXAMPLE_TEST_SOURCES, ids=_relative)
def test_the_example_tests_import_only_ficc_core_and_its_testing_kit(path):
    public = {
        "ficc_core": set(ficc_core.__all__),
        "ficc_core.testing": set(ficc_core.testing.__all__),
    }
    for module, name in ficc_core_imports(path):
        assert module in public and (name is None or name in public[module]), (
            f"{path}: imports {module}.{name}, which is not public"
        )


def test_the_plugin_contract_names_every_plugin_and_forbids_every_private_module():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    linter = settings["tool"]["importlinter"]
    (contract,) = [c for c in linter["contracts"] if c["id"] == "plugins-public"]
    plugins = {package.name for package in PLUGIN_PACKAGES}
    assert set(contract["source_modules"]) == plugins
    assert plugins < set(linter["root_packages"])
    children = {f"ficc_core.{m.name}" for m in pkgutil.iter_modules(ficc_core.__path__)}
    assert set(contract["forbidden_modules"]) == children - PUBLIC_MODULES
