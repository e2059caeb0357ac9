"""docs/architecture.md's folder table (devtools/docs_layout.py) is current and derived."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ficc_core.devtools import docs_layout
from ficc_core.devtools.docs_ranges import update_page

PYPROJECT = """
[[tool.importlinter.contracts]]
id = "layers"
type = "layers"
layers = ["cli", "api", "gateway | inference", "store", "testing", "base"]

[[tool.importlinter.contracts]]
id = "gateway-inference"
type = "independence"
modules = ["ficc_core.gateway", "ficc_core.inference"]

[[tool.importlinter.contracts]]
id = "inference"
type = "layers"
containers = ["ficc_core.inference"]
layers = ["manager", "scaling", "specification", "records"]

[[tool.importlinter.contracts]]
id = "plugins-public"
type = "forbidden"
source_modules = ["ficc_adapter_x"]
forbidden_modules = ["ficc_core.cli", "ficc_core.api", "ficc_core.gateway",
                     "ficc_core.inference", "ficc_core.store", "ficc_core.base"]
"""


def _write(root: Path, relative: str, text: str = "") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _tree(root: Path) -> Path:
    _write(root, "pyproject.toml", PYPROJECT)
    for name in ("cli", "api", "gateway", "inference", "store", "testing", "base"):
        _write(root, f"ficc_core/{name}/__init__.py", f'"""The {name} package.\n\nMore."""\n')
    for name in ("scaling", "specification"):
        _write(root, f"ficc_core/inference/{name}/__init__.py", f'"""Owns {name}."""\n')
    _write(root, "ficc_core/inference/manager.py", '"""Operators\' requests."""\n')
    return root


def test_the_committed_page_is_current() -> None:
    current = docs_layout.PAGE.read_text(encoding="utf-8")
    wanted = update_page(current, docs_layout.render(), docs_layout.START, docs_layout.END)
    assert current == wanted, "run: python -m ficc_core.devtools.docs_layout"
    assert docs_layout.main(["--check"]) == 0


def test_a_row_per_package_owning_its_docstring_first_paragraph(tmp_path: Path) -> None:
    table = docs_layout.render(_tree(tmp_path))
    assert "| `gateway/` | The gateway package. |" in table
    assert "More." not in table
    assert "| `inference/scaling/` | Owns scaling. |" in table
    # Sub-packages follow their parent, in their contract's order; modules get no row.
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
    assert rows == [
        "| `cli/`",
        "| `api/`",
        "| `gateway/`",
        "| `inference/`",
        "| `inference/scaling/`",
        "| `inference/specification/`",
        "| `store/`",
        "| `testing/`",
        "| `base/`",
    ]


def test_a_changed_docstring_changes_the_table(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    before = docs_layout.render(root)
    _write(root, "ficc_core/store/__init__.py", '"""Every durable thing, in one transaction."""\n')
    after = docs_layout.render(root)
    assert before != after
    assert "| `store/` | Every durable thing, in one transaction. |" in after
    _write(root, "ficc_core/store/__init__.py", "")
    assert "| `store/` | (no docstring" in docs_layout.render(root)


def test_who_may_import_comes_from_the_contracts(tmp_path: Path) -> None:
    table = docs_layout.render(_tree(tmp_path))
    importers = {
        line.split(" | ")[0].removeprefix("| "): line.split(" | ")[2].removesuffix(" |")
        for line in table.splitlines()
        if line.startswith("| `")
    }
    assert importers["`cli/`"] == "none: it is the top"
    assert importers["`api/`"] == "`cli`"
    assert importers["`gateway/`"] == (
        "`cli`, `api`; never `inference` (independent: `gateway-inference`)"
    )
    assert importers["`inference/specification/`"] == (
        "in `inference`: `manager`, `scaling`; outside: `cli`, `api`; "
        "never `gateway` (independent: `gateway-inference`)"
    )
    assert importers["`store/`"] == (
        "every package but those below or beside it: `testing`, `base`"
    )
    assert importers["`testing/`"].endswith("and the plugin distributions (`plugins-public`)")
    assert importers["`base/`"] == "every package"
