"""The job directory's files that the training side writes and kit's readers read.

(The first piece of the one owner of the job directory's layout; see the
README's "The job directory".) Light on purpose: the reference trainer, a
plain script's ``kit.train.progress`` calls and the exporter all import it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kit import files


RANK_METRICS_GLOB = "rank-*.json"


def rank_of_metrics_file(name: str) -> int | None:
    """The rank whose metrics file is named ``name`` (None: not one)."""
    m = re.fullmatch(r"rank-(\d+)\.json", name)
    return int(m.group(1)) if m else None


def rank_metrics_path(directory: str | Path, rank: int) -> Path:
    """One rank's training metrics file in ``$KIT_METRICS_DIR`` (``metrics/<node>/``)."""
    return Path(directory) / f"rank-{rank}.json"


def write_rank_metrics(directory: str | Path, rank: int, values: dict) -> None:
    """Atomically (re)write one rank's training metrics (the exporter and kit ps read them)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    files.write_atomic(rank_metrics_path(directory, rank), json.dumps({"rank": rank, **values}))


# Where each run's tasks started: prelaunch writes the step's start (its clock,
# EPOCHREALTIME, just before srun) to progress/r<run>/step-start; each launcher,
# at its first line, its own start as the third word of progress/r<run>/task-<rank>
# ("node pid start"). Between the two lies what srun and the container plugin
# did before the task ran: under an image, the container's start.
STEP_START = "step-start"


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1e11 else None


def task_starts(job_dir: str | Path, run: int) -> dict[str, float]:
    """Per node, seconds from run ``run``'s step start to its first task's first line."""
    progress = Path(job_dir) / "progress" / f"r{run}"
    try:
        step = _seconds(files.read_text(progress / STEP_START, 64).strip())
    except OSError:
        return {}
    if step is None:
        return {}
    out: dict[str, float] = {}
    for path in sorted(progress.glob("task-*")):
        if not re.fullmatch(r"task-\d+", path.name):
            continue
        try:
            words = files.read_text(path, 4096).split()
        except OSError:
            continue
        start = _seconds(words[2]) if len(words) >= 3 else None
        if start is None or not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", words[0]):
            continue
        out[words[0]] = round(min(out.get(words[0], start - step), start - step), 3)
    return out


def all_task_starts(job_dir: str | Path) -> list[dict]:
    """Every run's task starts: ``[{"run": 0, "node": "node1", "seconds": 1.2}, ...]``."""
    runs = []
    for path in Path(job_dir, "progress").glob("r*"):
        if re.fullmatch(r"r\d{1,6}", path.name):
            runs.append(int(path.name[1:]))
    return [{"run": run, "node": node, "seconds": seconds}
            for run in sorted(runs) for node, seconds in sorted(task_starts(job_dir, run).items())]
