"""A job's metrics as series: read from the job directory's per-node JSONL logs, or
from Prometheus; counters turned into increases and rates."""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kit import files as kit_files  # (load_logs has its own `files`)
from kit.jobdir import JobDir

IDLE_UTIL = 5.0  # % under which a GPU counts as idle
GAP = 10.0  # s between two polls beyond which they are a break (between runs): no rate across it
EDGE_SLACK = 2.0  # s a Prometheus may lag the logs at a job's start or end (discovery, a scrape or two)

GIB = 1024**3
# series key -> list of (time, value); key = (metric, node, gpu-or-rank-or-mode)
Series = dict


@dataclass
class Logs:
    """A job's metrics logs: the series, how many damaged lines were skipped,
    and each run's span of poll times and highest training step."""

    series: Series
    damaged: int = 0
    runs: dict = field(default_factory=dict)  # run -> [first poll time, last poll time]
    run_steps: dict = field(default_factory=dict)  # run -> highest training_step seen
    missing: str | None = None  # why there are no samples (the report then says what the job directory holds)


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
        if not (
            isinstance(sample, list) and len(sample) == 3 and isinstance(sample[0], str) and isinstance(sample[1], dict)
        ):
            return None
        value = _number(sample[2])
        if value is None:
            continue  # a value that is not a number: that sample only
        labels = sample[1]
        points.append(((sample[0], node, _tag(labels)), t, value))
    return points


LONGEST_RECORD = 1 << 20  # one exporter poll's line is a few kB


def load_logs(job_dir: Path) -> Logs:
    """The job's metrics logs (``logs/<node>.r<run>.metrics.jsonl``)."""
    logs = Logs(defaultdict(list))
    paths = JobDir(job_dir).metrics_logs()
    if not paths:
        logs.missing = "no metrics logs: the job ran without the exporter (--no-exporter), or ended before it started"
        return logs
    for run, path in paths:
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
        logs.missing = "no readable samples in its metrics logs: the job ended before its exporter's first poll" + (
            f" ({logs.damaged} damaged line(s))" if logs.damaged else ", or its disk was full"
        )
    for points in logs.series.values():
        points.sort()
    return logs


# What Prometheus is asked for: every logged metric's raw samples over the job's span (a range
# selector, not query_range: query_range fills every step with the last sample within its
# five-minute look-back, so a series scraped twice looks like one held flat for the whole job).
def _selector(job: str) -> str:
    array_id, sep, task = job.partition("_")
    return f'{{slurm_array_job_id="{array_id}",slurm_array_task_id="{task}"}}' if sep else f'{{slurm_job_id="{job}"}}'


def _raw(url: str, query: str, at: float) -> list:
    q = urllib.parse.urlencode({"query": query, "time": at})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
        return json.load(r)["data"]["result"]


def _tag(labels: dict) -> str:
    """The label that tells a node's series of one metric apart (a GPU, a rank, a CPU mode, a part of the job's
    time): the third word of a series' key, from a metrics log's sample and from Prometheus alike."""
    return str(labels.get("gpu") or labels.get("rank") or labels.get("mode") or labels.get("part") or "")


def load_prometheus(url: str, job: str, start: float, end: float) -> Series:
    from kit.monitor.exporter import LOGGED, LOGGED_SUMMED

    series: Series = defaultdict(list)
    window = f"[{math.ceil(end - start) + int(GAP)}s]"
    for name in (*LOGGED, *LOGGED_SUMMED):
        by = LOGGED_SUMMED.get(name)
        summed: dict = defaultdict(float)
        for s in _raw(url, f"{name}{_selector(job)}{window}", end + GAP / 2):
            m = s["metric"]
            tag = m.get(by, "") if by else _tag(m)
            for t, v in s["values"]:
                if by:
                    summed[(name, m.get("node", "?"), tag, float(t))] += float(v)
                else:
                    series[(name, m.get("node", "?"), tag)].append((float(t), float(v)))
        for (metric, node, tag, t), v in summed.items():
            series[(metric, node, tag)].append((t, v))
    for points in series.values():
        points.sort()
    return series


def missed(logged: Series, scraped: Series) -> str | None:
    """What Prometheus lacks of the job the metrics logs hold (a series, or its start or end by more than a
    quarter of the job, at least EDGE_SLACK and at most GAP: a target found late, a scrape interval longer than
    the job, a report made as a short job ended, before the scrapes of its last seconds), or None."""
    for key, points in sorted(logged.items()):
        if not points:
            continue
        got = scraped.get(key) or []
        name = f"{key[0]} on {key[1]}"
        if len(got) < min(2, len(points)):
            return f"{name}: {len(got)} sample(s)"
        span = points[-1][0] - points[0][0]
        allowed = min(GAP, max(EDGE_SLACK, span / 4))  # a short job's few seconds are most of it
        if got[0][0] - points[0][0] > allowed or points[-1][0] - got[-1][0] > allowed:
            return f"{name}: {got[-1][0] - got[0][0]:.0f} s of the logs' {span:.0f} s"
    return None


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


STALE = 3.0  # s: a rank whose last step ended longer ago than this (and than 2 steps) made no step: a true 0


def sample_rates(series: Series, key: tuple) -> list[tuple[float, float]]:
    """A rank's samples/s as drawn: its counter's rate between the polls that saw a new value. A rank writes its
    file at most once a second, at a step's end, so a poll may see the value the last one saw (a missed sample, not a
    stop: drawn as a 0 it dipped every ~15 s, the beat of the two clocks); such a repeat is left out while the rank's
    last step is recent, and kept — a true 0 — once it is not (a stall, a hang)."""
    _, node, rank = key
    stamps = dict(series.get(("training_last_step_timestamp_seconds", node, rank), []))
    steps = dict(series.get(("training_step_duration_seconds", node, rank), []))
    kept: list = []
    for t, v in series.get(key, []):
        stamp = stamps.get(t)
        if kept and v == kept[-1][1]:
            if stamp is not None and t - stamp <= max(STALE, 2 * steps.get(t, 0.0)):
                continue  # the same write seen again
            kept.append((t, v))  # no step for a while: a true 0, at the poll's time
        elif stamp is not None and stamp <= t and (not kept or stamp > kept[-1][0]):
            kept.append((stamp, v))  # a new value, at its own time (its step's end), not the poll's
        else:
            kept.append((t, v))
    return rates(kept)


def _of(series: Series, metric: str, node: str | None = None) -> dict[tuple, list]:
    return {k: v for k, v in sorted(series.items()) if k[0] == metric and v and (node is None or k[1] == node)}
