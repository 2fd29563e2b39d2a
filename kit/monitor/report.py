"""`kit report`: a job's GPU and training picture as a PNG and a short summary.

Data comes from Prometheus when it is reachable (the local cluster's, or
``--prometheus URL``), and from the per-node JSONL metrics logs in the job
directory otherwise, so a job can be analysed with no Prometheus at all.
"""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit.errors import KitError

IDLE_UTIL = 5.0  # % under which a GPU counts as idle
# series key -> list of (time, value); key = (metric, node, gpu-or-rank)
Series = dict


@dataclass
class GpuSummary:
    node: str
    gpu: str
    mean_util: float
    peak_util: float
    idle_seconds: float
    mean_power_w: float | None
    peak_memory_mib: float | None


@dataclass
class Summary:
    job: str
    source: str
    duration_seconds: float
    samples: float
    samples_per_second: float
    gpus: list[GpuSummary] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"job {self.job} (data: {self.source})",
               f"duration: {self.duration_seconds:.1f} s",
               f"samples: {self.samples:.0f} ({self.samples_per_second:.1f} samples/s)"]
        if not self.gpus:
            out.append("GPUs: no GPU samples (no NVML on the nodes)")
        for g in self.gpus:
            power = f", mean power {g.mean_power_w:.0f} W" if g.mean_power_w is not None else ""
            out.append(f"{g.node} gpu{g.gpu}: mean util {g.mean_util:.1f}%, peak {g.peak_util:.0f}%, "
                       f"idle {g.idle_seconds:.0f} s{power}")
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
    """One metrics-log line as ((metric, node, gpu-or-rank), time, value)
    points; None when the line is damaged (torn, not a record, bad fields)."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
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
        points.append(((sample[0], node, str(labels.get("gpu") or labels.get("rank") or "")), t, value))
    return points


def load_logs(job_dir: Path) -> tuple[Series, int]:
    """The job's metrics logs as series, and how many damaged lines were skipped."""
    series: Series = defaultdict(list)
    files = sorted((job_dir / "logs").glob("*.metrics.jsonl"))
    if not files:
        raise KitError(f"no metrics logs in {job_dir / 'logs'}", field="JOB",
                       hint="the job ran without the exporter (--no-exporter), or has not started")
    damaged = 0
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            damaged += 1
            continue
        for line in text.splitlines():
            points = parse_record(line)
            if points is None:
                damaged += 1
                continue
            for key, t, value in points:
                series[key].append((t, value))
    if not any(series.values()):
        raise KitError(f"no readable samples in the metrics logs in {job_dir / 'logs'}"
                       + (f" ({damaged} damaged line(s))" if damaged else ""), field="JOB", exit_code=1,
                       hint="the job ended before its exporter's first poll, or its disk was full")
    return series, damaged


def load_prometheus(url: str, job: str, start: float, end: float, step: float = 1.0) -> Series:
    series: Series = defaultdict(list)
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
                   "training_samples_total"):
        q = urllib.parse.urlencode({"query": f'{metric}{{slurm_job_id="{job}"}}', "start": start, "end": end,
                                    "step": step})
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=10) as r:
            data = json.load(r)["data"]["result"]
        for s in data:
            m = s["metric"]
            key = (metric, m.get("node", "?"), m.get("gpu") or m.get("rank") or "")
            series[key] = [(float(t), float(v)) for t, v in s["values"]]
    return series


def summarize(series: Series, job: str, source: str) -> Summary:
    times = [t for points in series.values() for t, _ in points]
    duration = (max(times) - min(times)) if times else 0.0
    samples = 0.0
    for (name, _, _), points in series.items():
        if name == "training_samples_total":
            # a counter: sum the increases (it restarts from 0 after a requeue)
            samples += sum(max(b - a, 0.0) if b >= a else b for (_, a), (_, b) in zip(points, points[1:]))
    gpus = []
    for (name, node, gpu), points in sorted(series.items()):
        if name != "DCGM_FI_DEV_GPU_UTIL" or not points:
            continue
        values = [v for _, v in points]
        idle = sum(t2 - t1 for (t1, v), (t2, _) in zip(points, points[1:]) if v < IDLE_UTIL)
        power = [v for _, v in series.get(("DCGM_FI_DEV_POWER_USAGE", node, gpu), [])]
        mem = [v for _, v in series.get(("DCGM_FI_DEV_FB_USED", node, gpu), [])]
        gpus.append(GpuSummary(node, gpu, sum(values) / len(values), max(values), idle,
                               sum(power) / len(power) if power else None, max(mem) if mem else None))
    return Summary(job, source, duration, samples, samples / duration if duration else 0.0, gpus)


