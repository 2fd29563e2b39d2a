"""What a job used of what it held: per-node and per-GPU summaries, restarts from the
run records, and the notes in the manner of Princeton's jobstats."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from kit.core.text import printable
from kit.jobdir.goodput import Goodput
from kit.jobdir.runs import verdict_text
from kit.jobdir.slow_ranks import Straggler
from kit.report.many import MANY, grouped, spread
from kit.report.series import GIB

# The notes' thresholds (jobstats' where it has one); each note's text carries its own.
GPU_ALERT, GPU_WARNING = 15.0, 25.0  # mean GPU utilisation, %
UNUSED_GPU = 50.0  # % of the samples with no compute process on the GPU
GPU_MEMORY_LOW = 50.0  # peak GPU memory, % of the GPU's
CPU_LOW = 50.0  # the job's CPU use, % of its allocated cores
MEMORY_LOW, MEMORY_HIGH = 25.0, 90.0  # the job's peak memory, % of its allocation (or the node's)
SLOW_NODE = 80.0  # a node's samples/s, % of the median node's
MIN_SECONDS = 300.0  # utilisation notes need this much data (jobstats: 300 s)


@dataclass
class NodeSummary:
    node: str
    cpus_allocated: float | None
    cpu_cores_used: float | None  # the job's processes, mean over the run
    cpu_efficiency_percent: float | None
    node_cpu_busy_percent: float | None  # the whole node's CPUs (other jobs included)
    memory_peak_bytes: float | None  # the job's processes
    memory_limit_bytes: float | None
    memory_limit_of: str  # "allocation" or "node"
    memory_peak_percent: float | None
    samples_per_second: float | None  # the node's ranks together

    def line(self) -> str:
        parts = []
        if self.cpu_cores_used is not None:
            of = f" of {self.cpus_allocated:.0f} allocated" if self.cpus_allocated else ""
            eff = f" ({self.cpu_efficiency_percent:.0f} %)" if self.cpu_efficiency_percent is not None else ""
            parts.append(f"CPU {self.cpu_cores_used:.2f}{of} cores{eff}")
        if self.node_cpu_busy_percent is not None:
            parts.append(f"node CPUs {self.node_cpu_busy_percent:.0f} % busy")
        if self.memory_peak_bytes is not None:
            limit = (
                (
                    f" of {self.memory_limit_bytes / GIB:.2f} GiB ({self.memory_limit_of}, "
                    f"{self.memory_peak_percent:.0f} %)"
                )
                if self.memory_limit_bytes
                else ""
            )
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
        return (
            f"{self.node} gpu{self.gpu}: mean util {self.mean_util:.1f}%, peak {self.peak_util:.0f}%, "
            f"idle {self.idle_seconds:.0f} s{power}{mem}"
        )


@dataclass
class Note:
    level: str  # "alert", "warning" or "info"
    text: str


@dataclass
class Summary:
    job: str
    source: str
    duration_seconds: float
    samples: float | None  # None: the job reported no samples (unknown, not zero)
    samples_per_second: float | None
    gpus: list[GpuSummary] = field(default_factory=list)
    nodes: list[NodeSummary] = field(default_factory=list)
    runs: int = 1
    ended: str | None = None  # how the job ended, as --wait told it (kit.report.summarize._told_outcome)
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
    trackers: dict = field(default_factory=dict)  # the job's tracker runs (kit.jobdir.tracker_runs)
    hangs: list[dict] = field(default_factory=list)  # each run's hang: run, rank (or unknown), node, summary
    goodput: Goodput | None = None  # the job's time in parts, and the share that trained (kit.jobdir.goodput)
    preflight: list[dict] = field(default_factory=list)  # --preflight: each run's verdict (kit.preflight.verdict)
    stragglers: list[dict] = field(default_factory=list)  # the ranks named slow (kit.jobdir.slow_ranks)
    undelivered: list[dict] = field(default_factory=list)  # --notify's given-up sends: key, shown, error
    exporters_lost: list[str] = field(default_factory=list)  # each lost exporter's line (kit.jobdir.tally)
    checkpoints: list[str] = field(default_factory=list)  # kit's checkpoints: the interval, each resume's tier and time
    tflops: float | None = None  # rank 0's device, mean over the job: the model's TFLOP/s (kit.train.mfu)
    mfu: float | None = None  # of the device's peak (kit.monitor.peaks); None: n/a
    # The seconds the metrics span (the utilisation notes' basis). With a job directory, duration_seconds is the
    # job's from submission to end, and the samples and rates its tally's (kit.jobdir.tally): every surface's.
    metrics_seconds: float | None = None  # None: duration_seconds is the metrics' span
    measured: bool = True  # False: no metrics at all (no logs, no samples): only what the job directory records
    stepping_seconds: float | None = None  # the seconds its steps ran (the tally's; None: unknown)
    from_submission: bool = False  # duration_seconds is the tally's: from the job's submission to its end

    def _samples(self) -> str:
        if self.samples is None or self.samples_per_second is None:
            return "samples: -"
        over = f" over {self.stepping_seconds:.1f} s of steps" if self.stepping_seconds else ""
        return f"samples: {self.samples:.0f} ({self.samples_per_second:.1f} samples/s{over})"

    def lines(self) -> list[str]:
        out = [
            f"job {self.job} (data: {self.source})",
            f"duration: {self.duration_seconds:.1f} s{' from submission to its end' if self.from_submission else ''}"
            f", {self.runs} run(s) ({self.runs - 1} restart(s))",
            self._samples(),
        ]
        if self.ended:
            out.insert(1, self.ended)
        if self.goodput is not None:
            out.append(self.goodput.line())
        out += [f"preflight, run {v['run']}: {verdict_text(v)}" for v in self.preflight]
        out += [Straggler(**s).line() for s in self.stragglers]
        out += self.checkpoints
        if self.first_loss is not None:
            out.append(f"loss (rank 0): {self.first_loss:.4g} -> {self.last_loss:.4g}")
        if self.tflops is not None:
            out.append(
                f"model FLOP/s (rank 0's device): {self.tflops:.3g} TFLOP/s, MFU "
                + (f"{100 * self.mfu:.0f} %" if self.mfu is not None else "n/a (a CPU, or a GPU kit has no peak for)")
            )
        out += [n.line() for n in self.nodes] if len(self.nodes) <= MANY else _node_spreads(self.nodes)
        if self.task_starts:
            out += _task_start_lines(self.task_starts) + _mode_lines(self.task_starts)
        if not self.gpus:
            out.append("GPUs: no GPU samples (no NVML on the nodes)" if self.measured else "GPUs: unknown (no metrics)")
        out += [g.line() for g in self.gpus] if len(self.gpus) <= MANY else _gpu_spreads(self.gpus)
        out += [f"tracker: {line}" for line in tracker_lines(self.trackers)]
        if self.notes:
            out.append("notes:")
            out += [f"  {n.level.upper()}: {n.text}" for n in self.notes]
        return out


def _node_spreads(nodes: list[NodeSummary]) -> list[str]:
    def of(attr: str) -> dict[str, float]:
        return {n.node: getattr(n, attr) for n in nodes if getattr(n, attr) is not None}

    return [
        spread("CPU efficiency per node", of("cpu_efficiency_percent"), " %", fmt="{:.0f}"),
        spread(
            "memory peak per node",
            {k: v / GIB for k, v in of("memory_peak_bytes").items()},
            " GiB",
            low_first=False,
            fmt="{:.2f}",
        ),
        spread("samples/s per node", of("samples_per_second")),
    ]


def _gpu_spreads(gpus: list[GpuSummary]) -> list[str]:
    named = {f"{g.node} gpu{g.gpu}": g for g in gpus}
    return [
        spread("GPU mean utilisation", {k: g.mean_util for k, g in named.items()}, " %", fmt="{:.0f}"),
        spread("GPU idle time", {k: g.idle_seconds for k, g in named.items()}, " s", low_first=False, fmt="{:.0f}"),
    ]


def _task_start_lines(starts: list[dict]) -> list[str]:
    """Seconds from srun to each node's first line, per run: each node's when few, else a spread."""
    by_run: dict[int, dict[str, float]] = {}
    for t in starts:
        by_run.setdefault(t["run"], {})[t["node"]] = t["seconds"]
    head = "task start after srun (with an image: the container's start)"
    if max(len(v) for v in by_run.values()) <= MANY:
        return [
            f"{head}: "
            + "; ".join(
                f"run {run}: {', '.join(f'{n} {s:.1f} s' for n, s in v.items())}" for run, v in sorted(by_run.items())
            )
        ]
    return [spread(f"{head}, run {run}", v, " s", low_first=False) for run, v in sorted(by_run.items())]


MODE_WORDS = {
    "squashfuse": "squashfuse mode (pyxis use_squashfuse=1: the image read through FUSE, not unpacked)",
    "create": "create mode (the image unpacked on the node before the task)",
}


def _mode_lines(starts: list[dict]) -> list[str]:
    """How the nodes' containers held the image (the last run's word for each node)."""
    last = {t["node"]: t.get("mode") for t in sorted(starts, key=lambda t: t["run"])}
    by_mode: dict[str, list[str]] = {}
    for node, mode in last.items():
        if mode in MODE_WORDS:
            by_mode.setdefault(mode, []).append(node)
    return [
        f"container: {MODE_WORDS[mode]} on " + (", ".join(nodes) if len(nodes) <= MANY else f"{len(nodes)} nodes")
        for mode, nodes in sorted(by_mode.items())
    ]


def tracker_lines(runs: dict) -> list[str]:
    """:func:`kit.jobdir.tracker_runs` as the report's lines: where to go from the report to each dashboard.
    Every value comes from files the job's code wrote: shown printable (a run id may hold escapes)."""
    out = []
    if "wandb" in runs:
        w = runs["wandb"]
        sync = (
            f"; {w['offline_parts']} part(s) offline: wandb sync {w['dir']}/offline-run-*" if w["offline_parts"] else ""
        )
        out.append(f"W&B run {', '.join(w['run_ids'])}{sync}")
    if "mlflow" in runs:
        out.append(f"MLflow run {runs['mlflow']['run_id']} at {runs['mlflow']['tracking_uri'] or '(default store)'}")
    if "tensorboard" in runs:
        out.append(f"TensorBoard: tensorboard --logdir {runs['tensorboard']['dir']}")
    return [printable(line) for line in out]


