"""`kit report`: what a job used of what it held, as a PNG, a summary and notes.

Panels only for what was measured (GPU utilisation, memory and power when
GPUs were seen; the job's CPU and memory per node; loss, step time and
throughput per rank), restarts marked on the time axis; notes in the manner
of Princeton's jobstats, each with its threshold, and every number they use
in ``report.json``.

Data comes from Prometheus when it is reachable (the local cluster's, or
``--prometheus URL``), and from the per-node JSONL metrics logs in the job
directory otherwise, so a job can be analysed with no Prometheus at all.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit import files as kit_files  # (load_logs has its own `files`)
from kit import jobdir
from kit.errors import KitError

IDLE_UTIL = 5.0  # % under which a GPU counts as idle
GAP = 10.0       # s between two polls beyond which they are a break (between runs): no rate across it

# The notes' thresholds (jobstats' where it has one); each note's text carries its own.
GPU_ALERT, GPU_WARNING = 15.0, 25.0  # mean GPU utilisation, %
UNUSED_GPU = 50.0                    # % of the samples with no compute process on the GPU
GPU_MEMORY_LOW = 50.0                # peak GPU memory, % of the GPU's
CPU_LOW = 50.0                       # the job's CPU use, % of its allocated cores
MEMORY_LOW, MEMORY_HIGH = 25.0, 90.0  # the job's peak memory, % of its allocation (or the node's)
SLOW_NODE = 80.0                     # a node's samples/s, % of the median node's
MIN_SECONDS = 300.0                  # utilisation notes need this much data (jobstats: 300 s)

GIB = 1024 ** 3
# series key -> list of (time, value); key = (metric, node, gpu-or-rank-or-mode)
Series = dict


@dataclass
class Logs:
    """A job's metrics logs: the series, how many damaged lines were skipped,
    and each run's span of poll times and highest training step."""

    series: Series
    damaged: int = 0
    runs: dict = field(default_factory=dict)       # run -> [first poll time, last poll time]
    run_steps: dict = field(default_factory=dict)  # run -> highest training_step seen


@dataclass
class NodeSummary:
    node: str
    cpus_allocated: float | None
    cpu_cores_used: float | None       # the job's processes, mean over the run
    cpu_efficiency_percent: float | None
    node_cpu_busy_percent: float | None  # the whole node's CPUs (other jobs included)
    memory_peak_bytes: float | None    # the job's processes
    memory_limit_bytes: float | None
    memory_limit_of: str               # "allocation" or "node"
    memory_peak_percent: float | None
    samples_per_second: float | None   # the node's ranks together

    def line(self) -> str:
        parts = []
        if self.cpu_cores_used is not None:
            of = f" of {self.cpus_allocated:.0f} allocated" if self.cpus_allocated else ""
            eff = f" ({self.cpu_efficiency_percent:.0f} %)" if self.cpu_efficiency_percent is not None else ""
            parts.append(f"CPU {self.cpu_cores_used:.2f}{of} cores{eff}")
        if self.node_cpu_busy_percent is not None:
            parts.append(f"node CPUs {self.node_cpu_busy_percent:.0f} % busy")
        if self.memory_peak_bytes is not None:
            limit = (f" of {self.memory_limit_bytes / GIB:.2f} GiB ({self.memory_limit_of}, "
                     f"{self.memory_peak_percent:.0f} %)") if self.memory_limit_bytes else ""
            parts.append(f"memory peak {self.memory_peak_bytes / GIB:.2f} GiB{limit}")
        if self.samples_per_second is not None:
            parts.append(f"{self.samples_per_second:.1f} samples/s")
        return f"{self.node}: " + ("; ".join(parts) or "no node samples")


