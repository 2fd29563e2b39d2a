"""kit report's numbers, computed again here from a job's metrics logs (written
apart from kit.report, so that a wrong formula there shows)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

GAP = 10.0


def read(job_dir: Path, last: dict | None = None) -> tuple[dict, dict]:
    """series[(metric, node, gpu|rank|mode)] = sorted [(t, v)]; runs[K] = [times]; ``last[(run, node)]``: the
    log's last record."""
    series, runs = defaultdict(list), defaultdict(list)
    for path in sorted((Path(job_dir) / "logs").glob("*.metrics.jsonl")):
        run = int(re.search(r"\.r(\d+)\.metrics\.jsonl$", path.name).group(1))
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if last is not None:
                last[(run, rec["node"])] = rec
            runs[run].append(rec["time"])
            for name, labels, value in rec["samples"]:
                if value is None:
                    continue
                tag = labels.get("gpu") or labels.get("rank") or labels.get("mode") or ""
                series[(name, rec["node"], str(tag))].append((rec["time"], float(value)))
    for pts in series.values():
        pts.sort()
    return series, runs


def _steady(pts):
    return [(a, b) for a, b in zip(pts, pts[1:]) if 0 < b[0] - a[0] <= GAP]


def _rate(pts, resets: bool = True):
    """Mean rate over the steady pairs. A fall is a counter starting again from 0 (its new
    value counts) for counters that reset; the job's CPU counter is a sum over live processes,
    whose fall is a process leaving the sum (it counts nothing)."""
    pairs = _steady(pts)
    dt = sum(b[0] - a[0] for a, b in pairs)
    return sum((b[1] - a[1]) if b[1] >= a[1] else (b[1] if resets else 0.0) for a, b in pairs) / dt if dt else None


def tally(job_dir: Path, last: dict) -> tuple[float | None, dict]:
    """The job's samples and each node's (kit.jobdir.tally's rule): each run's and node's last poll, each rank's count
    less its run's first step's share; a rank whose last step came before its run began is an earlier run's file."""
    path = Path(job_dir) / "runs.jsonl"
    records = (
        sorted((json.loads(x) for x in path.read_text().splitlines()), key=lambda r: r["run"]) if path.exists() else []
    )
    starts = {r["run"]: r["start_ms"] / 1000 for r in records if r.get("start_ms")}
    begun, before = {}, 0
    for r in records:
        begun[r["run"]], before = before, max(r.get("checkpoint_step") or 0, 0)
    total, nodes = None, defaultdict(float)
    for (run, node), rec in last.items():
        ranks = defaultdict(dict)
        for name, labels, value in rec["samples"]:
            if name in ("training_samples_total", "training_step", "training_last_step_timestamp_seconds"):
                ranks[labels["rank"]][name] = value
        for v in ranks.values():
            ts = v.get("training_last_step_timestamp_seconds")
            if "training_samples_total" not in v or (run in starts and ts is not None and ts < starts[run] - 1):
                continue
            steps = v.get("training_step", 0) - begun.get(run, 0)
            n = v["training_samples_total"] * ((steps - 1) / steps if steps >= 1 else 1)
            total, nodes[node] = (total or 0.0) + n, nodes[node] + n
    return total, dict(nodes)


