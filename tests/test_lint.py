"""The code is ruff-clean and ruff-formatted (pyproject's [tool.ruff]: pyflakes and pycodestyle's errors, sorted
imports, bugbear), as CI checks it: the README's test command holds it too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO

PATHS = ["kit", "tests", "bench"]


def ruff(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert found, "ruff is one of the test extras (pip install -e '.[test]')"
    return subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_check_is_clean():
    proc = ruff("check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    proc = ruff("format", "--check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_checks_can_fail(tmp_path):
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\nx = {'a':1}\n")
    assert ruff("check", "bad.py", cwd=tmp_path).returncode == 1  # an unused import
    assert ruff("format", "--check", "bad.py", cwd=tmp_path).returncode == 1
