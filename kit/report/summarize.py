"""A job's series made into its :class:`~kit.report.summary.Summary`: per node its CPU and memory against what it held,
the training's loss, throughput, TFLOP/s and step time, the time lost to restarts, its trackers and hangs, and the
notes."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from kit.core.outcome import Outcome
from kit.jobdir import end_records, hangs, records, recovery, slow_ranks, tracker_runs
from kit.jobdir.goodput import goodput
from kit.jobdir.layout import JobDir
from kit.jobdir.runs import read_verdict
from kit.jobdir.tally import Tally, tally
from kit.notify import ledger
from kit.report.series import IDLE_UTIL, Logs, Series, _of, _steady_pairs, increase, mean_rate
from kit.report.summary import MIN_SECONDS, GpuSummary, NodeSummary, Note, Summary, notes


def _node_busy(series: Series, node: str) -> float | None:
    """The node's CPUs' busy share (%), from the per-mode CPU counters."""
    modes = _of(series, "node_cpu_seconds_total", node)
    total = idle = 0.0
    for (_, _, mode), points in modes.items():
        inc = sum(q[1] - p[1] for p, q in _steady_pairs(points) if q[1] >= p[1])
        total += inc
        if mode in ("idle", "iowait"):
            idle += inc
    return 100.0 * (1 - idle / total) if total > 0 else None


def _last(series: Series, metric: str, node: str) -> float | None:
    values = [pts[-1][1] for pts in _of(series, metric, node).values()]
    return values[0] if values else None


def _peak(series: Series, metric: str, node: str) -> float | None:
    values = [v for pts in _of(series, metric, node).values() for _, v in pts]
    return max(values) if values else None


def _node_summary(series: Series, node: str) -> NodeSummary:
    cpus = _last(series, "kit_job_cpus", node)
    cpu_points = next(iter(_of(series, "kit_job_cpu_seconds_total", node).values()), [])
    used = mean_rate(cpu_points, resets=False)
    limit, limit_of = _last(series, "kit_job_memory_limit_bytes", node), "allocation"
    if limit is None:
        limit, limit_of = _last(series, "node_memory_MemTotal_bytes", node), "node"
    peak = _peak(series, "kit_job_memory_rss_bytes", node)
    rank_rates = [
        r for pts in _of(series, "training_samples_total", node).values() if (r := mean_rate(pts)) is not None
    ]
    return NodeSummary(
        node=node,
        cpus_allocated=cpus,
        cpu_cores_used=used,
        cpu_efficiency_percent=100.0 * used / cpus if used is not None and cpus else None,
        node_cpu_busy_percent=_node_busy(series, node),
        memory_peak_bytes=peak,
        memory_limit_bytes=limit,
        memory_limit_of=limit_of,
        memory_peak_percent=100.0 * peak / limit if peak is not None and limit else None,
        samples_per_second=sum(rank_rates) if rank_rates else None,
    )


def _checkpoint_steps(job_dir: Path | None) -> dict[int, float]:
    """Each run's checkpoint step at its end (``runs.jsonl``; -1: none)."""
    return {rec.run: float(rec.checkpoint_step) for rec in (records.run_records(job_dir) if job_dir else [])}


def summarize(
    series: Series,
    job: str,
    source: str,
    logs: Logs | None = None,
    job_dir: Path | None = None,
    min_seconds: float = MIN_SECONDS,
) -> Summary:
    times = [t for points in series.values() for t, _ in points]
    duration = (max(times) - min(times)) if times else 0.0
    counted = _of(series, "training_samples_total")
    # None: unknown — none reported, or one poll only (an increase needs two)
    samples = sum(increase(points) for points in counted.values()) if counted and duration else None
    gpus = []
    for (_, node, gpu), points in _of(series, "DCGM_FI_DEV_GPU_UTIL").items():
        values = [v for _, v in points]
        idle = sum(t2 - t1 for (t1, v), (t2, _) in zip(points, points[1:]) if v < IDLE_UTIL)
        power = [v for _, v in series.get(("DCGM_FI_DEV_POWER_USAGE", node, gpu), [])]
        used = series.get(("DCGM_FI_DEV_FB_USED", node, gpu), [])
        free = dict(series.get(("DCGM_FI_DEV_FB_FREE", node, gpu), []))
        totals = [v + free[t] for t, v in used if t in free]
        procs = [v for _, v in series.get(("gpu_compute_processes", node, gpu), [])]
        gpus.append(
            GpuSummary(
                node,
                gpu,
                sum(values) / len(values),
                max(values),
                idle,
                sum(power) / len(power) if power else None,
                max(v for _, v in used) if used else None,
                max(totals) if totals else None,
                100.0 * sum(1 for v in procs if v == 0) / len(procs) if procs else None,
            )
        )
    nodes = sorted(
        {
            k[1]
            for k in series
            if k[0]
            in (
                "kit_job_cpu_seconds_total",
                "node_cpu_seconds_total",
                "kit_job_memory_rss_bytes",
                "training_samples_total",
            )
        }
    )
    summary = Summary(
        job,
        source,
        duration,
        samples,
        None if samples is None else samples / duration,
        gpus,
        [_node_summary(series, n) for n in nodes],
        metrics_seconds=duration,
        measured=not (logs and logs.missing),
    )
    if job_dir:
        _counted(summary, tally(job_dir, running=False))
    losses = sorted(p for k, pts in _of(series, "training_loss").items() if k[2] == "0" for p in pts)
    if losses:
        summary.first_loss, summary.last_loss = losses[0][1], losses[-1][1]
    for name, attr in (("training_tflops", "tflops"), ("training_mfu", "mfu")):
        values = [v for k, pts in _of(series, name).items() if k[2] == "0" for _, v in pts]
        setattr(summary, attr, statistics.fmean(values) if values else None)
    steps = [v for pts in _of(series, "training_step_duration_seconds").values() for _, v in pts]
    summary.mean_step_seconds = sum(steps) / len(steps) if steps else None
    if logs is not None and logs.runs:
        _restarts(summary, logs, _checkpoint_steps(job_dir))
    if job_dir:
        _timeline(summary, job_dir)
    summary.trackers = tracker_runs(job_dir) if job_dir else {}
    summary.checkpoints = recovery.lines(job_dir) if job_dir else []
    summary.hangs = [{k: h[k] for k in ("run", "rank", "node", "summary")} for h in hangs(job_dir)] if job_dir else []
    summary.notes = notes(summary, min_seconds) + (_resumed_behind(job_dir) if job_dir else [])
    return summary


