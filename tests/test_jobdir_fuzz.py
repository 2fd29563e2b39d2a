"""Damaged and hostile job directories: every file kit
reads back from a job directory — missing, empty, truncated, a FIFO, a
symlink (to /dev/zero, to a file outside, a loop), a directory, nested
100,000 deep, huge numbers, a huge sparse file, NUL bytes, terminal escapes —
and `kit ps`, `logs`, `logs -f`, `cancel` and `report` answer with one line
or a row marked unknown: exit 0, 1 or 2, never a traceback, never a hang, and
nothing outside the job directory read into a report or written.

One real 2-node job on the local cluster (a rank fails, so there are exit
records, a failed run and an error to show) gives the directory; each case
is a copy of it with one file changed. Commands run in this process through
:func:`kit.cli.main` under an alarm, so a blocking open or a read without end
fails the case instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_logs

from kit.cli import main

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m"
VICTIM_TEXT = "victim: kit must never read this into a report or write here\n"


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def run_kit(argv: list[str], limit: int = 20) -> tuple[int, str, str]:
    """kit's command line in this process: (exit code, stdout, stderr); a hang raises Hang."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace"), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out.flush()
    return code, out.buffer.getvalue().decode("utf-8", errors="replace"), err.getvalue()


@pytest.fixture(scope="module")
def seed(cluster, tmp_path_factory) -> Path:
    """A finished real job: 2 nodes, rank 1 fails after training (exit 3), no retries."""
    base = tmp_path_factory.mktemp("jobdir-fuzz")
    cmd = (
        "python3 -m kit.train --max-steps 12 --step-delay 0.1 --log-every 2; rc=$?; "
        'if [ "$RANK" = 1 ]; then echo "Traceback (most recent call last):"; echo "ValueError: rank one"; '
        "exit 3; fi; exit $rc"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kit",
            "launch",
            "--local",
            "--nodes",
            "2",
            "--wait",
            "--max-restarts",
            "0",
            "--heartbeat",
            "0",
            "--output-dir",
            str(base / "jobs"),
            "--",
            "bash",
            "-c",
            cmd,
        ],
        capture_output=True,
        text=True,
        cwd=base,
        timeout=300,
    )
    job_dir = Path(re.search(r"^job dir: (.+)$", proc.stdout, re.M).group(1))
    assert proc.returncode == 3, proc.stderr + read_logs(job_dir)
    names = {p.relative_to(job_dir).as_posix() for p in job_dir.rglob("*") if p.is_file()}
    for need in (
        "job_id",
        "slurm.json",
        "job.json",
        "runs.jsonl",
        "logs/rank-0.r0.log",
        "logs/exit.r0.rank-1",
        "progress/r0/task-1",
        "logs/node1.r0.metrics.jsonl",
        "logs/node1.r0.exporter.log",
    ):
        assert need in names, sorted(names)
    return job_dir


def _metrics_file(d: Path) -> str:
    return next(p for p in d.glob("metrics/*/rank-0.json")).relative_to(d).as_posix()


def _slurm_out(d: Path) -> str:
    return next(p for p in d.glob("logs/slurm-*.out")).relative_to(d).as_posix()


# What each file is, and which commands read it (report only where it reads the file: it draws).
# A log kit streams (it may be gigabytes) gets a 512 MiB sparse file; a record kit reads whole, 8 GiB.
STREAMED = {"logs/rank-1.r0.log", "logs/node1.r0.metrics.jsonl", "logs/node1.r0.exporter.log", "SLURM_OUT"}
FILES = {
    "job_id": ("text", {"ps", "logs", "cancel", "report", "follow"}),
    "slurm.json": ("json", {"ps", "cancel", "follow"}),
    "job.json": ("json", {"ps"}),
    "runs.jsonl": ("lines", {"ps", "logs", "report"}),
    "FINISHED": ("text", {"ps", "report"}),
    "cancelled.json": ("json", {"ps", "cancel"}),
    "logs/rank-1.r0.log": ("log", {"logs"}),
    "logs/exit.r0.rank-1": ("text", {"logs"}),
    "progress/r0/task-1": ("text", {"logs"}),
    "logs/node1.r0.metrics.jsonl": ("lines", {"report"}),
    "logs/node1.r0.exporter.log": ("log", {"logs"}),
    "METRICS": ("json", {"ps"}),
    "SLURM_OUT": ("log", {"follow"}),
}

MUTATIONS = [
    "missing",
    "empty",
    "truncated",
    "fifo",
    "symlink-zero",
    "symlink-out",
    "symlink-loop",
    "directory",
    "nested",
    "huge-numbers",
    "sparse-huge",
    "nul",
    "escapes",
]


def mutate(path: Path, kind: str, how: str, victim: Path, huge: int = 8 << 30) -> None:
    original = path.read_bytes() if path.is_file() else b""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "missing":
        return
    if how == "fifo":
        os.mkfifo(path)
    elif how == "symlink-zero":
        path.symlink_to("/dev/zero")
    elif how == "symlink-out":
        path.symlink_to(victim)
    elif how == "symlink-loop":
        path.symlink_to(path.name)
    elif how == "directory":
        path.mkdir()
    elif how == "sparse-huge":
        with open(path, "wb") as f:
            f.truncate(huge)  # holes: cheap here, a read into memory is not
    else:
        path.write_bytes(_content(kind, how, original))