def plot(series: Series, summary: Summary, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min((t for pts in series.values() for t, _ in pts), default=0.0)
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels = (("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%)"), ("DCGM_FI_DEV_FB_USED", "GPU memory used (MiB)"),
              ("DCGM_FI_DEV_POWER_USAGE", "GPU power (W)"))
    for ax, (metric, title) in zip(axes, panels):
        drawn = False
        for (name, node, gpu), pts in sorted(series.items()):
            if name == metric and pts:
                ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], label=f"{node} gpu{gpu}")
                drawn = True
        ax.set_title(title)
        if drawn:
            ax.legend(fontsize="small", ncol=4)
        else:
            ax.text(0.5, 0.5, "no GPU samples", ha="center", va="center", transform=ax.transAxes)
    ax = axes[3]
    per_node: dict = defaultdict(list)
    for (name, node, rank), pts in sorted(series.items()):
        if name == "training_samples_total" and len(pts) > 1:
            xs = [(a[0] + b[0]) / 2 - t0 for a, b in zip(pts, pts[1:])]
            ys = [(b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] and b[1] >= a[1] else 0.0 for a, b in zip(pts, pts[1:])]
            ax.plot(xs, ys, label=f"rank {rank} ({node})")
            per_node[node].append(ys)
    ax.set_title(f"Training throughput (samples/s) — {summary.samples_per_second:.1f}/s overall")
    ax.set_xlabel("seconds since the first sample")
    if per_node:
        ax.legend(fontsize="small")
    fig.suptitle(f"kit job {summary.job}")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def report(job_dir: Path, job: str, out: Path, prometheus: str | None = None) -> Summary:
    logs, damaged = load_logs(job_dir)  # also the job's time range for Prometheus
    series, source = logs, "metrics logs"
    if prometheus:
        times = [t for pts in logs.values() for t, _ in pts]
        try:
            from_prometheus = load_prometheus(prometheus, job, min(times), max(times))
        except (OSError, ValueError, KeyError, TypeError):
            from_prometheus = None
        if from_prometheus and any(from_prometheus.values()):
            series, source = from_prometheus, f"Prometheus {prometheus}"
        else:
            source = "metrics logs (Prometheus unreachable)"
    if damaged:
        source += f"; {damaged} damaged log line(s) skipped"
    summary = summarize(series, job, source)
    plot(series, summary, out)
    (out.with_suffix(".json")).write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


@dataclass
class TaskSummary:
    task: int
    params: dict
    end: str
    restarts: int
    final_loss: float | None
    samples_per_second: float
    duration_seconds: float

    def line(self) -> str:
        params = " ".join(f"{k}={v}" for k, v in self.params.items()) or "-"
        loss = f"{self.final_loss:.5f}" if self.final_loss is not None else "-"
        return (f"{self.task:>5}  {params:<30.30}  {self.end:<10}  {self.restarts:>8}  {loss:>10}  "
                f"{self.samples_per_second:>10.1f}  {self.duration_seconds:>8.1f}")


TASK_HEADER = f"{'task':>5}  {'parameters':<30}  {'end':<10}  {'restarts':>8}  {'final loss':>10}  " \
              f"{'samples/s':>10}  {'time (s)':>8}"


def _task_summary(d: Path) -> tuple[TaskSummary, list]:
    try:
        params = json.loads((d / "params.json").read_text())
        params = params if isinstance(params, dict) else {}
    except (OSError, ValueError):
        params = {}
    ends = []
    try:
        for line in (d / "runs.jsonl").read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                ends.append(str(rec.get("end", "?")))
    except OSError:
        pass
    end = "finished" if (d / "FINISHED").exists() else (ends[-1] if ends else "not run")
    try:
        series, _ = load_logs(d)
    except KitError:
        series = {}
    summary = summarize(series, d.name, "metrics logs") if series else None
    losses = sorted(((t, v) for (name, _, rank), pts in series.items() if name == "training_loss" for t, v in pts),
                    key=lambda p: p[0])
    curve = [(t, v) for (name, _, rank), pts in sorted(series.items()) if name == "training_loss" and rank == "0"
             for t, v in pts] or losses
    return TaskSummary(int(d.name), params, end, max(len(ends) - 1, 0), losses[-1][1] if losses else None,
                       summary.samples_per_second if summary else 0.0,
                       summary.duration_seconds if summary else 0.0), curve


def report_tasks(job_dir: Path, job: str, out: Path) -> list[TaskSummary]:
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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(out, dpi=80)
    plt.close(fig)
    out.with_suffix(".json").write_text(json.dumps({"job": job, "tasks": [asdict(r) for r in rows]}, indent=2) + "\n")
    return rows
