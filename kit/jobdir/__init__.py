"""The job directory: its one owner (docs/job-directory.md).

:class:`JobDir` names every file (``layout.py``); the training side's files are
written and read here; :mod:`kit.jobdir.records` reads a submitted job back and
writes the records the commands keep. Light on purpose: the reference trainer,
a plain script's ``kit.train.progress`` calls and the exporter all import this
module, and it imports only the bottom layer.
"""

from __future__ import annotations

import json
import os
import pwd
import re
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.jobdir.layout import JobDir

__all__ = ["JobDir", "RANK_METRICS_GLOB", "all_task_starts", "rank_metrics_path", "rank_of_metrics_file",
           "own", "read_rank_metrics", "read_task_record", "task_starts", "write_rank_metrics"]

RANK_METRICS_GLOB = JobDir.RANK_METRICS.format(rank="*")


def rank_of_metrics_file(name: str) -> int | None:
    """The rank whose metrics file is named ``name`` (None: not one)."""
    m = re.fullmatch(re.escape(JobDir.RANK_METRICS).replace(r"\{rank\}", r"(\d+)"), name)
    return int(m.group(1)) if m else None


def rank_metrics_path(directory: str | Path, rank: int) -> Path:
    """One rank's training metrics file in ``$KIT_METRICS_DIR`` (``metrics/<node>/``)."""
    return Path(directory) / JobDir.RANK_METRICS.format(rank=rank)


def read_rank_metrics(text: str) -> dict[str, float | str] | None:
    """A rank's metrics file (``rank-<R>.json``): its numbers as floats (NaN and infinities
    kept: a diverged loss is news; booleans and numbers beyond a float dropped) and its
    ``rank`` as written (a string, "?" when missing); None when it is not a JSON object.
    The one parser: the exporter and ``kit ps`` both read through it."""
    try:
        data = files.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    out: dict[str, float | str] = {}
    for key, value in data.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                out[key] = float(value)
            except OverflowError:  # an integer beyond a float's range
                continue
    out["rank"] = str(data.get("rank", "?"))[:64]
    return out


def write_rank_metrics(directory: str | Path, rank: int, values: dict) -> None:
    """Atomically (re)write one rank's training metrics (the exporter and kit ps read them)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    files.write_atomic(rank_metrics_path(directory, rank), json.dumps({"rank": rank, **values}))


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
    return (words[0], words[1], _seconds(words[2]) if len(words) >= 3 else None,
            words[3] if len(words) >= 4 and words[3] in MODES else None)


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
    return [{"run": run, "node": node, "seconds": seconds, "mode": mode}
            for run in JobDir(job_dir).run_dirs(JobDir.PROGRESS)
            for node, (seconds, mode) in sorted(_node_starts(job_dir, run).items())]


def owner(path: Path) -> int | None:
    """The uid owning ``path`` (never through a symlink), None when it cannot be read."""
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def owner_name(uid: int | None) -> str:
    """A uid as a person reads it: the login name, else ``uid N``."""
    try:
        return pwd.getpwuid(uid).pw_name if uid is not None else "an unknown user"
    except KeyError:
        return f"uid {uid}"


def own(path: Path) -> Path:
    """``path`` when this user owns it and no one else can write it: a pickle is code, and a
    result is loaded only from a job directory of the caller's own (root included)."""
    st = os.lstat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise KitError(f"{path} is not this user's own (owner uid {st.st_uid}, or others can write it): kit "
                       "neither runs nor loads what it holds", field="JOB",
                       hint="rerun a job, or read its results, as the user who submitted it")
    return path