@dataclass
class GpuSummary:
    node: str
    gpu: str
    mean_util: float
    peak_util: float
    idle_seconds: float
    mean_power_w: float | None
    peak_memory_mib: float | None
    memory_total_mib: float | None = None
    no_process_percent: float | None = None  # % of the samples with no compute process on it

    def line(self) -> str:
        power = f", mean power {self.mean_power_w:.0f} W" if self.mean_power_w is not None else ""
        mem = ""
        if self.peak_memory_mib is not None:
            total = f" of {self.memory_total_mib / 1024:.1f}" if self.memory_total_mib else ""
            mem = f", peak memory {self.peak_memory_mib / 1024:.1f}{total} GiB"
        return (f"{self.node} gpu{self.gpu}: mean util {self.mean_util:.1f}%, peak {self.peak_util:.0f}%, "
                f"idle {self.idle_seconds:.0f} s{power}{mem}")


@dataclass
class Note:
    level: str  # "alert", "warning" or "info"
    text: str


@dataclass
class Summary:
    job: str
    source: str
    duration_seconds: float
    samples: float | None               # None: the job reported no samples (unknown, not zero)
    samples_per_second: float | None
    gpus: list[GpuSummary] = field(default_factory=list)
    nodes: list[NodeSummary] = field(default_factory=list)
    runs: int = 1
    first_loss: float | None = None
    last_loss: float | None = None
    mean_step_seconds: float | None = None
    redone_steps: float = 0.0
    restart_gap_seconds: float = 0.0
    lost_seconds: float = 0.0
    notes: list[Note] = field(default_factory=list)
    panels: list[str] = field(default_factory=list)
    # Per run and node: seconds from the step's start to the first task's first line
    # (srun's launch, and under an image the container's start: kit.jobdir.task_starts).
    task_starts: list[dict] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"job {self.job} (data: {self.source})",
               f"duration: {self.duration_seconds:.1f} s, {self.runs} run(s) ({self.runs - 1} restart(s))",
               "samples: -" if self.samples is None else
               f"samples: {self.samples:.0f} ({self.samples_per_second:.1f} samples/s)"]
        if self.first_loss is not None:
            out.append(f"loss (rank 0): {self.first_loss:.4g} -> {self.last_loss:.4g}")
        out += [n.line() for n in self.nodes]
        if self.task_starts:
            by_run: dict[int, list[str]] = {}
            for t in self.task_starts:
                by_run.setdefault(t["run"], []).append(f"{t['node']} {t['seconds']:.1f} s")
            out.append("task start after srun (with an image: the container's start): " +
                       "; ".join(f"run {run}: {', '.join(v)}" for run, v in sorted(by_run.items())))
        if not self.gpus:
            out.append("GPUs: no GPU samples (no NVML on the nodes)")
        out += [g.line() for g in self.gpus]
        if self.notes:
            out.append("notes:")
            out += [f"  {n.level.upper()}: {n.text}" for n in self.notes]
        return out


def _number(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        x = float(x)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def parse_record(line: str) -> list[tuple[tuple[str, str, str], float, float]] | None:
    """One metrics-log line as ((metric, node, gpu-or-rank-or-mode), time, value)
    points; None when the line is damaged (torn, not a record, bad fields)."""
    try:
        rec = kit_files.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("samples", []), list):
        return None
    t = _number(rec.get("time"))
    if t is None:
        return None
    node = str(rec.get("node", "?"))
    points = []
    for sample in rec.get("samples", []):
        if not (isinstance(sample, list) and len(sample) == 3 and isinstance(sample[0], str)
                and isinstance(sample[1], dict)):
            return None
        value = _number(sample[2])
        if value is None:
            continue  # a value that is not a number: that sample only
        labels = sample[1]
        points.append(((sample[0], node, str(labels.get("gpu") or labels.get("rank") or labels.get("mode") or "")),
                       t, value))
    return points


LONGEST_RECORD = 1 << 20  # one exporter poll's line is a few kB


