"""The layout rules ``make lint`` checks beside the import contracts.

``python -m ficc_core.devtools.layout`` reads ``[tool.ficc.layout]`` in pyproject.toml and
fails (exit status 1), one line per finding, each saying what to do, when:

- ``top-level``: ``ficc_core/`` holds a file or package its ``top_level`` list does not name
  (a new thing belongs in the package that owns it; the top is for the package's face);
- ``layered``: a package of ``ficc_core`` is missing from the ``layers`` import contract
  (import-linter checks only the packages a contract names, so an unnamed one is unchecked);
- ``repository``: a repository module (``repository.py``, ``*_repository.py``) is imported from
  outside the package that owns it (its SQL is that package's business: others ask the
  package's service);
- ``long-module``: a module is over ``max_lines`` lines and not in ``long_modules`` with a
  reason, or is listed there but no longer long (a stale exception, like import-linter's
  unmatched ``ignore_imports``).

Each rule is a function over a source tree, so the tests plant a violation in a copy.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "ficc_core"


@attrs.frozen
class Finding:
    rule: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: [{self.rule}] {self.message}"


@attrs.frozen
class Rules:
    top_level: frozenset[str]
    max_lines: int
    long_modules: Mapping[str, str]
    layers: tuple[str, ...]

    @classmethod
    def from_pyproject(cls, pyproject: Mapping[str, object]) -> Rules:
        tool = pyproject["tool"]
        assert isinstance(tool, dict)
        layout = tool["ficc"]["layout"]
        [contract] = [c for c in tool["importlinter"]["contracts"] if c["id"] == "layers"]
        return cls(
            top_level=frozenset(layout["top_level"]),
            max_lines=int(layout["max_lines"]),
            long_modules=dict(layout.get("long_modules", {})),
            layers=tuple(contract["layers"]),
        )


def _entries(package: Path) -> Iterator[str]:
    for entry in sorted(package.iterdir()):
        if entry.name == "__pycache__" or entry.name.startswith("."):
            continue
        if entry.is_dir() and not (entry / "__init__.py").exists():
            continue
        if entry.is_file() and entry.suffix != ".py":
            continue
        yield entry.name


def check_top_level(root: Path, rules: Rules) -> list[Finding]:
    found = []
    for name in _entries(root / PACKAGE):
        if name not in rules.top_level:
            found.append(
                Finding(
                    "top-level",
                    f"{PACKAGE}/{name}",
                    "is not in [tool.ficc.layout] top_level: move it into the package that owns "
                    "it (docs/architecture.md says which owns what), or add it to that list with "
                    "a comment saying why it belongs at the top",
                )
            )
    return found


def check_layered(root: Path, rules: Rules) -> list[Finding]:
    named = {
        part.strip()
        for layer in rules.layers
        for part in layer.replace(":", "|").split("|")
        if part.strip()
    }
    found = []
    for name in _entries(root / PACKAGE):
        module = name.removesuffix(".py")
        if module == "__init__" or module in named:
            continue
        found.append(
            Finding(
                "layered",
                f"{PACKAGE}/{name}",
                "is in no layer of the `layers` import contract, so nothing checks what it "
                'imports: add it to [[tool.importlinter.contracts]] id = "layers" in '
                "pyproject.toml at the layer it belongs to (and to plugins-public's list)",
            )
        )
    return found


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(module: str, is_package: bool, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module name an import statement names (``from a import b`` gives a and a.b)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            yield node.lineno, prefix
            for alias in node.names:
                yield node.lineno, f"{prefix}.{alias.name}"


def _is_repository(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last == "repository" or last.endswith("_repository")


def _owner(module: str) -> str:
    """The package that owns a module: ``ficc_core.<domain>``."""
    return ".".join(module.split(".")[:2])


def check_repositories(root: Path, rules: Rules) -> list[Finding]:
    found = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, name in _imported(module, path.name == "__init__.py", tree):
            if not name.startswith(f"{PACKAGE}.") or not _is_repository(name):
                continue
            if _owner(name) != _owner(module):
                found.append(
                    Finding(
                        "repository",
                        f"{path.relative_to(root)}:{line}",
                        f"imports {name}, the repository of {_owner(name)}: call that "
                        "package's service instead, or move the query into the package "
                        "that owns the table",
                    )
                )
    return found


def check_long_modules(root: Path, rules: Rules) -> list[Finding]:
    found = []
    seen = set()
    sources = [root / PACKAGE, *(root / d for d in ("adapters", "executors", "runtimes"))]
    for source in sources:
        for path in sorted(source.rglob("*.py")):
            if "build" in path.parts or any(p.startswith(".") for p in path.parts):
                continue
            where = path.relative_to(root).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines <= rules.max_lines:
                continue
            seen.add(where)
            if not rules.long_modules.get(where, "").strip():
                found.append(
                    Finding(
                        "long-module",
                        where,
                        f"has {lines} lines, over {rules.max_lines}: split it by concern into "
                        "modules a reader takes in one sitting, or add it to "
                        "[tool.ficc.layout.long_modules] with the reason it stays whole",
                    )
                )
    for where in sorted(set(rules.long_modules) - seen):
        found.append(
            Finding(
                "long-module",
                where,
                f"is listed in [tool.ficc.layout.long_modules] but is not over {rules.max_lines} "
                "lines (or no longer exists): remove the stale entry",
            )
        )
    return found


CHECKS = (check_top_level, check_layered, check_repositories, check_long_modules)


def check(root: Path = ROOT) -> list[Finding]:
    rules = Rules.from_pyproject(tomllib.loads((root / "pyproject.toml").read_text()))
    return [finding for rule in CHECKS for finding in rule(root, rules)]


def main() -> int:
    findings = check()
    for finding in findings:
        print(finding)
    if findings:
        print(f"{len(findings)} layout finding(s); the rules: ficc_core/devtools/layout.py")
        return 1
    print("layout rules kept (top level, layers, repositories, module length)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
