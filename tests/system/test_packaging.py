"""Installing the repository's distributions prints no setuptools licence warnings.

Every ``pyproject.toml`` states its licence in the SPDX string form setuptools 77 asks
for; the old ``{text = ...}`` table printed a block of ``project.license`` deprecation
warnings per distribution at every install. One distribution is built for real, as pip
installs it (isolated, with the build backend's output shown), and its output read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROJECTS = sorted(
    path
    for path in REPO.glob("**/pyproject.toml")
    if not any(part.startswith(".") or part in {"node_modules", "build"} for part in path.parts)
)


def test_every_distribution_states_its_licence_as_an_spdx_string():
    assert len(PROJECTS) >= 8, PROJECTS
    for path in PROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        assert isinstance(project.get("license"), str), path
        requires = tomllib.loads(path.read_text())["build-system"]["requires"]
        assert any(r.replace(" ", "").startswith("setuptools>=77") for r in requires), path


@pytest.mark.slow
def test_building_a_distribution_prints_no_licence_deprecation(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(REPO / "adapters" / "ollama", source)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path / "w"),
         str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    output = built.stdout + built.stderr
    assert built.returncode == 0, output[-4000:]
    assert list((tmp_path / "w").glob("ficc_adapter_ollama-*.whl")), output[-4000:]
    warnings = [
        line
        for line in output.splitlines()
        if "deprecated" in line.lower() and "license" in line.lower()
    ]
    assert not warnings, "\n".join(warnings)