def notes(s: Summary, min_seconds: float = MIN_SECONDS) -> list[Note]:
    """What an engineer should look at, jobstats-style, each with its threshold; what a note says
    of more than a few nodes or GPUs is one note naming them (:func:`kit.report.many.grouped`)."""
    out: list[tuple[str, str, str, str]] = []  # (level, kind, subject, text): a kind groups its subjects
    span = s.duration_seconds if s.metrics_seconds is None else s.metrics_seconds
    if span < min_seconds and s.measured:
        out.append(
            (
                "info",
                "",
                "",
                f"the job's metrics span {span:.0f} s: utilisation notes need "
                f"{min_seconds:.0f} s of samples (--min-seconds)",
            )
        )
    else:
        out += _gpu_notes(s.gpus) + _node_notes(s.nodes)
    out += [
        (
            "alert",
            "",
            "",
            f"run {h['run']} hung: {printable(h['summary'])}; every rank's stacks in hang/r{h['run']}/ "
            f"(kit logs --errors)",
        )
        for h in s.hangs
    ]
    if s.runs > 1 and s.goodput is not None:  # the job's own timestamps: what each restart cost, exactly
        parts = s.goodput.parts
        cost = parts["redone"] + parts["restart"] + parts["hang"]
        text = (
            f"{s.runs - 1} restart(s) cost {cost:.0f} s: {parts['redone']:.0f} s of steps redone from the last "
            f"checkpoint, {parts['restart']:.0f} s between runs"
            + (f", {parts['hang']:.0f} s waiting on a hang" if parts["hang"] else "")
        )
        out.append(("warning", "", "", text))
    elif s.runs > 1:
        out.append(
            (
                "warning",
                "",
                "",
                f"{s.runs - 1} restart(s) cost about {s.lost_seconds:.0f} s: "
                f"{s.redone_steps:.0f} step(s) redone from the last checkpoint, "
                f"{s.restart_gap_seconds:.0f} s between runs",
            )
        )
    out += [
        ("warning", "", "", f"a notification was not delivered: {u['key']} to {u['shown']}: {printable(u['error'])}")
        for u in s.undelivered
    ]
    out += [("warning", "", "", line) for line in s.exporters_lost]
    rated = sorted((n for n in s.nodes if n.samples_per_second is not None), key=lambda n: n.samples_per_second)
    if len(rated) > 1:
        median = statistics.median(n.samples_per_second for n in rated)
        kind = f"slow nodes, under {SLOW_NODE:.0f} % of the median node's {median:.1f} samples/s (the slowest first)"
        for n in rated:
            if median > 0 and n.samples_per_second < SLOW_NODE / 100 * median:
                out.append(
                    (
                        "warning",
                        kind,
                        f"{n.node} {n.samples_per_second:.1f}",
                        f"{n.node}: {n.samples_per_second:.1f} samples/s, under {SLOW_NODE:.0f} % of the "
                        f"median node's {median:.1f}: a slow node",
                    )
                )
    severity = {"alert": 0, "warning": 1, "info": 2}
    return sorted(grouped(out, Note), key=lambda n: severity[n.level])