def _content(kind: str, how: str, original: bytes) -> bytes:
    if how == "empty":
        return b""
    if how == "truncated":
        return original[: max(len(original) // 2, 1)]
    if how == "nul":
        return b"\0" * 64 + original
    if how == "nested":
        deep = b"[" * 100_000 + b"]" * 100_000
        return deep + b"\n" + deep + b"\n" if kind == "lines" else deep
    if how == "huge-numbers":
        big = b"9" * 5000
        if kind in ("json", "lines"):
            rec = (
                b'{"run": %s, "end": "failed", "exit_code": 1e999, "checkpoint_step": -1e999, "time": %s, '
                b'"job_name": 1e308, "target": "local", "conf": 7, "step": 1e400, "loss": %s, '
                b'"samples": [["training_step", {}, 1e999]], "node": "n"}'
            ) % (big, big, big)
            return rec + b"\n" + rec + b"\n" if kind == "lines" else rec
        return b"%s %s %s self\n" % (big, big, big) if kind == "text" else big + b"\n"
    if how == "escapes":
        e = ESCAPES.encode()
        if kind in ("json", "lines"):
            rec = json.dumps(
                {
                    "job_name": ESCAPES,
                    "run": 0,
                    "end": ESCAPES,
                    "target": ESCAPES,
                    "conf": ESCAPES,
                    "time": 1.0,
                    "node": ESCAPES,
                    "samples": [],
                }
            ).encode()
            return rec + b"\n"
        return e + b" " + e + b"\n"
    raise AssertionError(how)


CASES = [(name, how) for name in FILES for how in MUTATIONS]


@pytest.mark.parametrize("name", list(FILES))
def test_damaged_job_directory_files(seed, tmp_path, name):
    kind, commands = FILES[name]
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    os.chmod(victim, 0o600)
    before = victim.stat()
    failures = []
    for how in MUTATIONS:
        out = tmp_path / how / "jobs"
        d = out / seed.name
        shutil.copytree(seed, d, symlinks=True)
        rel = {"METRICS": _metrics_file(d), "SLURM_OUT": _slurm_out(d)}.get(name, name)
        mutate(d / rel, kind, how, victim, (512 << 20) if name in STREAMED else (8 << 30))
        for argv in _commands(commands, d, out, how, kind):
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            try:
                code, stdout, stderr = run_kit(argv)
            except Hang:
                failures.append(f"{rel} {how}: kit {' '.join(argv)}: hung")
                continue
            problem = _judge(argv, code, stdout, stderr, d)
            grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak  # KiB, over the peak so far
            if how == "sparse-huge" and grew > 200 << 10:
                problem = f"its memory grew by {grew >> 10} MiB reading a huge file"
            if problem:
                failures.append(f"{rel} {how}: kit {' '.join(argv)}: {problem}")
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp_path / how)], check=False)
    after = victim.stat()
    assert victim.read_text() == VICTIM_TEXT and (after.st_mode, after.st_uid, after.st_mtime_ns) == (
        before.st_mode,
        before.st_uid,
        before.st_mtime_ns,
    ), "the victim file outside the job directory changed"
    assert not failures, "\n".join(failures)


def _commands(commands: set[str], d: Path, out: Path, how: str, kind: str) -> list[list[str]]:
    argv = []
    if "ps" in commands:
        argv += [["ps", "--all", "--output-dir", str(out)], ["ps", "--all", "--json", "--output-dir", str(out)]]
    if "logs" in commands:
        argv += [["logs", str(d), "--errors"]]
        if how != "sparse-huge":  # printing a huge log whole is what `kit logs` is for (here: into memory)
            argv += [["logs", str(d)], ["logs", str(d), "--rank", "1"], ["logs", str(d), "--sidecar", "exporter"]]
    if "cancel" in commands:
        argv += [["cancel", str(d), "--reason", "fuzz"]]
    if "report" in commands and how not in ("truncated", "empty"):  # the same path as missing lines, and slow
        argv += [["report", str(d), "--prometheus", "http://127.0.0.1:1"]]
    if "follow" in commands and how in ("missing", "fifo", "symlink-zero", "nested", "escapes"):
        argv += [["logs", str(d), "-f"]]
    return argv