def expected(job_dir: Path, goodput: dict | None = None) -> dict:
    """What the report must say; ``goodput`` (report.json's, goodput's own tests check it): the job's wall time and
    the seconds its steps ran, over which the samples are counted."""
    last = {}
    series, runs = read(job_dir, last)
    times = [t for ts in runs.values() for t in ts]
    out = {"metrics_seconds": max(times) - min(times), "runs": len(runs)}
    out["samples"], node_samples = tally(job_dir, last)  # none reported: unknown, not 0
    stepping = None
    if goodput is not None:
        stepping = goodput["parts"]["productive"] + goodput["parts"]["redone"] or None
    out["duration_seconds"] = goodput["wall_seconds"] if goodput is not None else out["metrics_seconds"]
    out["stepping_seconds"] = stepping
    out["samples_per_second"] = out["samples"] / stepping if out["samples"] is not None and stepping else None
    loss0 = sorted(p for k, pts in series.items() if k[0] == "training_loss" and k[2] == "0" for p in pts)
    out["first_loss"], out["last_loss"] = (loss0[0][1], loss0[-1][1]) if loss0 else (None, None)
    nodes = {}
    for node in sorted({k[1] for k in series if k[0] in ("kit_job_cpu_seconds_total", "training_samples_total")}):

        def get(metric, tag=""):
            return series.get((metric, node, tag), [])

        cpus = get("kit_job_cpus")[-1][1] if get("kit_job_cpus") else None
        used = _rate(get("kit_job_cpu_seconds_total"), resets=False)
        modes = {k[2]: p for k, p in series.items() if k[0] == "node_cpu_seconds_total" and k[1] == node}
        inc = {m: sum(b[1] - a[1] for a, b in _steady(p) if b[1] >= a[1]) for m, p in modes.items()}
        total = sum(inc.values())
        limit = (get("kit_job_memory_limit_bytes") or get("node_memory_MemTotal_bytes") or [(0, None)])[-1][1]
        peak = max((v for _, v in get("kit_job_memory_rss_bytes")), default=None)
        nodes[node] = {
            "cpus_allocated": cpus,
            "cpu_cores_used": used,
            "cpu_efficiency_percent": 100 * used / cpus if used is not None and cpus else None,
            "node_cpu_busy_percent": 100 * (1 - (inc.get("idle", 0) + inc.get("iowait", 0)) / total) if total else None,
            "memory_peak_bytes": peak,
            "memory_limit_bytes": limit,
            "memory_peak_percent": 100 * peak / limit if peak is not None and limit else None,
            "samples_per_second": node_samples[node] / stepping if node in node_samples and stepping else None,
        }
    out["nodes"] = nodes
    gpus = {}
    for (name, node, gpu), pts in series.items():
        if name != "DCGM_FI_DEV_GPU_UTIL":
            continue
        vals = [v for _, v in pts]
        procs = [v for _, v in series.get(("gpu_compute_processes", node, gpu), [])]
        gpus[(node, gpu)] = {
            "mean_util": sum(vals) / len(vals),
            "peak_util": max(vals),
            "no_process_percent": 100 * procs.count(0.0) / len(procs) if procs else None,
        }
    out["gpus"] = gpus
    return out


def close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def check(job_dir: Path, summary: dict, text: str) -> dict:
    """Every number of report.json and of the printed summary, against the logs."""
    want = expected(job_dir, summary["goodput"])
    for key in (
        "duration_seconds",
        "metrics_seconds",
        "samples",
        "samples_per_second",
        "runs",
        "first_loss",
        "last_loss",
    ):
        assert close(summary[key], want[key]), (key, summary[key], want[key])
    if want["samples_per_second"] is None:
        assert "samples: -" in text
    else:
        rate, over = want["samples_per_second"], want["stepping_seconds"]
        assert f"samples: {want['samples']:.0f} ({rate:.1f} samples/s over {over:.1f} s of steps)" in text
    assert {n["node"] for n in summary["nodes"]} == set(want["nodes"])
    for n in summary["nodes"]:
        for key, value in want["nodes"][n["node"]].items():
            assert close(n[key], value), (n["node"], key, n[key], value)
    assert {(g["node"], g["gpu"]) for g in summary["gpus"]} == set(want["gpus"])
    for g in summary["gpus"]:
        for key, value in want["gpus"][(g["node"], g["gpu"])].items():
            assert close(g[key], value), (g["node"], g["gpu"], key, g[key], value)
    # The printed summary shows the same numbers.
    assert f"duration: {want['duration_seconds']:.1f} s from submission to its end, {want['runs']} run(s)" in text
    if want["first_loss"] is not None:
        assert f"loss (rank 0): {want['first_loss']:.4g} -> {want['last_loss']:.4g}" in text
    for node, n in want["nodes"].items():
        line = next(line for line in text.splitlines() if line.startswith(f"{node}: "))
        if n["cpu_cores_used"] is not None:
            assert (
                f"CPU {n['cpu_cores_used']:.2f} of {n['cpus_allocated']:.0f} allocated cores "
                f"({n['cpu_efficiency_percent']:.0f} %)" in line
            ), line
        if n["memory_peak_bytes"] is not None:
            assert (
                f"memory peak {n['memory_peak_bytes'] / 1024**3:.2f} GiB of "
                f"{n['memory_limit_bytes'] / 1024**3:.2f} GiB" in line
            ), line
        if n["samples_per_second"] is not None:
            assert f"{n['samples_per_second']:.1f} samples/s" in line, line
    for (node, gpu), g in want["gpus"].items():
        assert f"{node} gpu{gpu}: mean util {g['mean_util']:.1f}%, peak {g['peak_util']:.0f}%" in text
    return want
