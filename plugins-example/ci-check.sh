#!/usr/bin/env bash
# CI check for the example third-party plugin, the way a third party would install it:
#   1. build ficc-core's wheel and the example's wheel from this checkout;
#   2. install both into a CLEAN virtual environment in a temporary directory
#      (ficc-core's dependencies come from the package index; nothing is editable);
#   3. check that `ficc plugins --json` there lists the sglang adapter as loaded from
#      the ficc-example-sglang distribution, and nothing else;
#   4. run the example's own tests (golden translations, the conformance kit,
#      discovery) against the installed wheel, from outside the source tree.
# Usage: plugins-example/ci-check.sh   (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/ficc-plugin-ci.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# A fresh venv's own pip builds the wheels too: the system Python may have no pip module.
"$python" -m venv "$work/venv"
venv="$work/venv/bin"

echo "== building wheels"
# From copies, so that setuptools' build/ and *.egg-info stay out of the checkout.
mkdir -p "$work/src/ficc-core"
cp -r "$root/pyproject.toml" "$root/README.md" "$root/ficc_core" "$work/src/ficc-core/"
cp -r "$root/plugins-example" "$work/src/plugins-example"
find "$work/src" \( -name __pycache__ -o -name '*.egg-info' -o -name build \) -prune \
    -exec rm -rf {} +
"$venv/python" -m pip wheel --quiet --no-deps -w "$work/wheels" \
    "$work/src/ficc-core" "$work/src/plugins-example"
ls "$work/wheels"

echo "== installing them into the clean environment"
"$venv/python" -m pip install --quiet "$work"/wheels/*.whl "pytest>=8"

# Everything below runs outside the checkout, so imports resolve to the installed wheels.
cd "$work"
unset FICC_DISABLE_PLUGIN_AUTOLOAD

echo "== ficc plugins --json"
"$venv/ficc" plugins --json | tee plugins.json
"$venv/python" - "$work" <<'EOF'
import json
import sys
from pathlib import Path

import ficc_core
import ficc_example_sglang

work = Path(sys.argv[1]).resolve()
for module in (ficc_core, ficc_example_sglang):
    location = Path(module.__file__).resolve()
    assert location.is_relative_to(work / "venv"), f"{module.__name__} imported from {location}"

plugins = json.loads(Path("plugins.json").read_text())["plugins"]
expected = {
    "api_version": 1,
    "distribution": "ficc-example-sglang",
    "kind": "adapter",
    "name": "sglang",
    "plugin": "sglang",
    "reason": None,
    "status": "loaded",
    "version": "0.1.0",
}
assert plugins == [expected], f"expected only the sglang adapter, loaded; got {plugins}"
print("ok: the sglang adapter is discovered from ficc-example-sglang 0.1.0")
EOF

echo "== the example's tests against the installed wheel"
cp -r "$root/plugins-example/tests" "$work/tests"
"$venv/python" -m pytest -q -p no:cacheprovider --rootdir "$work" "$work/tests"
