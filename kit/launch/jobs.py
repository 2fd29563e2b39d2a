"""A submitted job's directory, read back: which directory a job id names,
its runs, ranks and logs, how each rank ended, and a cancel's record.

Scheduler-neutral: it reads only what kit's scripts write into the job
directory (see the README's "The job directory").
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from kit.errors import KitError


def find_job_dir(job: str, output_dir: str | Path) -> Path:
    """``job`` as a job directory, or a job id looked up under ``output_dir``."""
    job_dir = Path(job)
    if job_dir.is_dir():
        return job_dir
    matches = []
    for p in Path(output_dir).glob("*/job_id"):
        try:
            if p.read_text().strip() == job:
                matches.append(p.parent)
        except OSError:
            continue
    if not matches:
        raise KitError(f"no job directory for job {job} under {output_dir}", field="JOB",
                       hint="give the job directory itself, or --output-dir where it lives")
    if len(matches) > 1:
        raise KitError(f"job id {job} names {len(matches)} job directories under {output_dir}", field="JOB",
                       detail="\n".join(str(m) for m in sorted(matches)), hint="give the job directory itself")
    return matches[0]


def job_id_of(job_dir: Path) -> str | None:
    try:
        text = (job_dir / "job_id").read_text().strip()
    except OSError:
        return None
    return text if text.isdigit() else None


def runs(job_dir: Path) -> list[int]:
    """The run numbers (restarts) that left rank logs, in order."""
    found = {int(m.group(1)) for p in (job_dir / "logs").glob("rank-*.r*.log")
             if (m := re.fullmatch(r"rank-\d+\.r(\d+)\.log", p.name))}
    return sorted(found)


def ranks(job_dir: Path, run: int) -> list[int]:
    return sorted(int(m.group(1)) for p in (job_dir / "logs").glob(f"rank-*.r{run}.log")
                  if (m := re.fullmatch(rf"rank-(\d+)\.r{run}\.log", p.name)))


def node_of(job_dir: Path, run: int, rank: int) -> str:
    """Where a rank ran (the launcher's ``progress/r<run>/task-<rank>``: node pid)."""
    try:
        return (job_dir / "progress" / f"r{run}" / f"task-{rank}").read_text().split()[0]
    except (OSError, IndexError):
        return "?"


@dataclass
class RankEnd:
    run: int
    rank: int
    node: str
    exit_code: int
    time: float
    by_itself: bool  # False: it was stopped (a signal from kit or Slurm)


def rank_ends(job_dir: Path, run: int) -> list[RankEnd]:
    """How each rank of a run ended (``logs/exit.r<run>.rank-<R>``: time rank rc self|stopped), by time."""
    out = []
    for p in (job_dir / "logs").glob(f"exit.r{run}.rank-*"):
        try:
            t, rank, rc, how = p.read_text().split()[:4]
            out.append(RankEnd(run, int(rank), node_of(job_dir, run, int(rank)), int(rc), int(t) / 1e9,
                               how == "self"))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda e: (e.time, e.rank))


def first_failure(job_dir: Path, run: int) -> RankEnd | None:
    """The first rank of a run that failed by itself (non-zero, not stopped)."""
    return next((e for e in rank_ends(job_dir, run) if e.by_itself and e.exit_code != 0), None)


def last_lines(text: str, lines: int = 20) -> str:
    """The end of a log, a Python traceback near the end kept whole."""
    rows = text.splitlines()
    start = max(len(rows) - lines, 0)
    for i in range(len(rows) - 1, max(len(rows) - 400, -1), -1):
        if rows[i].startswith("Traceback (most recent call last):"):
            start = min(start, i)
            break
    return "\n".join(rows[start:])


CANCEL_RECORD = "cancelled.json"


def record_cancel(job_dir: Path, reason: str | None) -> dict:
    """Who cancelled the job, when and why, in the job directory (before the cancel)."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry for this uid
        user = str(os.getuid())
    rec = {"by": user, "host": socket.gethostname(), "time": round(time.time(), 3), "reason": reason or ""}
    tmp = job_dir / f".{CANCEL_RECORD}.tmp"
    try:
        tmp.write_text(json.dumps(rec, indent=2) + "\n")
        os.replace(tmp, job_dir / CANCEL_RECORD)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise KitError(f"cannot write the cancel record in {job_dir}: {e.strerror}", field="JOB", exit_code=1,
                       hint="nothing was cancelled; scancel still works") from None
    return rec


@dataclass
class Progress:
    step: int | None = None
    loss: float | None = None
    samples_total: float | None = None


def training_progress(job_dir: Path) -> Progress:
    """Rank 0's latest training metrics (``metrics/<node>/rank-0.json``, written by
    kit.train's callback), or an empty Progress."""
    for path in sorted(Path(job_dir).glob("metrics/*/rank-0.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue

        def num(key):
            v = data.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        step = num("step")
        return Progress(int(step) if step is not None else None, num("loss"), num("samples_total"))
    return Progress()