def load_logs(job_dir: Path) -> Logs:
    """The job's metrics logs (``logs/<node>.r<run>.metrics.jsonl``)."""
    logs = Logs(defaultdict(list))
    paths = sorted((job_dir / "logs").glob("*.metrics.jsonl"))
    if not paths:
        raise KitError(f"no metrics logs in {job_dir / 'logs'}", field="JOB",
                       hint="the job ran without the exporter (--no-exporter), or has not started")
    for path in paths:
        m = re.fullmatch(r".*\.r(\d+)\.metrics\.jsonl", path.name)
        run = int(m.group(1)) if m else 0
        try:
            for line in kit_files.lines(path, longest=LONGEST_RECORD):
                points = parse_record(line) if line is not None else None
                if points is None:
                    logs.damaged += 1
                    continue
                for key, t, value in points:
                    logs.series[key].append((t, value))
                    span = logs.runs.setdefault(run, [t, t])
                    span[0], span[1] = min(span[0], t), max(span[1], t)
                    if key[0] == "training_step":
                        logs.run_steps[run] = max(logs.run_steps.get(run, value), value)
        except OSError:  # not a regular file, or unreadable: this log only
            logs.damaged += 1
    if not any(logs.series.values()):
        raise KitError(f"no readable samples in the metrics logs in {job_dir / 'logs'}"
                       + (f" ({logs.damaged} damaged line(s))" if logs.damaged else ""), field="JOB", exit_code=1,
                       hint="the job ended before its exporter's first poll, or its disk was full")
    for points in logs.series.values():
        points.sort()
    return logs


# What Prometheus is asked for: every logged metric, per-CPU counters summed per mode.
def _queries(job: str) -> list[tuple[str, str]]:
    from kit.monitor.exporter import LOGGED, LOGGED_SUMMED

    array_id, sep, task = job.partition("_")
    sel = f'{{slurm_array_job_id="{array_id}",slurm_array_task_id="{task}"}}' if sep else f'{{slurm_job_id="{job}"}}'
    return ([(name, f"{name}{sel}") for name in LOGGED]
            + [(name, f"sum by (node, {by}) ({name}{sel})") for name, by in LOGGED_SUMMED.items()])


def load_prometheus(url: str, job: str, start: float, end: float, step: float = 1.0) -> Series:
    series: Series = defaultdict(list)
    for metric, query in _queries(job):
        q = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": step})
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=10) as r:
            data = json.load(r)["data"]["result"]
        for s in data:
            m = s["metric"]
            key = (metric, m.get("node", "?"), m.get("gpu") or m.get("rank") or m.get("mode") or "")
            series[key] = [(float(t), float(v)) for t, v in s["values"]]
    return series


# kit_job_cpu_seconds_total is a sum over the job's live processes: it falls when
# one ends (under pyxis the first task's process carries `enroot create`'s CPU
# time until it exits). Such a fall is that process's total leaving the sum, not
# a counter starting again from 0: it adds nothing (resets=False), where reading
# it as a reset added the whole new value (114 % of an allocation was seen).
# Restarts are the run records' to tell (logs.runs), never a counter's.


def _step(a: float, b: float, resets: bool) -> float:
    """A counter's increase from ``a`` to ``b``: a fall is a reset from 0 (``resets``) or nothing."""
    return b - a if b >= a else (b if resets else 0.0)


def increase(points: list, resets: bool = True) -> float:
    """A counter's increase over a series (it restarts from 0 after a requeue)."""
    return sum(_step(a, b, resets) for (_, a), (_, b) in zip(points, points[1:]))


def _steady_pairs(points: list) -> list:
    """Consecutive polls no more than GAP apart (not across a break between runs)."""
    return [(p, q) for p, q in zip(points, points[1:]) if 0 < q[0] - p[0] <= GAP]


def mean_rate(points: list, resets: bool = True) -> float | None:
    """A counter's mean rate per second over the polls, breaks left out."""
    pairs = _steady_pairs(points)
    seconds = sum(q[0] - p[0] for p, q in pairs)
    if not seconds:
        return None
    return sum(_step(p[1], q[1], resets) for p, q in pairs) / seconds


def rates(points: list, resets: bool = True) -> list[tuple[float, float]]:
    """A counter as (midpoint time, rate) points, breaks left out."""
    return [((p[0] + q[0]) / 2, _step(p[1], q[1], resets) / (q[0] - p[0])) for p, q in _steady_pairs(points)]


