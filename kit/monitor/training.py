"""Training metrics, handed over by the Lightning callback in atomically written files.

Each rank writes ``<dir>/rank-<R>.json`` (a temporary name, then a rename)
from :class:`kit.train.metrics.MetricsCallback`; the exporter on the node reads
the files of its node's ranks. No multiprocess mode, no extra collective.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from kit import files, jobdir
from kit.monitor.families import Sample, SourceResult, Spec

FIELDS: tuple[tuple[str, Spec], ...] = (
    ("step", Spec("training_step", "gauge", "The optimizer step the rank has reached.")),
    ("loss", Spec("training_loss", "gauge", "The training loss of the last step.")),
    ("samples_total", Spec("training_samples_total", "counter", "Samples the rank has trained on.")),
    ("tokens_total", Spec("training_tokens_total", "counter", "Tokens the rank has trained on (models with tokens).")),
    ("step_duration_seconds", Spec("training_step_duration_seconds", "gauge", "Wall time of the last step.")),
    (
        "last_step_timestamp_seconds",
        Spec("training_last_step_timestamp_seconds", "gauge", "When the last step ended (Unix time)."),
    ),
    (
        "collective_wait_seconds",
        Spec(
            "training_collective_wait_seconds",
            "gauge",
            "The rank's mean wait per step in its collectives (kit.train.stragglers): long for the ranks "
            "that wait for a straggler, short for the straggler.",
        ),
    ),
    ("learning_rate", Spec("training_learning_rate", "gauge", "The learning rate of the first parameter group.")),
    ("tflops", Spec("training_tflops", "gauge", "The model's achieved TFLOP/s on the rank's device (kit.train.mfu).")),
    (
        "mfu",
        Spec(
            "training_mfu",
            "gauge",
            "Model FLOPs utilisation: training_tflops over the device's dense peak "
            "for its precision (kit.monitor.peaks); absent on a CPU or an unknown GPU.",
        ),
    ),
)


def parse(text: str) -> dict:
    """One rank file's fields (unknown keys ignored, bad values dropped);
    ValueError when the file is not a JSON object."""
    values = jobdir.read_rank_metrics(text)
    if values is None:
        raise ValueError("expected a JSON object")
    return {"rank": values["rank"], **{key: values[key] for key, _ in FIELDS if key in values}}


def write(directory: Path, rank: int, values: dict) -> None:
    """Atomically (re)write one rank's file."""
    jobdir.write_rank_metrics(directory, rank, values)


class TrainingSource:
    name = "training"

    def __init__(self, directory: Path | None):
        self.directory = directory

    def poll(self) -> SourceResult:
        t0 = time.perf_counter()
        if self.directory is None:
            return SourceResult([], True, 0.0)
        out = []
        try:
            paths = sorted(self.directory.glob(jobdir.RANK_METRICS_GLOB)) if self.directory.is_dir() else []
            bad = []
            for path in paths:
                try:
                    values = parse(files.read_text(path, 1 << 20))
                except (OSError, ValueError):
                    bad.append(path.name)  # torn, being replaced, or garbage: that rank only
                    continue
                labels = {"rank": values["rank"]}
                out += [Sample(spec, labels, values[key]) for key, spec in FIELDS if key in values]
            return SourceResult(out, True, time.perf_counter() - t0, f"unreadable: {', '.join(bad)}" if bad else "")
        except OSError as e:
            return SourceResult([], False, time.perf_counter() - t0, str(e))


GOODPUT_PART = Spec(
    "kit_job_goodput_seconds",
    "gauge",
    "The job's time so far in parts (part: queue, start, init, productive, checkpoint, redone, hang, ending, "
    "restart, unreported; kit.jobdir.goodput), from its submission to now.",
)
GOODPUT = Spec("kit_job_goodput_ratio", "gauge", "Productive node-time over the node-time the job's runs held.")
REDONE = Spec(
    "kit_job_resume_redone_steps",
    "gauge",
    "Steps the run made again after resuming from kit's checkpoints (run: the run that resumed; tier: the farthest "
    "tier a rank loaded from: memory, local, peer, shared; kit.jobdir.recovery).",
)
LOAD = Spec("kit_job_resume_load_seconds", "gauge", "The slowest rank's load of the state the run resumed from.")
GOODPUT_EVERY = 10.0  # seconds between two reads of the job directory's records


TIERS = ("memory", "local", "peer", "shared")  # nearest first (kit.train.snapshots's)


