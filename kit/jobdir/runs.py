"""What a job's runs left besides logs: its tracker runs (as the trackers' own files tell them), its hang records and
its preflight verdicts."""

from __future__ import annotations

import re
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir

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


def fields_text(fields: dict) -> str:
    """A run's ``key=value`` record as prelaunch's kit::field reads it: a line per key, a list joined by commas, a
    value's newlines made spaces (the preflight verdict, a straggler verdict)."""
    return "".join(
        f"{k}={(','.join(v) if isinstance(v, list) else str(v)).replace(chr(10), ' ')}\n" for k, v in fields.items()
    )


def parse_fields(text: str) -> dict[str, str]:
    """The ``key=value`` lines of a run's record (a hang report, a verdict): each key's value, from its first ``=``."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def hangs(job_dir: Path) -> list[dict]:
    """Each run's hang, as prelaunch's watchdog reported it (``hang/r<run>/report``): ``run``, ``rank`` (a
    number, or ``unknown`` when no rank could be named), ``node``, ``summary``, and the blamed rank's stacks
    file (``stacks``: None when no rank was named or it wrote none). [] when no run hung."""
    d = JobDir(job_dir)
    out = []
    for run in d.run_dirs(JobDir.HANG):
        report = d.path / JobDir.HANG / JobDir.RUN.format(run=run) / JobDir.HANG_REPORT
        try:
            fields = parse_fields(files.read_text(report, 1 << 16))
        except (OSError, ValueError):
            continue
        rank = fields.get("rank", "unknown")
        stacks = report.parent / JobDir.HANG_STACKS.format(rank=rank)
        out.append(
            {
                "run": run,
                "rank": rank,
                "node": fields.get("node", ""),
                "summary": fields.get("summary", ""),
                "stacks": str(stacks) if rank.isdigit() and stacks.is_file() else None,
            }
        )
    return out


def verdict_text(v: dict) -> str:
    """A preflight verdict as every surface says it: ``ok (node1, node2 checked)``, ``failed (…): why``."""
    checked = ", ".join(v.get("checked") or []) or "no node"
    return f"{v.get('verdict', '?')} ({checked} checked)" + (f": {v['why']}" if v.get("why") else "")


def read_verdict(directory: Path) -> dict | None:
    """A run's preflight verdict (``progress/r<run>/preflight``, kit.preflight.verdict writes it) as written; None
    when there is none."""
    try:
        text = files.read_text(Path(directory) / JobDir.PREFLIGHT, 1 << 20)
    except OSError:
        return None
    fields = parse_fields(text)
    return {
        "verdict": fields.get("verdict", "?"),
        "nodes": [n for n in fields.get("nodes", "").split(",") if n],
        "why": fields.get("why", ""),
        "checked": [n for n in fields.get("checked", "").split(",") if n],
    }