def _of(series: Series, metric: str, node: str | None = None) -> dict[tuple, list]:
    return {k: v for k, v in sorted(series.items()) if k[0] == metric and v and (node is None or k[1] == node)}


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
    rank_rates = [r for pts in _of(series, "training_samples_total", node).values()
                  if (r := mean_rate(pts)) is not None]
    return NodeSummary(
        node=node, cpus_allocated=cpus, cpu_cores_used=used,
        cpu_efficiency_percent=100.0 * used / cpus if used is not None and cpus else None,
        node_cpu_busy_percent=_node_busy(series, node), memory_peak_bytes=peak, memory_limit_bytes=limit,
        memory_limit_of=limit_of,
        memory_peak_percent=100.0 * peak / limit if peak is not None and limit else None,
        samples_per_second=sum(rank_rates) if rank_rates else None)


def _checkpoint_steps(job_dir: Path | None) -> dict[int, float]:
    """Each run's checkpoint step at its end (``runs.jsonl``; -1: none)."""
    out = {}
    try:
        lines = kit_files.read_text(job_dir / "runs.jsonl").splitlines() if job_dir else []
    except OSError:
        lines = []
    for line in lines:
        try:
            rec = kit_files.loads(line)
            out[int(rec["run"])] = float(rec["checkpoint_step"])
        except (ValueError, KeyError, TypeError, OverflowError):
            continue
    return out


def summarize(series: Series, job: str, source: str, logs: Logs | None = None,
              job_dir: Path | None = None, min_seconds: float = MIN_SECONDS) -> Summary:
    times = [t for points in series.values() for t, _ in points]
    duration = (max(times) - min(times)) if times else 0.0
    counted = _of(series, "training_samples_total")
    samples = sum(increase(points) for points in counted.values()) if counted else None
    gpus = []
    for (_, node, gpu), points in _of(series, "DCGM_FI_DEV_GPU_UTIL").items():
        values = [v for _, v in points]
        idle = sum(t2 - t1 for (t1, v), (t2, _) in zip(points, points[1:]) if v < IDLE_UTIL)
        power = [v for _, v in series.get(("DCGM_FI_DEV_POWER_USAGE", node, gpu), [])]
        used = series.get(("DCGM_FI_DEV_FB_USED", node, gpu), [])
        free = dict(series.get(("DCGM_FI_DEV_FB_FREE", node, gpu), []))
        totals = [v + free[t] for t, v in used if t in free]
        procs = [v for _, v in series.get(("gpu_compute_processes", node, gpu), [])]
        gpus.append(GpuSummary(node, gpu, sum(values) / len(values), max(values), idle,
                               sum(power) / len(power) if power else None,
                               max(v for _, v in used) if used else None, max(totals) if totals else None,
                               100.0 * sum(1 for v in procs if v == 0) / len(procs) if procs else None))
    nodes = sorted({k[1] for k in series if k[0] in ("kit_job_cpu_seconds_total", "node_cpu_seconds_total",
                                                       "kit_job_memory_rss_bytes", "training_samples_total")})
    summary = Summary(job, source, duration, samples,
                      None if samples is None else (samples / duration if duration else 0.0), gpus,
                      [_node_summary(series, n) for n in nodes])
    losses = sorted(p for k, pts in _of(series, "training_loss").items() if k[2] == "0" for p in pts)
    if losses:
        summary.first_loss, summary.last_loss = losses[0][1], losses[-1][1]
    steps = [v for pts in _of(series, "training_step_duration_seconds").values() for _, v in pts]
    summary.mean_step_seconds = sum(steps) / len(steps) if steps else None
    if logs is not None and logs.runs:
        _restarts(summary, logs, _checkpoint_steps(job_dir))
    summary.notes = notes(summary, min_seconds)
    return summary


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


