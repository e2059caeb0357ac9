"""The layout rules `make lint` runs (ficc_core/devtools/layout.py), each shown failing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ficc_core.devtools import layout

PYPROJECT = """
[[tool.importlinter.contracts]]
id = "layers"
type = "layers"
layers = ["api", "gateway : inference", "store | routing", "base"]

[tool.ficc.layout]
top_level = ["__init__.py", "api", "gateway", "inference", "store", "routing", "base"]
max_lines = 20

[tool.ficc.layout.long_modules]
"ficc_core/inference/big.py" = "one table read top to bottom"
"""


def _write(root: Path, relative: str, text: str = "") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small tree that keeps every rule."""
    _write(tmp_path, "pyproject.toml", PYPROJECT)
    for package in ("api", "gateway", "inference", "store", "routing", "base"):
        _write(tmp_path, f"ficc_core/{package}/__init__.py")
    _write(tmp_path, "ficc_core/__init__.py")
    _write(tmp_path, "ficc_core/inference/repository.py", "QUERY = 1\n")
    _write(tmp_path, "ficc_core/inference/manager.py", "from .repository import QUERY\n")
    _write(tmp_path, "ficc_core/inference/big.py", "x = 1\n" * 30)
    return tmp_path


def test_the_tree_as_committed_keeps_every_rule():
    assert [str(f) for f in layout.check()] == []


def test_a_planted_tree_that_keeps_the_rules_has_no_finding(tree):
    assert layout.check(tree) == []


def test_a_new_module_at_the_top_fails_and_says_where_it_goes(tree):
    _write(tree, "ficc_core/helpers.py", "x = 1\n")
    findings = {f.rule: f for f in layout.check(tree)}
    # A module at the top is also in no layer: both say so.
    assert set(findings) == {"top-level", "layered"}
    assert findings["top-level"].where == "ficc_core/helpers.py"
    assert "move it into the package that owns it" in findings["top-level"].message


def test_a_package_in_no_layer_fails(tree):
    _write(tree, "pyproject.toml", PYPROJECT.replace('"store | routing"', '"store"'))
    [finding] = layout.check(tree)
    assert finding.rule == "layered" and finding.where == "ficc_core/routing"
    assert 'id = "layers"' in finding.message


@pytest.mark.parametrize(
    "statement",
    [
        "from ficc_core.inference.repository import QUERY\n",
        "from ..inference.repository import QUERY\n",
        "from ..inference import repository\n",
        "import ficc_core.inference.repository\n",
    ],
)
def test_a_repository_imported_from_another_package_fails(tree, statement):
    _write(tree, "ficc_core/gateway/relay.py", "x = 1\n" + statement)
    [finding] = layout.check(tree)
    assert finding.rule == "repository"
    assert finding.where == "ficc_core/gateway/relay.py:2"
    assert "ficc_core.inference.repository" in finding.message
    assert "ficc_core.inference" in finding.message


def test_a_long_module_needs_a_reason_and_a_stale_reason_fails(tree):
    _write(tree, "ficc_core/gateway/relay.py", "x = 1\n" * 21)
    _write(tree, "ficc_core/inference/big.py", "x = 1\n")
    findings = {f.where: f for f in layout.check(tree)}
    assert set(findings) == {"ficc_core/gateway/relay.py", "ficc_core/inference/big.py"}
    assert "has 21 lines, over 20" in findings["ficc_core/gateway/relay.py"].message
    assert "stale" in findings["ficc_core/inference/big.py"].message


def test_main_prints_each_finding_and_fails(tree, monkeypatch, capsys):
    _write(tree, "ficc_core/helpers.py", "x = 1\n")
    monkeypatch.setattr(layout, "ROOT", tree)
    monkeypatch.setattr(layout.check, "__defaults__", (tree,))
    assert layout.main() == 1
    out = capsys.readouterr().out
    assert "ficc_core/helpers.py: [top-level]" in out and "2 layout finding(s)" in out
