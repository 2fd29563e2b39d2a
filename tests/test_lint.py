"""The code is ruff-clean and ruff-formatted (pyproject's [tool.ruff]: pyflakes and pycodestyle's errors, sorted
imports, bugbear), as CI checks it: the README's test command holds it too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO

PATHS = ["."]  # every Python file of the repository (pyproject's extend-exclude: the base images, the caches)


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


DEMO = """
import os


def test_passes(tmp_path):
    (tmp_path / "kept").write_text("no")
    assert not os.path.exists("ci-evidence"), "a job launched from the checkout would find it"


def test_fails(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "slurm-1.out").write_text("what the job said")
    assert False, "the evidence"
"""


def test_a_red_ci_run_keeps_its_failing_tests_directories_and_output_and_runs_every_part(tmp_path):
    """.ci/run's parts (its functions, sourced): a failing part does not stop the next; the run ends red with
    each part's output and the failing test's temporary directory in ci-evidence/, a passing test's gone (pytest
    keeps only its 3 newest directories per user otherwise: other runs on the machine pruned a red run's)."""
    (tmp_path / "test_demo.py").write_text(DEMO)
    script = f"""
source {REPO / ".ci" / "run"}
begin
tests suite test_demo.py
part after echo the next part ran
echo "$SCRATCH"
verdict
"""
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    evidence = tmp_path / "ci-evidence"
    assert proc.returncode == 1 and "red after" in proc.stderr and "suite (exit 1)" in proc.stderr, proc.stderr
    assert "the evidence" in (evidence / "suite.log").read_text() and "1 failed, 1 passed" in proc.stdout
    assert (evidence / "after.log").read_text() == "the next part ran\n"
    kept = [p.relative_to(evidence / "tmp" / "suite") for p in (evidence / "tmp" / "suite").rglob("*") if p.is_file()]
    assert [str(p) for p in kept] == ["test_fails0/job/slurm-1.out"], kept
    assert not Path(proc.stdout.splitlines()[-1]).exists(), "moved into the checkout, not left behind"


def test_the_changelog_is_dated_as_the_commits_are():
    """Each heading of CHANGELOG.md is a date, newest first, none after today (an entry is written as its work
    lands: headings dated by session ran ten days ahead of the commits)."""
    import datetime
    import re

    dates = re.findall(r"^### (\d{4}-\d{2}-\d{2})$", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert len(dates) >= 5 and dates == sorted(dates, reverse=True) and len(set(dates)) == len(dates), dates
    assert dates[0] <= datetime.date.today().isoformat(), dates[0]