class GoodputSource:
    """The job's goodput so far, from its directory (kit.jobdir.goodput), on the job's first node only (every
    node's exporter would serve the same job-wide numbers); read again every :data:`GOODPUT_EVERY` seconds."""

    name = "goodput"

    def __init__(self, job_dir: Path | None):
        self.job_dir, self.read_at, self.samples = job_dir, float("-inf"), []

    def poll(self) -> SourceResult:
        from kit.jobdir.goodput import goodput  # (only the first node's exporter loads it)

        t0 = time.perf_counter()
        if self.job_dir is None:
            return SourceResult([], True, 0.0)
        if time.monotonic() - self.read_at >= GOODPUT_EVERY:
            self.read_at = time.monotonic()
            g = goodput(self.job_dir, running=True)
            self.samples = [] if g is None else [Sample(GOODPUT_PART, {"part": p}, s) for p, s in g.parts.items()]
            if g is not None and g.goodput is not None:
                self.samples.append(Sample(GOODPUT, {}, g.goodput))
            for r in [] if g is None else g.resumes:
                labels = {"run": str(r["run"]), "tier": max(r["tiers"], key=TIERS.index, default="shared")}
                self.samples += [Sample(REDONE, labels, r["redone"]), Sample(LOAD, labels, r["load_seconds"])]
        return SourceResult(list(self.samples), True, time.perf_counter() - t0)


STRAGGLER = Spec(
    "kit_job_straggler_slowdown",
    "gauge",
    "A rank named a straggler (rank, straggler_node: its node; node is the exporter's): its compute per step over "
    "the other ranks' median, from how long each waits in the step's collectives, or its GPU's slowdown (the other "
    "nodes' median SM clock over its own, held down by a slowdown throttle reason), or its node's links' round trips "
    "over the job's other busy links' (kit.monitor.judges).",
)
STRAGGLERS_EVERY = 5.0  # seconds between two judgements of the ranks' files


class StragglerSource:
    """The job's straggler verdicts, on its first node only: every :data:`STRAGGLERS_EVERY` seconds this poll
    collects the ranks' figures, the GPUs held down and the busy links, and the judges decide
    (kit.monitor.judges.Panel); a verdict is recorded in the job directory (kit.jobdir.slow_ranks), told to the
    run (prelaunch acts on it under --on-straggler) and served."""

    name = "stragglers"

    def __init__(self, job_dir: Path | None, progress_dir: str | None = None):
        """``progress_dir``: the run's (``$KIT_PROGRESS_DIR``), where its first verdict goes for prelaunch."""
        from kit.monitor import judges  # (only the first node's exporter loads them)

        self.job_dir, self.progress_dir = job_dir, progress_dir
        self.panel = judges.Panel()
        self.read_at, self.named = float("-inf"), {}

    def poll(self) -> SourceResult:
        from kit.jobdir import slow_ranks
        from kit.monitor import judges

        t0 = time.perf_counter()
        if self.job_dir is not None and time.monotonic() - self.read_at >= STRAGGLERS_EVERY:
            self.read_at = time.monotonic()
            ranks, now, polls = judges.latest(self.job_dir), time.time(), _last_polls(self.job_dir)
            verdict = self.panel.decide(
                ranks,
                held_down(self.job_dir, polls),
                logged_links(polls),
                now,
                evidence_of=lambda node: gpu_evidence(self.job_dir, node),
            )
            if verdict is not None:
                slow_ranks.record(self.job_dir, verdict)
                slow_ranks.tell_the_run(self.progress_dir, verdict)
                self.named[verdict.rank] = verdict
        samples = [
            Sample(STRAGGLER, {"rank": str(s.rank), "straggler_node": s.node}, s.factor) for s in self.named.values()
        ]
        return SourceResult(samples, True, time.perf_counter() - t0)


def _last_polls(job_dir: Path) -> dict[str, dict]:
    """Each node's last logged poll of its latest run (kit.jobdir.metrics.last_polls)."""
    latest: dict[str, tuple[int, dict]] = {}
    for (run, node), poll in jobdir.last_polls(job_dir).items():
        if run >= latest.get(node, (-1,))[0]:
            latest[node] = (run, poll)
    return {node: poll for node, (_, poll) in latest.items()}


