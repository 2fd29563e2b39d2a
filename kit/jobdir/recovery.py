"""What kit's checkpoints did in a job (read only): each persisting interval kit chose and why, and what each run
resumed from — the step, how far the run before got, the tiers its ranks loaded from and how long that took. The
records are kit.train.checkpoint's and its keepers' (``checkpoints/interval.jsonl``, ``restore.r<run>.json``,
``loaded.r<run>.rank-<R>.json``); ``kit events``, ``kit report`` and ``report.json`` tell them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir


def intervals(job_dir: str | Path) -> list[dict]:
    """Each interval chosen, oldest first: time, from_step, every_steps, shared_every, the costs, mtbf, why."""
    out = []
    try:
        text = files.read_text(Path(job_dir) / JobDir.CHECKPOINTS / JobDir.CKPT_INTERVAL, 1 << 20)
    except (OSError, ValueError):
        return out
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(value, dict)
            and isinstance(value.get("every_steps"), int)
            and isinstance(value.get("time"), float)
        ):
            out.append(value)
    return out


def resumes(job_dir: str | Path) -> list[dict]:
    """Each run that resumed: run, time, step, newest (how far the runs before got), redone, tiers ({tier: ranks}),
    load_seconds (the slowest rank's)."""
    directory = Path(job_dir) / JobDir.CHECKPOINTS
    runs = sorted(
        int(m.group(1))
        for p in (directory.glob("restore.r*.json") if directory.is_dir() else [])
        if (m := re.fullmatch(JobDir.CKPT_RESTORE.replace(".", r"\.").format(run=r"(\d{1,6})"), p.name))
    )
    out = []
    for run in runs:
        decided = files.read_record(directory / JobDir.CKPT_RESTORE.format(run=run), 1 << 20)
        step, newest = decided.get("step"), decided.get("newest_held")
        if not isinstance(step, int) or step <= 0:
            continue
        tiers, seconds = {}, 0.0
        for p in directory.glob(JobDir.CKPT_LOADED.format(run=run, rank="*")):
            loaded = files.read_record(p, 1 << 20)
            if isinstance(loaded.get("tier"), str) and isinstance(loaded.get("seconds"), (int, float)):
                tiers[loaded["tier"]] = tiers.get(loaded["tier"], 0) + 1
                seconds = max(seconds, float(loaded["seconds"]))
        newest = newest if isinstance(newest, int) and newest >= step else step
        when = files.mtime(directory / JobDir.CKPT_RESTORE.format(run=run))
        out.append(
            {
                "run": run,
                "time": when,
                "step": step,
                "newest": newest,
                "redone": newest - step,
                "tiers": tiers,
                "load_seconds": seconds,
            }
        )
    return out


def interval_line(i: dict) -> str:
    shared = f", the job directory every {i['shared_every']} of those" if i.get("shared_every") else ""
    return f"checkpoints persisted every {i['every_steps']} step(s) from step {i.get('from_step', 0)}{shared}: {i.get('why', '?')}"


def resume_line(r: dict) -> str:
    tiers = ", ".join(f"{tier} x{n}" for tier, n in sorted(r["tiers"].items())) or "no rank's record"
    return (
        f"run {r['run']} resumed at step {r['step']} ({r['redone']} step(s) behind the furthest the runs before got) "
        f"from {tiers} in {r['load_seconds']:.2f} s"
    )


def lines(job_dir: str | Path) -> list[str]:
    """The report's lines: the interval in force at the end, and each resume."""
    chosen = intervals(job_dir)
    return ([interval_line(chosen[-1])] if chosen else []) + [resume_line(r) for r in resumes(job_dir)]
