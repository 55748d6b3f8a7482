"""scripts/setup.sh repairs a .venv without pip (what a failed `python3 -m venv` leaves); it
used to skip creating the venv because bin/python existed, then fail at pip on every run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "setup-probe"
version = "0"
[project.optional-dependencies]
dev = []
[project.scripts]
tao = "probe:main"
[tool.setuptools]
py-modules = ["probe"]
"""


def test_a_venv_without_pip_is_recreated(tmp_path: Path) -> None:
    """The script, run on a project whose .venv has python but no pip, recreates the venv
    with pip and installs the project (its `tao` entry point exists afterwards)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "probe.py").write_text("def main() -> None:\n    pass\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / ".venv")],
                   check=True, timeout=120)  # fmt: skip
    venv_python = tmp_path / ".venv" / "bin" / "python"
    broken = subprocess.run([str(venv_python), "-m", "pip", "--version"], capture_output=True,
                            check=False, timeout=60)  # fmt: skip
    assert broken.returncode != 0  # the state a failed `python3 -m venv` leaves
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup.sh")],
        capture_output=True, text=True, timeout=600, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no working pip" in done.stderr
    assert (tmp_path / ".venv" / "bin" / "tao").exists()
    ok = subprocess.run([str(venv_python), "-m", "pip", "--version"], capture_output=True,
                        check=False, timeout=60)  # fmt: skip
    assert ok.returncode == 0