def notes(s: Summary, min_seconds: float = MIN_SECONDS) -> list[Note]:
    """What an engineer should look at, jobstats-style, each with its threshold."""
    out: list[Note] = []
    if s.duration_seconds < min_seconds:
        out.append(Note("info", f"the job ran {s.duration_seconds:.0f} s: utilisation notes need "
                                f"{min_seconds:.0f} s of samples (--min-seconds)"))
    else:
        for g in s.gpus:
            name = f"{g.node} gpu{g.gpu}"
            if g.no_process_percent is not None and g.no_process_percent >= UNUSED_GPU:
                out.append(Note("alert", f"{name}: held with no process on it in {g.no_process_percent:.0f} % "
                                         f"of the samples (at least {UNUSED_GPU:.0f} %): ask for fewer GPUs, "
                                         f"or check that every rank found its GPU"))
            if g.mean_util < GPU_ALERT:
                out.append(Note("alert", f"{name}: mean utilisation {g.mean_util:.1f} %, under {GPU_ALERT:.0f} %"))
            elif g.mean_util < GPU_WARNING:
                out.append(Note("warning", f"{name}: mean utilisation {g.mean_util:.1f} %, under {GPU_WARNING:.0f} %"))
            if g.peak_memory_mib is not None and g.memory_total_mib:
                share = 100.0 * g.peak_memory_mib / g.memory_total_mib
                if share < GPU_MEMORY_LOW:
                    out.append(Note("info", f"{name}: peak memory {share:.0f} % of the GPU's, under "
                                            f"{GPU_MEMORY_LOW:.0f} %: a larger batch would fit"))
        for n in s.nodes:
            if n.cpu_efficiency_percent is not None and n.cpu_efficiency_percent < CPU_LOW:
                out.append(Note("warning", f"{n.node}: the job used {n.cpu_cores_used:.2f} of "
                                           f"{n.cpus_allocated:.0f} allocated cores ({n.cpu_efficiency_percent:.0f} %, "
                                           f"under {CPU_LOW:.0f} %): ask for fewer CPUs, or use them (data loaders)"))
            if n.memory_peak_percent is not None and n.memory_peak_percent > MEMORY_HIGH:
                out.append(Note("warning", f"{n.node}: memory peak {n.memory_peak_percent:.0f} % of the "
                                           f"{n.memory_limit_of}'s, over {MEMORY_HIGH:.0f} %: close to the limit"))
            elif (n.memory_peak_percent is not None and n.memory_peak_percent < MEMORY_LOW
                  and n.memory_limit_of == "allocation"):
                out.append(Note("info", f"{n.node}: memory peak {n.memory_peak_percent:.0f} % of the allocation, "
                                        f"under {MEMORY_LOW:.0f} %: ask for less"))
    if s.runs > 1:
        out.append(Note("warning", f"{s.runs - 1} restart(s) cost about {s.lost_seconds:.0f} s: "
                                   f"{s.redone_steps:.0f} step(s) redone from the last checkpoint, "
                                   f"{s.restart_gap_seconds:.0f} s between runs"))
    rated = [n for n in s.nodes if n.samples_per_second is not None]
    if len(rated) > 1:
        ordered = sorted(n.samples_per_second for n in rated)
        median = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
        for n in rated:
            if median > 0 and n.samples_per_second < SLOW_NODE / 100 * median:
                out.append(Note("warning", f"{n.node}: {n.samples_per_second:.1f} samples/s, under "
                                           f"{SLOW_NODE:.0f} % of the median node's {median:.1f}: a slow node"))
    severity = {"alert": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda n: severity[n.level])


