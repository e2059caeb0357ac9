"""The controller's one assembly: every collaborator handed over at construction, and the
gateway and inference joined only through the seams of ``ficc_core.routing``.

If one of these fails, wire the thing in ``open_service`` as a constructor argument
(build it before whoever needs it), or put what both sides share in ``ficc_core.routing``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import ficc_core
from ficc_core.config import load_config
from ficc_core.controller.service import open_service
from ficc_core.routing.demand import Demand

PACKAGE = Path(ficc_core.__file__).parent
ROOT = PACKAGE.parent
SIDES = ("gateway", "inference")


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved, ``TYPE_CHECKING`` blocks
    and function bodies included."""
    module = path.relative_to(ROOT).with_suffix("").parts
    package = module[:-1]  # a module's package, or an __init__'s own
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            name = ".".join((*base, node.module) if node.module else base)
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def test_no_import_crosses_between_the_gateway_and_inference_not_even_for_types():
    crossings = []
    for side, other in (SIDES, SIDES[::-1]):
        for path in sorted((PACKAGE / side).rglob("*.py")):
            for name in sorted(_imported(path)):
                if name == f"ficc_core.{other}" or name.startswith(f"ficc_core.{other}."):
                    crossings.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not crossings, (
        "the gateway and inference must not import each other, even under TYPE_CHECKING; "
        "move what both need into ficc_core.routing:\n" + "\n".join(crossings)
    )


def test_lint_imports_keeps_the_gateway_and_inference_independent():
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {contract["id"]: contract for contract in linter["contracts"]}
    independence = contracts["gateway-inference"]
    assert independence["type"] == "independence"
    assert set(independence["modules"]) == {"ficc_core.gateway", "ficc_core.inference"}
    layers = [layer.replace(" ", "") for layer in contracts["layers"]["layers"]]
    # "|": independent siblings (":" would let one import the other).
    assert "gateway|inference" in layers
    assert layers.index("gateway|inference") < layers.index("routing")


def _assigned_attributes(path: Path) -> list[str]:
    """Assignments to another object's attribute (anything but ``self.x``) in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and not (
                    isinstance(part.value, ast.Name) and part.value.id == "self"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_the_assembly_assigns_no_collaborator_after_construction():
    late = _assigned_attributes(PACKAGE / "controller" / "service.py")
    assert not late, "pass it as a constructor argument instead:\n" + "\n".join(late)


#: Classes whose bare annotations are fields or a shape, not attributes left unset.
_DECLARATIVE = ("Protocol", "NamedTuple", "TypedDict")


def _declared_unset(path: Path) -> list[str]:
    """``self.x: T`` without a value, and a bare ``x: T`` in the body of a plain class
    (no decorator such as ``attrs.define``, no declarative base)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.AnnAssign) and node.value is None:
            if isinstance(node.target, ast.Attribute):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, ast.ClassDef) and not node.decorator_list:
            if any(ast.unparse(base).endswith(_DECLARATIVE) for base in node.bases):
                continue
            found.extend(
                f"{path.relative_to(ROOT)}:{item.lineno}"
                for item in node.body
                if isinstance(item, ast.AnnAssign) and item.value is None
            )
    return found


def test_no_attribute_is_declared_and_left_unset():
    declared = []
    for side in (*SIDES, "routing", "controller"):
        for path in sorted((PACKAGE / side).rglob("*.py")):
            declared.extend(_declared_unset(path))
    assert not declared, "an attribute declared without a value is set by someone else:\n" + (
        "\n".join(declared)
    )


async def test_open_service_hands_each_seam_to_both_sides(tmp_path):
    config = load_config(overrides={"data_dir": str(tmp_path / "data")}, environ={})
    async with open_service(config) as service:
        gateway, inference = service.gateway, service.inference
        autoscaler = inference.autoscaler
        assert inference.gateway is gateway
        assert service.project.gateway is gateway
        assert autoscaler.reconciler is service.reconciler
        assert inference.mover.reconciler is service.reconciler
        assert inference.restarter.reconciler is service.reconciler
        # The gateway calls the channel the autoscaler serves ...
        assert gateway.activations._activate == autoscaler.activate
        # ... the autoscaler reads the board the gateway serves ...
        assert autoscaler.board._read == gateway.demand
        assert autoscaler.board.read("nothing-here") == Demand()
        # ... and the reconciler waits on the signal the gateway serves.
        assert service.reconciler.idle_signal._wait == gateway.admission.wait_idle
        await service.reconciler.replica_idle("no-such-attempt")
