"""When each node's first task started after srun, and how (squashfuse, create or on the host): the launcher's task records read back."""

from __future__ import annotations

import re
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir

# Where each run's tasks started: prelaunch writes the step's start (its clock,
# EPOCHREALTIME, just before srun) to progress/r<run>/step-start; each launcher,
# at its first line, its own start as the third word of progress/r<run>/task-<rank>
# ("node pid start mode"). Between the two lies what srun and the container plugin
# did before the task ran: under an image, the container's start. The fourth word
# is how the container held the image: "squashfuse" (read through FUSE, pyxis's
# use_squashfuse=1), "create" (unpacked, or the stand-in's overlay), "host" (no image).
MODES = ("squashfuse", "create", "host")


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1e11 else None


def read_task_record(path: str | Path) -> tuple[str, str, float | None, str | None] | None:
    """A launcher's task record (``progress/r<run>/task-<rank>``: "node pid start mode"): (node,
    pid, start or None, mode or None: an older record has fewer words); None when unreadable or
    not one. The one parser: kit report's task starts and the hang and failure reports read it."""
    try:
        words = files.read_text(path, 4096).split()
    except OSError:
        return None
    if len(words) < 2 or not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", words[0]):
        return None
    return (
        words[0],
        words[1],
        _seconds(words[2]) if len(words) >= 3 else None,
        words[3] if len(words) >= 4 and words[3] in MODES else None,
    )


def task_starts(job_dir: str | Path, run: int) -> dict[str, float]:
    """Per node, seconds from run ``run``'s step start to its first task's first line."""
    return {node: seconds for node, (seconds, _) in _node_starts(job_dir, run).items()}


def _node_starts(job_dir: str | Path, run: int) -> dict[str, tuple[float, str | None]]:
    """Per node of run ``run``: (seconds from the step's start to its first task, its mode)."""
    progress = JobDir(job_dir).run_progress(run)
    try:
        step = _seconds(files.read_text(progress / JobDir.STEP_START, 64).strip())
    except OSError:
        return {}
    if step is None:
        return {}
    out: dict[str, tuple[float, str | None]] = {}
    for path in sorted(progress.glob(JobDir.TASK.format(rank="*"))):
        if not re.fullmatch(JobDir.TASK.format(rank=r"\d+"), path.name):
            continue
        record = read_task_record(path)
        if record is None or record[2] is None:
            continue
        node, _, start, mode = record
        seconds = round(start - step, 3)
        if node not in out or seconds < out[node][0]:
            out[node] = (seconds, mode)
    return out


def all_task_starts(job_dir: str | Path) -> list[dict]:
    """Every run's task starts: ``[{"run": 0, "node": "node1", "seconds": 1.2, "mode": "create"}, ...]``
    (mode None: a record from before kit wrote it)."""
    return [
        {"run": run, "node": node, "seconds": seconds, "mode": mode}
        for run in JobDir(job_dir).run_dirs(JobDir.PROGRESS)
        for node, (seconds, mode) in sorted(_node_starts(job_dir, run).items())
    ]
