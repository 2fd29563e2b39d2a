"""The job directory has one owner: kit.jobdir.JobDir names every file; the bash
scripts (launch/) use the same names, and no other module of kit spells one."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

from kit.jobdir import JobDir, records

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / "kit"
TEMPLATES = sorted((REPO / "launch").glob("*.sh"))

# Where the scripts' directory variables point, relative to the job directory.
ROOTS = {
    "KIT_JOB_DIR": "",
    "KIT_SCRIPTS_DIR": "",
    "KIT_LOG_DIR": "logs/",
    "KIT_PROGRESS_DIR": "progress/r*/",
    "KIT_HANG_DIR": "hang/r*/",
    "KIT_METRICS_DIR": "metrics/*/",
    "KIT_NODE_LOG_PREFIX": "logs/*.r*",
}
PATH = re.compile(r"\$\{(" + "|".join(ROOTS) + r')\}([/.][A-Za-z0-9_.${}:/*-]*)(")?(\*)?')


def normal(pattern: str) -> str:
    """What varies in a name, as a glob: bash's ${…} and $1, JobDir's {…}."""
    return re.sub(r"\$\{[^}]*\}|\$[0-9]|\{[a-z_]+\}", "*", pattern)


def script_paths() -> set[str]:
    out = set()
    for path in TEMPLATES:
        for root, rest, _, glob in PATH.findall(path.read_text()):
            rel = (ROOTS[root] + rest.lstrip("/") if root != "KIT_NODE_LOG_PREFIX" else ROOTS[root] + rest).rstrip("/")
            out.add(normal(rel + glob))
    return out


def test_the_scripts_use_the_names_jobdir_gives():
    known = {normal(p) for p in JobDir.patterns()}
    found = script_paths()
    assert len(found) > 20, found  # the scan sees the scripts' paths
    strays = []
    for rel in sorted(found):
        head, _, name = rel.rpartition("/")
        plain = f"{head}/{name.lstrip('.')}" if head else name.lstrip(".")  # .stop: the temp name of stop
        if not any(rel == k or plain == k or fnmatch.fnmatchcase(k, rel) for k in known):
            strays.append(rel)
    assert strays == [], f"paths in launch/*.sh that kit.jobdir.JobDir does not name: {strays}"


def test_the_scan_catches_a_name_jobdir_does_not_give(tmp_path):
    text = 'printf x >"${KIT_PROGRESS_DIR}/nonsense-${RANK}"\n'
    found = {normal(ROOTS[r] + rest.lstrip("/") + g) for r, rest, _, g in PATH.findall(text)}
    assert found == {"progress/r*/nonsense-*"} and not found & {normal(p) for p in JobDir.patterns()}


# File names only JobDir may spell (short common words like "logs", or "checkpoint_step", are
# JSON keys elsewhere too).
DISTINCT = {
    JobDir.PRELAUNCH,
    JobDir.LAUNCHER,
    JobDir.SPEC,
    JobDir.SBATCH,
    JobDir.PARAMS,
    JobDir.SLURM,
    JobDir.CANCELLED,
    JobDir.OUTCOME,
    JobDir.FINISHED,
    JobDir.RUNS,
    JobDir.REPORT,
    JobDir.STEP_START,
    "metrics.jsonl",
    "slurm-%",
    "rank-",
    "exit.r",
    "task-",
    "warned-",
    "joined-",
}


def test_no_module_outside_kit_jobdir_spells_a_job_directory_file():
    """grep finds the names in kit/jobdir and the scripts only.
    (Docstrings and comments may name them; code asks JobDir.)"""
    bad = []
    for path in sorted(KIT.rglob("*.py")):
        if path.is_relative_to(KIT / "jobdir"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if id(node) in docstrings or not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            if re.search(r"\s", text):
                continue  # prose: a help text may name a file
            if text in DISTINCT or any(f"/{n}" in text or text.startswith(n) for n in DISTINCT):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {text[:70]!r}")
    assert bad == []


def test_one_parser_per_record(tmp_path):
    """runs.jsonl: torn and damaged lines skipped by the one reader everything uses."""
    (tmp_path / JobDir.RUNS).write_text(
        '{"run": 0, "end": "requeued"}\n{"run": 1,\n[1]\n{"run": 1, "end": "finished"}\n'
    )
    assert [r.end for r in records.run_records(tmp_path)] == ["requeued", "finished"]
    assert records.last_run(tmp_path).run == 1 and records.run_records(tmp_path / "none") == []