def read_own(path: Path, limit: int) -> bytes:
    """The regular file ``path`` (never through a symlink), at most ``limit`` bytes, when this user owns it and no
    one else can write it — checked on the very file read (its descriptor), not on the path looked at again."""
    try:
        with files.open_regular(path) as (fd, st):
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise KitError(f"{path} is not this user's own (owner uid {st.st_uid}, or others can write it): "
                               "kit neither runs nor loads what it holds", field="JOB",
                               hint="rerun a job, or read its results, as the user who submitted it")
            if st.st_size > limit:
                raise KitError(f"{path} holds {st.st_size} bytes, more than the {limit} kit loads", field="JOB",
                               hint="return less (write large outputs to files and return their paths)")
            return files.read_fd(fd, limit)
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror}", field="JOB",
                       hint="a function job's results are the files its ranks wrote, nothing else") from None


def function_payloads(source: Path) -> dict[Path, bytes]:
    """A function job's pickled calls (the job's, or each ``kit.map`` task's), relative to its
    directory (``kit rerun`` writes them again): read only from files of the caller's own (a
    pickle is code)."""
    out = {}
    for unit in [JobDir(source), *(JobDir(source).task(i) for i in JobDir(source).task_indices())]:
        path = unit / JobDir.FUNCTION
        if os.path.lexists(path):
            try:
                out[path.relative_to(source)] = files.read_bytes(own(path), 1 << 31)
            except OSError as e:
                raise KitError(f"cannot read {path}: {e.strerror}", field="JOB") from None
    return out


_WANDB_RUN_DIR = re.compile(r"(offline-)?run-\d{8}_\d{6}-(.+)")


def tracker_runs(job_dir: Path) -> dict:
    """The job's tracker runs, as the trackers' own files in its ``tracker/`` tell them (kit.train.trackers):
    W&B's run ids (from its run directories' names: a user's own id too) and how many parts are offline
    (``wandb sync`` uploads them), the MLflow run the first run made, TensorBoard's directory. {} for none."""
    d = JobDir(job_dir)
    out: dict = {}
    ids, offline = set(), 0
    for p in (d / JobDir.TRACKER / "wandb").glob("*run-*"):
        m = _WANDB_RUN_DIR.fullmatch(p.name)
        if m and p.is_dir() and not p.is_symlink():
            ids.add(m.group(2))
            offline += bool(m.group(1))
    if ids:
        out["wandb"] = {"run_ids": sorted(ids), "offline_parts": offline, "dir": str(d / JobDir.TRACKER / "wandb")}
    try:
        mlflow = files.read_json(d / JobDir.TRACKER / JobDir.TRACKER_MLFLOW, 4096)
    except (OSError, ValueError):
        mlflow = None
    if isinstance(mlflow, dict) and isinstance(mlflow.get("run_id"), str):
        out["mlflow"] = {"run_id": mlflow["run_id"], "tracking_uri": str(mlflow.get("tracking_uri") or "")}
    board = d / JobDir.TRACKER / JobDir.TRACKER_TENSORBOARD
    if any(board.glob("events.out.tfevents.*")):
        out["tensorboard"] = {"dir": str(board)}
    return out


def hangs(job_dir: Path) -> list[dict]:
    """Each run's hang, as prelaunch's watchdog reported it (``hang/r<run>/report``): ``run``, ``rank`` (a
    number, or ``unknown`` when no rank could be named), ``node``, ``summary``, and the blamed rank's stacks
    file (``stacks``: None when no rank was named or it wrote none). [] when no run hung."""
    d = JobDir(job_dir)
    out = []
    for run in d.run_dirs(JobDir.HANG):
        report = d.path / JobDir.HANG / JobDir.RUN.format(run=run) / JobDir.HANG_REPORT
        try:
            lines = files.read_text(report, 1 << 16).splitlines()
        except (OSError, ValueError):
            continue
        fields = dict(line.partition("=")[::2] for line in lines if "=" in line)
        rank = fields.get("rank", "unknown")
        stacks = report.parent / JobDir.HANG_STACKS.format(rank=rank)
        out.append({"run": run, "rank": rank, "node": fields.get("node", ""), "summary": fields.get("summary", ""),
                    "stacks": str(stacks) if rank.isdigit() and stacks.is_file() else None})
    return out