def _gpu_notes(gpus: list[GpuSummary]) -> list[tuple[str, str, str, str]]:
    out = []
    for g in gpus:
        name = f"{g.node} gpu{g.gpu}"
        if g.no_process_percent is not None and g.no_process_percent >= UNUSED_GPU:
            out.append(
                (
                    "alert",
                    "GPUs held with no process on them",
                    name,
                    f"{name}: held with no process on it in {g.no_process_percent:.0f} % of the samples "
                    f"(at least {UNUSED_GPU:.0f} %): ask for fewer GPUs, or check that every rank found its GPU",
                )
            )
        level, bound = ("alert", GPU_ALERT) if g.mean_util < GPU_ALERT else ("warning", GPU_WARNING)
        if g.mean_util < bound:
            out.append(
                (
                    level,
                    f"GPUs under {bound:.0f} % mean utilisation",
                    f"{name} {g.mean_util:.0f} %",
                    f"{name}: mean utilisation {g.mean_util:.1f} %, under {bound:.0f} %",
                )
            )
        share = (
            100.0 * g.peak_memory_mib / g.memory_total_mib
            if g.peak_memory_mib is not None and g.memory_total_mib
            else None
        )
        if share is not None and share < GPU_MEMORY_LOW:
            out.append(
                (
                    "info",
                    f"GPUs whose peak memory is under {GPU_MEMORY_LOW:.0f} % of theirs",
                    name,
                    f"{name}: peak memory {share:.0f} % of the GPU's, under {GPU_MEMORY_LOW:.0f} %: "
                    "a larger batch would fit",
                )
            )
    return out


