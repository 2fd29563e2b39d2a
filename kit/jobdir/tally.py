"""A job's throughput and duration: the one answer every surface gives for a job (the end of ``--wait``,
``kit ps``, ``kit report`` and its report.json, ``kit events``, ``kit ui``).

- **samples**: what every rank trained in every run — each run's and node's last logged poll (its exporter's log,
  written as the exporter stops, after the command) holds each rank's ``training_samples_total``, the count of that
  run's process (from 0), less its first step's share (that step's time is goodput's ``init``: compiling,
  warming up); a rank file left by an earlier run (its last step before this run began) is not counted again.
- **stepping**: the seconds the job's steps ran (goodput's ``productive`` and ``redone`` parts: rank 0's steps,
  run after run, without the starts, saves, hangs and gaps between them).
- **wall**: the seconds from its submission to its end (goodput's, the same as its line's).

Throughput is samples over stepping seconds — per node its own samples over the same seconds, so the nodes add up
to the job. A running job's live rate (``kit ps``, the ``--wait`` line) is its ranks' latest, a different thing:
what it does now.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit.jobdir.goodput import Goodput, goodput, run_times
from kit.jobdir.metrics import last_polls

SAMPLES = "training_samples_total"
LAST_STEP = "training_last_step_timestamp_seconds"
STEP = "training_step"
STALE = 1.0  # s: a rank's last step this long before its run began is an earlier run's file
LOST_AFTER = 10.0  # s: a node's exporter whose last poll precedes its run's last step by more was lost mid-run


@dataclass(frozen=True)
class LostExporter:
    """A node whose exporter stopped while its run still stepped: its samples after ``last_poll`` are unknown."""

    run: int
    node: str
    last_poll: float  # Unix seconds: its last logged poll
    silent_seconds: float  # of the run's steps after it

    def line(self) -> str:
        return (
            f"{self.node}'s exporter stopped {self.silent_seconds:.0f} s before run {self.run}'s last step: "
            f"its samples after that are unknown, and it is not judged slow or fast"
        )


def lost_exporters(job_dir: str | Path) -> list[LostExporter]:
    """Each run's nodes whose exporter's last logged poll came more than LOST_AFTER seconds before the run's last
    step (rank 0's): killed, or dead of its own, while the run trained on."""
    last_step = {r.run: r.last for r in run_times(Path(job_dir))}
    out = []
    for (run, node), poll in sorted(last_polls(job_dir).items()):
        when, end = poll.get("time"), last_step.get(run)
        if isinstance(when, (int, float)) and end is not None and end - when > LOST_AFTER:
            out.append(LostExporter(run, node, float(when), end - float(when)))
    return out


@dataclass(frozen=True)
class Tally:
    samples: float | None  # None: no rank reported samples (unknown, not zero)
    stepping_seconds: float | None  # None: no run's command reported steps
    wall_seconds: float
    node_samples: dict[str, float] = field(default_factory=dict)
    lost: list[LostExporter] = field(default_factory=list)  # nodes whose exporter stopped mid-run

    def rate(self, node: str | None = None) -> float | None:
        """Samples per second of stepping: the job's, or ``node``'s (None for a node whose exporter was lost: what it
        trained after is unknown — never a slow node for it)."""
        if node is not None and any(lost.node == node for lost in self.lost):
            return None
        samples = self.samples if node is None else self.node_samples.get(node)
        if samples is None or not self.stepping_seconds:
            return None
        return samples / self.stepping_seconds

    def words(self) -> str:
        """``3368 samples/s (12800 samples in 3.8 s of steps); 25.0 s from submission to its end``."""
        rate = self.rate()
        took = f"{self.wall_seconds:.1f} s from submission to its end"
        if rate is None:  # no samples or no steps reported: the duration alone
            return took
        return f"{rate:.1f} samples/s ({self.samples:.0f} samples in {self.stepping_seconds:.1f} s of steps); {took}"

    def as_json(self) -> dict:
        return {**asdict(self), "samples_per_second": self.rate()}


def samples(job_dir: str | Path) -> tuple[float, dict[str, float]] | None:
    """Every rank's samples over every run (the job's, by node); None where no rank reported any."""
    runs = run_times(Path(job_dir))
    starts = {r.run: r.start for r in runs}
    # The step each run began from: the checkpoint the one before it ended with (0: from scratch).
    begun = {r.run: max(runs[i - 1].resumed_from or 0, 0) if i else 0 for i, r in enumerate(runs)}  # -1: none
    total, by_node, seen = 0.0, {}, False
    for (run, node), poll in sorted(last_polls(job_dir).items()):
        ranks: dict[str, dict[str, float]] = {}
        for sample in poll["samples"]:
            try:
                name, labels, value = sample
                if name in (SAMPLES, LAST_STEP, STEP) and math.isfinite(value := float(value)):
                    ranks.setdefault(str(labels["rank"]), {})[name] = value
            except (TypeError, ValueError, KeyError, OverflowError):  # a damaged log's sample: that one only
                continue
        for values in ranks.values():
            start, last = starts.get(run), values.get(LAST_STEP)
            if SAMPLES not in values or (start is not None and last is not None and last < start - STALE):
                continue
            seen = True
            steps = values.get(STEP, 0.0) - begun.get(run, 0)
            counted = values[SAMPLES] * (steps - 1) / steps if steps >= 1 else values[SAMPLES]
            total += counted
            by_node[node] = by_node.get(node, 0.0) + counted
    return (total, by_node) if seen else None


def tally(job_dir: str | Path, running: bool | None = None, spent: Goodput | None = None) -> Tally | None:
    """The job's tally (None before its first run began); ``running`` as for :func:`kit.jobdir.goodput.goodput`, or
    ``spent``, its goodput where the caller has it already."""
    spent = spent or goodput(job_dir, running=running)
    if spent is None:
        return None
    counted = samples(job_dir)
    stepping = spent.parts["productive"] + spent.parts["redone"] or None  # 0: no steps reported
    return Tally(
        samples=counted[0] if counted else None,
        stepping_seconds=stepping,
        wall_seconds=spent.wall_seconds,
        node_samples=counted[1] if counted else {},
        lost=lost_exporters(job_dir),
    )