def _judge(argv: list[str], code: int, stdout: str, stderr: str, d: Path) -> str | None:
    if code not in (0, 1, 2):
        return f"exit {code}: {stderr[-500:]}"
    if "Traceback" in stderr:
        return f"a traceback: {stderr[-2000:]}"
    if VICTIM_TEXT.strip() in stdout + stderr:
        return "printed the victim file outside the job directory"
    if ESCAPES in stderr or (argv[0] == "ps" and ESCAPES in stdout):
        return "printed a terminal escape sequence raw"
    if argv[0] == "ps" and code != 0:
        return f"kit ps failed for every job because of one directory: {stderr[-500:]}"
    if argv[0] == "cancel" and code == 0:
        return "cancelled a job that had ended"
    if code != 0 and not stderr.startswith("kit: "):
        return f"exit {code} without a kit: line: {stderr[-500:]!r}"
    if argv[0] == "report" and code == 0:
        summary = (d / "report.json").read_text()
        if "victim" in summary:
            return "the report read the victim file"
    return None


def test_report_never_writes_through_planted_symlinks(seed, tmp_path):
    """report.png and report.json planted as symlinks to a file outside: replaced, never followed."""
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    d = tmp_path / "jobs" / seed.name
    shutil.copytree(seed, d, symlinks=True)
    for name in ("report.png", "report.json"):
        (d / name).unlink(missing_ok=True)
        (d / name).symlink_to(victim)
    code, _, err = run_kit(["report", str(d), "--prometheus", "http://127.0.0.1:1"], limit=60)
    assert code == 0, err
    assert victim.read_text() == VICTIM_TEXT
    assert not (d / "report.png").is_symlink() and (d / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((d / "report.json").read_text())["job"]
    assert not [p.name for p in d.iterdir() if p.name.startswith(".report")]  # no temporary file left


def test_report_output_must_be_a_picture(seed, tmp_path):
    code, _, err = run_kit(["report", str(seed), "--output", str(tmp_path / "r.txt")])
    assert code == 2 and err.startswith("kit: --output: ") and "Traceback" not in err, err
    assert not (tmp_path / "r.txt").exists() and not (tmp_path / "r.json").exists()


def test_a_damaged_jobs_index_never_breaks_ps(seed, tmp_path, monkeypatch):
    """The user's index of jobs (``$KIT_HOME/jobs.index``), damaged every way: kit ps still answers."""
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    failures = []
    for how in MUTATIONS:
        home = tmp_path / how
        home.mkdir()
        (home / "jobs.index").write_text(json.dumps(str(seed)) + "\n")
        mutate(home / "jobs.index", "lines", how, victim)
        monkeypatch.setenv("KIT_HOME", str(home))
        for argv in (["ps", "--all"], ["ps", "--all", "--json"]):
            try:
                code, stdout, stderr = run_kit(argv)
            except Hang:
                failures.append(f"jobs.index {how}: hung")
                continue
            problem = _judge(argv, code, stdout, stderr, seed)
            if problem:
                failures.append(f"jobs.index {how}: {problem}")
    assert not failures, "\n".join(failures)


def test_logs_names_must_be_names(seed):
    """`--sidecar '**'` was a glob error (a traceback); a name is letters, digits, '.', '_', '-'."""
    for opt, value in (("--sidecar", "**"), ("--sidecar", "../x"), ("--node", "a/b"), ("--node", "*")):
        code, _, err = run_kit(["logs", str(seed), opt, value])
        assert code == 2 and err.startswith(f"kit: {opt}: {value!r} is not a ") and "Traceback" not in err, err


def test_ps_without_any_slurm_keeps_each_rows_problem_in_its_row(seed, tmp_path, monkeypatch):
    """No site Slurm, no local cluster (another KIT_HOME), one job directory
    without its slurm.json and one with an empty job_id: kit ps answers, each row marked."""
    out = tmp_path / "jobs"
    for name in ("no-record", "empty-id"):
        shutil.copytree(seed, out / name, symlinks=True)
    (out / "no-record" / "slurm.json").unlink()
    (out / "empty-id" / "job_id").write_text("")
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    if any(Path(p).exists() for p in ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf")):
        pytest.fail("this machine has a site slurm.conf: the case needs none")  # never silently skipped
    code, stdout, err = run_kit(["ps", "--all", "--json", "--output-dir", str(out)])
    assert code == 0, err
    rows = {Path(r["job_dir"]).name: r for r in json.loads(stdout)}
    assert set(rows) == {"no-record", "empty-id"}
    # The trainer marked the work done, then rank 1 exited 3: Slurm said FAILED, and so does the directory.
    assert rows["no-record"]["state"] == "FAILED" and "no Slurm" in rows["no-record"]["state_from"], rows
    assert "FINISHED" in {p.name for p in seed.iterdir()}
    assert rows["empty-id"]["id"] == "?" and "job_id is damaged" in rows["empty-id"]["state_from"]


def test_a_kept_end_with_an_underscore_is_told_as_kept(tmp_path):
    """outcome.json keeps Slurm's end state; OUT_OF_MEMORY and NODE_FAIL hold underscores."""
    from kit.jobdir import end_records

    for state in ("OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT"):
        (tmp_path / end_records.OUTCOME_RECORD).write_text(json.dumps({"state": state}))
        assert end_records.recorded_state(tmp_path) == state
    (tmp_path / end_records.OUTCOME_RECORD).write_text(json.dumps({"state": "\x1b[2J"}))
    assert end_records.recorded_state(tmp_path) == "ENDED"