def _gpu_clocks(poll: dict) -> dict[str, tuple[float | None, int]]:
    """A poll's GPUs: (SM clock in MHz, the NVML throttle reasons' bitmask) by GPU index."""
    gpus: dict[str, list] = {}
    for sample in poll.get("samples", []):
        try:
            name, labels, value = sample
            gpu = gpus.setdefault(str(labels.get("gpu", "?")), [None, 0])
            if name == "DCGM_FI_DEV_SM_CLOCK":
                gpu[0] = float(value)
            elif name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
                gpu[1] = int(value)
        except (TypeError, ValueError, AttributeError):
            continue
    return {gpu: (clock, reasons) for gpu, (clock, reasons) in gpus.items() if clock is not None}


SLOW_CLOCK = 0.9  # an SM clock under this share of the other nodes' median is slow


def _reasons(reasons: int, only_slowdowns: bool = False) -> list[str]:
    """The throttle reasons' names in ``reasons`` (not gpu_idle; ``only_slowdowns``: the slowdowns alone)."""
    from kit.monitor.gpu import THROTTLE_REASONS  # (only where GPUs are judged)

    names = [name for bit, name in THROTTLE_REASONS if reasons & bit and name != "gpu_idle"]
    return [n for n in names if "slowdown" in n] if only_slowdowns else names


def _all_clocks(job_dir: Path, polls: dict[str, dict] | None = None) -> dict[str, dict[str, tuple[float, int]]]:
    """Each node's GPUs as its exporter last logged them (:func:`_gpu_clocks`; ``polls``: those last polls, read
    already)."""
    return {n: _gpu_clocks(poll) for n, poll in (_last_polls(job_dir) if polls is None else polls).items()}


def logged_links(polls: dict[str, dict]) -> dict[str, dict[tuple[str, str], float]]:
    """Each node's busy links in its last poll (kit.monitor.round_trips): (its address, the peer's) → round trip."""
    from kit.monitor.round_trips import RTT  # (only where links are judged)

    out: dict[str, dict[tuple[str, str], float]] = {}
    for node, poll in polls.items():
        for sample in poll.get("samples", []):
            try:
                name, labels, value = sample
                if name == RTT.name:
                    out.setdefault(node, {})[(str(labels["local"]), str(labels["peer"]))] = float(value)
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
    return out


def _others(clocks: dict[str, dict[str, tuple[float, int]]], node: str) -> float | None:
    """The median SM clock of the GPUs the other nodes logged (None: none did)."""
    others = [c for n, gpus in clocks.items() if n != node for c, _ in gpus.values()]
    return statistics.median(others) if others else None


def held_down(job_dir: Path, polls: dict[str, dict] | None = None) -> dict[tuple[str, str], tuple[int, float, str]]:
    """Each GPU held down now — a slowdown throttle reason (hardware, thermal, power brake) and its SM clock under
    :data:`SLOW_CLOCK` of the other nodes' median — by (node, GPU index): (its place among its node's GPUs, the
    median over its clock, the evidence)."""
    found = {}
    clocks = _all_clocks(job_dir, polls)
    for node, mine in clocks.items():
        typical = _others(clocks, node)
        for place, (gpu, (clock, reasons)) in enumerate(sorted(mine.items(), key=lambda g: _index(g[0]))):
            slowdowns = _reasons(reasons, only_slowdowns=True)
            if slowdowns and typical and 0 < clock < SLOW_CLOCK * typical:
                found[(node, gpu)] = (
                    place,
                    typical / clock,
                    f"GPU {gpu} at {clock:.0f} MHz, held down by {'+'.join(slowdowns)} (the other nodes' median SM "
                    f"clock: {typical:.0f} MHz)",
                )
    return found


def _index(gpu: str) -> tuple[int, str]:
    return (int(gpu), gpu) if gpu.isdigit() else (1 << 30, gpu)


def gpu_evidence(job_dir: Path, node: str) -> str:
    """The straggler's node's GPUs as its exporter last logged them, against the other nodes' median SM clock: the
    GPUs whose clock is held down (a throttle reason but idle) or under 90 % of that median, or that none is; ''
    where the node logged no GPU."""
    clocks = _all_clocks(job_dir)
    mine, typical = clocks.get(node), _others(clocks, node)
    if not mine:
        return ""
    told = []
    for gpu, (clock, reasons) in sorted(mine.items()):
        held = _reasons(reasons)
        if held or (typical and clock < SLOW_CLOCK * typical):
            told.append(f"GPU {gpu} at {clock:.0f} MHz" + (f", held down by {'+'.join(held)}" if held else ""))
    against = f" (the other nodes' median SM clock: {typical:.0f} MHz)" if typical else ""
    if not told:
        return f"its node's {len(mine)} GPU(s): none slow or held down{against}"
    return f"its node's GPUs: {'; '.join(told)}{against}"
