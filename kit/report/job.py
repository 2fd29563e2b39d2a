"""A job's report: its series (from Prometheus when it holds the whole job, else the job's metrics logs) summarized and drawn, an array job's tasks as one table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from kit import files as kit_files
from kit import jobdir
from kit.errors import KitError
from kit.jobdir import JobDir, end_records, records
from kit.report.plot import NoPicture, _plot_tasks, _pyplot, plot
from kit.report.series import load_logs, load_prometheus, missed
from kit.report.summarize import summarize
from kit.report.summary import MIN_SECONDS, Summary


def report_job(
    job_dir: Path,
    job: str,
    out: Path,
    prometheus: str | None = None,
    min_seconds: float = MIN_SECONDS,
    notice=lambda e: None,
) -> Summary | TaskTable:
    """`kit report` and ``Job.report()``: a single job's summary and panels, or an array job's
    table of tasks; ``out`` the picture, its .json the numbers (``report.json``)."""
    if records.task_indices(job_dir):
        return TaskTable(job, report_tasks(job_dir, job, out, notice))
    return report(job_dir, job, out, prometheus, min_seconds, notice)


def report(
    job_dir: Path,
    job: str,
    out: Path,
    prometheus: str | None = None,
    min_seconds: float = MIN_SECONDS,
    notice=lambda e: None,
) -> Summary:
    """Summarize the job (``out``'s .json) and draw its panels (``out``); without
    matplotlib the summary still comes, and ``notice`` hears why there is no picture."""
    logs = load_logs(job_dir)  # also the job's time range for Prometheus
    series, source = logs.series, "metrics logs"
    if logs.missing:
        if not records.run_records(job_dir) and end_records.kept_outcome(job_dir) is None:
            raise KitError(
                f"nothing to report yet: {logs.missing}, and no run of it has been recorded",
                field="JOB",
                exit_code=1,
                hint="kit ps shows where it is",
            )
        source = f"{logs.missing}; what the job directory records"
    elif prometheus:
        times = [t for pts in logs.series.values() for t, _ in pts]
        try:
            scraped = load_prometheus(prometheus, job, min(times), max(times))
        except (OSError, ValueError, KeyError, TypeError):
            scraped = None
        if not scraped or not any(scraped.values()):
            source = "metrics logs (Prometheus unreachable)"
        elif lacks := missed(logs.series, scraped):
            source = f"metrics logs (Prometheus holds part of the job only: {lacks})"
        else:
            series, source = scraped, f"Prometheus {prometheus}"
    if logs.damaged:
        source += f"; {logs.damaged} damaged log line(s) skipped"
    summary = summarize(series, job, source, logs, job_dir, min_seconds)
    summary.task_starts = jobdir.all_task_starts(job_dir)
    try:
        if logs.missing:
            raise NoPicture(f"no picture: {logs.missing}")
        plot(series, summary, out, logs)
    except NoPicture as e:
        notice(e)
    kit_files.write_atomic(out.with_suffix(".json"), json.dumps(asdict(summary), indent=2) + "\n")
    return summary


@dataclass
class TaskSummary:
    task: int
    params: dict
    end: str
    restarts: int
    final_loss: float | None
    samples_per_second: float | None  # None: unknown (no samples reported, or no metrics at all)
    duration_seconds: float | None

    def line(self) -> str:
        params = " ".join(f"{k}={v}" for k, v in self.params.items()) or "-"
        loss = f"{self.final_loss:.5f}" if self.final_loss is not None else "-"
        rate = "-" if self.samples_per_second is None else f"{self.samples_per_second:.1f}"
        took = "-" if self.duration_seconds is None else f"{self.duration_seconds:.1f}"
        return f"{self.task:>5}  {params:<30.30}  {self.end:<10}  {self.restarts:>8}  {loss:>10}  {rate:>10}  {took:>8}"


TASK_HEADER = (
    f"{'task':>5}  {'parameters':<30}  {'end':<10}  {'restarts':>8}  {'final loss':>10}  "
    f"{'samples/s':>10}  {'time (s)':>8}"
)


@dataclass
class TaskTable:
    """An array job's report: a row per task (report.json: ``{"job", "tasks"}``)."""

    job: str
    tasks: list[TaskSummary]

    def lines(self) -> list[str]:
        return [f"job {self.job}: {len(self.tasks)} task(s)", TASK_HEADER, *(row.line() for row in self.tasks)]


def _task_summary(d: Path) -> tuple[TaskSummary, list]:
    params = records.params(d)
    ends = [rec.end for rec in records.run_records(d)]
    end = "finished" if end_records.finished(d) else (ends[-1] if ends else "not run")
    try:
        series = load_logs(d).series
    except KitError:
        series = {}
    summary = summarize(series, d.name, "metrics logs") if series else None
    losses = sorted(
        ((t, v) for (name, _, rank), pts in series.items() if name == "training_loss" for t, v in pts),
        key=lambda p: p[0],
    )
    curve = [
        (t, v)
        for (name, _, rank), pts in sorted(series.items())
        if name == "training_loss" and rank == "0"
        for t, v in pts
    ] or losses
    return TaskSummary(
        int(d.name),
        params,
        end,
        max(len(ends) - 1, 0),
        losses[-1][1] if losses else None,
        summary.samples_per_second if summary else None,
        summary.duration_seconds if summary else None,
    ), curve


def report_tasks(job_dir: Path, job: str, out: Path, notice=lambda e: None) -> list[TaskSummary]:
    """An array job: one line per task, and every task's loss curve in one figure."""
    dirs = [JobDir(job_dir).task(i).path for i in records.task_indices(job_dir)]
    if not dirs:
        raise KitError(f"no task directories in {job_dir / JobDir.TASKS}", field="JOB")
    rows, curves = [], []
    for d in dirs:
        row, curve = _task_summary(d)
        rows.append(row)
        curves.append(curve)
    try:
        plt = _pyplot()
    except NoPicture as e:
        notice(e)
    else:
        _plot_tasks(plt, job, rows, curves, out)
    kit_files.write_atomic(
        out.with_suffix(".json"), json.dumps({"job": job, "tasks": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    return rows