def _panels(series: Series) -> list[tuple[str, list[tuple[str, list, dict]]]]:
    """The panels that have data: (title, [(label, points, style)])."""
    out = []

    def lines(metric: str, label, scale: float = 1.0) -> list:
        return [(label(k), [(t, v * scale) for t, v in pts], {}) for k, pts in _of(series, metric).items()]
    for metric, title in (("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%)"),
                          ("DCGM_FI_DEV_FB_USED", "GPU memory used (MiB)"),
                          ("DCGM_FI_DEV_POWER_USAGE", "GPU power (W)")):
        out.append((title, lines(metric, lambda k: f"{k[1]} gpu{k[2]}")))
    cpu = [(f"{k[1]} job", rates(pts, resets=False), {}) for k, pts in _of(series, "kit_job_cpu_seconds_total").items()]
    cpu += [(f"{k[1]} allocated", pts, {"linestyle": "--"}) for k, pts in _of(series, "kit_job_cpus").items()]
    for node in sorted({k[1] for k in _of(series, "node_cpu_seconds_total")}):
        busy = [rates(pts) for k, pts in _of(series, "node_cpu_seconds_total", node).items()
                if k[2] not in ("idle", "iowait")]
        if busy:
            cpu.append((f"{node} whole node", [(t, sum(r[i][1] for r in busy)) for i, (t, _) in enumerate(busy[0])
                                               if all(len(r) > i for r in busy)], {"linestyle": ":"}))
    out.append(("CPU (cores busy)", cpu))
    mem = [(f"{k[1]} job", [(t, v / GIB) for t, v in pts], {}) for k, pts in _of(series, "kit_job_memory_rss_bytes").items()]
    mem += [(f"{k[1]} allocated", [(t, v / GIB) for t, v in pts], {"linestyle": "--"})
            for k, pts in _of(series, "kit_job_memory_limit_bytes").items()]
    out.append(("Memory (GiB)", mem))
    out.append(("Training loss", lines("training_loss", lambda k: f"rank {k[2]}")))
    out.append(("Step time (s)", lines("training_step_duration_seconds", lambda k: f"rank {k[2]}")))
    out.append(("Training throughput (samples/s)",
                [(f"rank {k[2]} ({k[1]})", rates(pts), {}) for k, pts in _of(series, "training_samples_total").items()]))
    return [(title, [c for c in curves if c[1]]) for title, curves in out if any(c[1] for c in curves)]


class NoPicture(KitError):
    """The picture cannot be drawn here (matplotlib, the `report` extra, is missing)."""


