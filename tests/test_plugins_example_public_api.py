"""plugins-example uses only public names: ``ficc_core.__all__`` and ``ficc_core.testing``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ficc_core
import ficc_core.testing

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "plugins-example"
PACKAGE_SOURCES = sorted(EXAMPLE.glob("ficc_example_sglang/**/*.py"))
TEST_SOURCES = sorted(EXAMPLE.glob("tests/**/*.py"))


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


def test_there_are_example_sources_to_check():
    assert len(PACKAGE_SOURCES) >= 3 and len(TEST_SOURCES) >= 3


@pytest.mark.parametrize("path", PACKAGE_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_example_package_imports_only_ficc_core_public_names(path):
    for module, name in ficc_core_imports(path):
        assert module == "ficc_core" and name in ficc_core.__all__, (
            f"{path}: imports {module}.{name}, which is not in ficc_core.__all__"
        )


@pytest.mark.parametrize("path", TEST_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_example_tests_import_only_ficc_core_and_its_testing_kit(path):
    public = {
        "ficc_core": set(ficc_core.__all__),
        "ficc_core.testing": set(ficc_core.testing.__all__),
    }
    for module, name in ficc_core_imports(path):
        assert module in public and (name is None or name in public[module]), (
            f"{path}: imports {module}.{name}, which is not public"
        )
