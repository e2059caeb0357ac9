"""The plugin guide stays honest: every hook is documented, generated docs are current, and
every hook has a test (datasette's two meta-tests, plus the generator check)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ficc_core import hookspecs
from ficc_core.devtools import docs_hooks

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugins.md"
SPECS = docs_hooks.hookspecs()


def test_there_are_hookspecs_to_check():
    assert [spec.__name__ for spec in SPECS]


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.__name__)
def test_every_hook_is_documented_in_the_plugin_guide(spec):
    assert f"#### `{spec.__name__}`" in GUIDE.read_text(encoding="utf-8")


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.__name__)
def test_every_hook_is_exercised_by_a_test(spec):
    test_files = [
        *ROOT.glob("tests/**/test_*.py"),
        *ROOT.glob("adapters/*/tests/**/test_*.py"),
        *ROOT.glob("executors/*/tests/**/test_*.py"),
    ]
    assert any(spec.__name__ in path.read_text(encoding="utf-8") for path in test_files)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.__name__)
def test_every_hook_is_documented_the_pytest_way(spec):
    doc = inspect.getdoc(spec)
    summary = doc.splitlines()[0]
    assert summary.endswith(".") and not summary.split()[0].endswith("s"), summary
    for parameter in inspect.signature(spec).parameters:
        assert f":param {parameter}:" in doc
    assert re.search(r"^\.\. versionadded:: API \d+$", doc, re.MULTILINE)
    assert all(annotation for annotation in spec.__annotations__.values())


def test_every_hook_belongs_to_a_lifecycle_group():
    grouped = [spec for group in docs_hooks.hook_groups() for spec in group.hooks]
    assert grouped == SPECS


def test_hook_reference_in_the_guide_matches_the_hookspec_docstrings():
    current = GUIDE.read_text(encoding="utf-8")
    assert current == docs_hooks.update_page(current), (
        "docs/plugins.md is out of date: run python -m ficc_core.devtools.docs_hooks"
    )


def test_docs_generator_check_mode_passes_on_the_guide():
    result = subprocess.run(
        [sys.executable, "-m", "ficc_core.devtools.docs_hooks", "--check", str(GUIDE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_docs_generator_check_mode_fails_on_a_stale_page(tmp_path):
    stale = tmp_path / "plugins.md"
    stale.write_text(f"# Guide\n\n{docs_hooks.START}\nold text\n{docs_hooks.END}\n")
    assert docs_hooks.main(["--check", str(stale)]) == 1
    assert docs_hooks.main([str(stale)]) == 0
    assert docs_hooks.main(["--check", str(stale)]) == 0
    text = stale.read_text()
    assert text.startswith("# Guide\n\n") and "old text" not in text
    assert "#### `ficc_register_executor_providers`" in text


def test_rendering_converts_the_docstring_conventions():
    markdown = docs_hooks.render_hooks()
    assert "**Parameters**" in markdown and "*Added in API 1.*" in markdown
    assert not re.search(r"(?<!`)``(?!`)", markdown) and ":param" not in markdown
    assert "ficc_register_adapters(registry: AdapterRegistry) -> None" in markdown


def test_spec_marker_is_private_and_hookimpl_is_public():
    import ficc_core

    assert "hookimpl" in ficc_core.__all__
    assert not any("hookspec" in name.lower() for name in ficc_core.__all__)
    assert not hasattr(ficc_core, "_hookspec")
    assert hookspecs.API_VERSION == ficc_core.API_VERSION == 1