def _node_notes(nodes: list[NodeSummary]) -> list[tuple[str, str, str, str]]:
    out = []
    for n in nodes:
        eff, peak = n.cpu_efficiency_percent, n.memory_peak_percent
        if eff is not None and eff < CPU_LOW:
            out.append(
                (
                    "warning",
                    f"nodes using under {CPU_LOW:.0f} % of their allocated cores",
                    f"{n.node} {eff:.0f} %",
                    f"{n.node}: the job used {n.cpu_cores_used:.2f} of {n.cpus_allocated:.0f} allocated cores "
                    f"({eff:.0f} %, under {CPU_LOW:.0f} %): ask for fewer CPUs, or use them (data loaders)",
                )
            )
        if peak is not None and peak > MEMORY_HIGH:
            out.append(
                (
                    "warning",
                    f"nodes whose memory peak is over {MEMORY_HIGH:.0f} % of their limit",
                    n.node,
                    f"{n.node}: memory peak {peak:.0f} % of the {n.memory_limit_of}'s, over {MEMORY_HIGH:.0f} %: "
                    "close to the limit",
                )
            )
        elif peak is not None and peak < MEMORY_LOW and n.memory_limit_of == "allocation":
            out.append(
                (
                    "info",
                    f"nodes whose memory peak is under {MEMORY_LOW:.0f} % of the allocation",
                    n.node,
                    f"{n.node}: memory peak {peak:.0f} % of the allocation, under {MEMORY_LOW:.0f} %: ask for less",
                )
            )
    return out