def _counted(summary: Summary, counted: Tally | None) -> None:
    """The job's throughput and duration as every surface gives them (kit.jobdir.tally), in place of the series'
    own: their span is the metrics', and a counter first seen at its end (a short job) increased by nothing."""
    if counted is None:
        return
    summary.duration_seconds, summary.from_submission = counted.wall_seconds, True
    summary.samples, summary.samples_per_second = counted.samples, counted.rate()
    summary.stepping_seconds = counted.stepping_seconds
    summary.exporters_lost = [lost.line() for lost in counted.lost]
    for n in summary.nodes:
        n.samples_per_second = counted.rate(n.node)  # None for a node whose exporter was lost: never judged


def _timeline(summary: Summary, job_dir: Path) -> None:
    """What the job directory's records say of the job's time: its goodput (the GPUs' idle time from their
    samples added), its runs (a run may have left no metrics log), each run's preflight verdict and the ranks
    named stragglers."""
    summary.ended = _told_outcome(job_dir)
    summary.goodput = goodput(job_dir)
    if summary.goodput is not None:
        summary.runs = summary.goodput.runs
        if summary.gpus:
            summary.goodput.idle_gpu_seconds = sum(g.idle_seconds for g in summary.gpus) / len(summary.gpus)
    d = JobDir(job_dir)
    summary.preflight = [
        {"run": run, **v} for run in d.run_dirs(JobDir.PROGRESS) if (v := read_verdict(d.run_progress(run)))
    ]
    summary.stragglers = [asdict(s) for s in slow_ranks.read(job_dir)]
    summary.undelivered = [{k: str(u.get(k)) for k in ("key", "shown", "error")} for u in ledger.undelivered(job_dir)]


def _restarts(summary: Summary, logs: Logs, checkpoints: dict[int, float]) -> None:
    """Time lost to restarts: each ended run's steps past its last checkpoint
    (redone by the next run) at the mean step time, and the break between runs."""
    order = sorted(logs.runs)
    summary.runs = len(order)
    for run, following in zip(order, order[1:]):
        reached = logs.run_steps.get(run)
        if reached is not None:
            summary.redone_steps += max(reached - max(checkpoints.get(run, -1.0), 0.0), 0.0)
        summary.restart_gap_seconds += max(logs.runs[following][0] - logs.runs[run][1], 0.0)
    summary.lost_seconds = summary.redone_steps * (summary.mean_step_seconds or 0.0) + summary.restart_gap_seconds


def _told_outcome(job_dir: Path) -> str | None:
    """The job's end as ``--wait`` told it (``ended STATE: meaning (exit code N)``: kit.job.settle.observe keeps
    it), where kit saw it end; Slurm's end state alone where only `kit ps` saw it; None where kit has seen no end (it
    runs, or nobody asked)."""
    kept = end_records.kept_outcome(job_dir)
    if kept is None:
        return None
    state = kept["state"]
    try:
        meaning = str(kept["meaning"])
        if not meaning.isprintable():
            raise ValueError(meaning)
        return Outcome(state, int(kept["exit_code"]), meaning, int(kept.get("restarts", 0))).describe()
    except (KeyError, TypeError, ValueError):
        return f"ended {state}"


def _resumed_behind(job_dir: Path) -> list[Note]:
    """Each run that resumed from an older state than a tier held (kit's checkpoints: steps made again)."""
    return [
        Note(
            "warning",
            f"run {r['run']} resumed at step {r['step']}, {r['redone']} step(s) behind step {r['newest']} that a tier "
            "held: not every rank's state of it was left on a tier (a lost node's memory and disk, or a step not yet "
            "persisted)",
        )
        for r in recovery.resumes(job_dir)
        if r["redone"] > 0
    ]