def _pyplot():
    """matplotlib's pyplot, drawing to files (Agg); NoPicture when it is not installed."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise NoPicture("no picture: matplotlib is not installed", exit_code=1,
                        hint="pip install 'kit[report]' (the numbers and report.json need nothing more)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(series: Series, summary: Summary, out: Path, logs: Logs | None = None) -> None:
    panels = _panels(series)
    summary.panels = [title for title, _ in panels]
    plt = _pyplot()
    t0 = min((t for pts in series.values() for t, _ in pts), default=0.0)
    restarts = sorted((run, span[0]) for run, span in (logs.runs.items() if logs else ()) if run > 0)
    fig, axes = plt.subplots(max(len(panels), 1), 1, figsize=(10, 2.6 * max(len(panels), 1) + 0.6),
                             sharex=True, squeeze=False)
    for ax, (title, curves) in zip(axes[:, 0], panels):
        for label, pts, style in curves:
            ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], label=label, **style)
        for run, t in restarts:
            ax.axvline(t - t0, color="red", linewidth=0.8, alpha=0.7)
            if ax is axes[0, 0]:
                ax.annotate(f"run {run}", (t - t0, 1.0), xycoords=("data", "axes fraction"), color="red",
                            fontsize="small", va="bottom")
        ax.set_title(title)
        ax.legend(fontsize="small", ncol=4)
    if not panels:
        axes[0, 0].set_axis_off()
    axes[-1, 0].set_xlabel("seconds since the first sample" + ("; red lines: restarts" if restarts else ""))
    fig.suptitle(f"kit job {summary.job}")
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)


def _save(fig, out: Path) -> None:
    """The figure as ``out`` (its format from the name), replaced atomically: a planted
    symlink at ``out`` is replaced, never followed."""
    with kit_files.replacing(out) as f:
        fig.savefig(f, dpi=80, format=out.suffix[1:].lower())


def report(job_dir: Path, job: str, out: Path, prometheus: str | None = None,
           min_seconds: float = MIN_SECONDS, notice=lambda e: None) -> Summary:
    """Summarize the job (``out``'s .json) and draw its panels (``out``); without
    matplotlib the summary still comes, and ``notice`` hears why there is no picture."""
    logs = load_logs(job_dir)  # also the job's time range for Prometheus
    series, source = logs.series, "metrics logs"
    if prometheus:
        times = [t for pts in logs.series.values() for t, _ in pts]
        try:
            from_prometheus = load_prometheus(prometheus, job, min(times), max(times))
        except (OSError, ValueError, KeyError, TypeError):
            from_prometheus = None
        if from_prometheus and any(from_prometheus.values()):
            series, source = from_prometheus, f"Prometheus {prometheus}"
        else:
            source = "metrics logs (Prometheus unreachable)"
    if logs.damaged:
        source += f"; {logs.damaged} damaged log line(s) skipped"
    summary = summarize(series, job, source, logs, job_dir, min_seconds)
    summary.task_starts = jobdir.all_task_starts(job_dir)
    try:
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
        return (f"{self.task:>5}  {params:<30.30}  {self.end:<10}  {self.restarts:>8}  {loss:>10}  "
                f"{rate:>10}  {took:>8}")


TASK_HEADER = f"{'task':>5}  {'parameters':<30}  {'end':<10}  {'restarts':>8}  {'final loss':>10}  " \
              f"{'samples/s':>10}  {'time (s)':>8}"


def _task_summary(d: Path) -> tuple[TaskSummary, list]:
    try:
        params = kit_files.read_json(d / "params.json")
        params = params if isinstance(params, dict) else {}
    except (OSError, ValueError):
        params = {}
    ends = []
    try:
        for line in kit_files.read_text(d / "runs.jsonl").splitlines():
            try:
                rec = kit_files.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                ends.append(str(rec.get("end", "?")))
    except OSError:
        pass
    end = "finished" if (d / "FINISHED").exists() else (ends[-1] if ends else "not run")
    try:
        series = load_logs(d).series
    except KitError:
        series = {}
    summary = summarize(series, d.name, "metrics logs") if series else None
    losses = sorted(((t, v) for (name, _, rank), pts in series.items() if name == "training_loss" for t, v in pts),
                    key=lambda p: p[0])
    curve = [(t, v) for (name, _, rank), pts in sorted(series.items()) if name == "training_loss" and rank == "0"
             for t, v in pts] or losses
    return TaskSummary(int(d.name), params, end, max(len(ends) - 1, 0), losses[-1][1] if losses else None,
                       summary.samples_per_second if summary else None,
                       summary.duration_seconds if summary else None), curve


def report_tasks(job_dir: Path, job: str, out: Path, notice=lambda e: None) -> list[TaskSummary]:
    """An array job: one line per task, and every task's loss curve in one figure."""
    dirs = sorted((d for d in (job_dir / "tasks").iterdir() if d.is_dir() and d.name.isdigit()),
                  key=lambda d: int(d.name))
    if not dirs:
        raise KitError(f"no task directories in {job_dir / 'tasks'}", field="JOB")
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
    kit_files.write_atomic(out.with_suffix(".json"), json.dumps({"job": job, "tasks": [asdict(r) for r in rows]},
                                                                indent=2) + "\n")
    return rows


def _plot_tasks(plt, job: str, rows: list[TaskSummary], curves: list, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 6))
    drawn = False
    for row, curve in zip(rows, curves):
        if curve:
            t0 = curve[0][0]
            label = " ".join(f"{k}={v}" for k, v in row.params.items()) or f"task {row.task}"
            ax.plot([t - t0 for t, _ in curve], [v for _, v in curve], label=f"{row.task}: {label}")
            drawn = True
    ax.set_title(f"kit job {job}: training loss per task")
    ax.set_xlabel("seconds since the task's first sample")
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no training loss samples", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)
