"""The ranks named slow: ``stragglers.json`` (each rank's latest verdict, with its evidence) and the run's first
verdict for prelaunch (``progress/r<run>/straggler``). The judges that name them run in the first node's exporter
(:mod:`kit.monitor.judges`); ``kit ps --json``, the ``--wait`` line, ``kit report``, ``kit events`` and ``kit
ui`` read them back here. (What a rank measures of its own waits is :mod:`kit.train.stragglers`.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir
from kit.jobdir.runs import fields_text


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    factor: float  # its compute per step over the other ranks' median
    evidence: str
    since: float  # Unix time: when it became the outlier
    at: float  # Unix time: the latest judgement that named it
    by: str = "step"  # what named it: "step" (its compute per step), "gpu" (its GPU held down, GpuJudge) or "link"
    # (its node's network links slow, LinkJudge)

    def line(self) -> str:
        if self.by == "link":
            return f"straggler: rank {self.rank} on {self.node}, its links {self.factor:.1f}x slower ({self.evidence})"
        if self.by == "gpu":
            return f"straggler: rank {self.rank} on {self.node}, its GPU {self.factor:.2f}x slower ({self.evidence})"
        return f"straggler: rank {self.rank} on {self.node}, {self.factor:.2f}x the other ranks' step ({self.evidence})"


def read(job_dir: str | Path) -> list[Straggler]:
    """The ranks named in the job so far (one entry per rank: its latest verdict), oldest first."""
    try:
        data = files.read_json(Path(job_dir) / JobDir.STRAGGLERS)
        return [Straggler(**s) for s in data["stragglers"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def record(job_dir: str | Path, verdict: Straggler) -> None:
    """Keep ``verdict`` in the job's record (the rank's earlier entry updated, its first ``since`` kept)."""
    kept = {s.rank: s for s in read(job_dir)}
    before = kept.get(verdict.rank)
    if before is not None and before.node == verdict.node:
        verdict = Straggler(**{**asdict(verdict), "since": min(before.since, verdict.since)})
    kept[verdict.rank] = verdict
    ordered = sorted(kept.values(), key=lambda s: s.since)
    files.write_atomic(Path(job_dir) / JobDir.STRAGGLERS, json.dumps({"stragglers": [asdict(s) for s in ordered]}))


def tell_the_run(progress_dir: str | None, verdict: Straggler) -> None:
    """The run's first verdict in ``progress/r<run>/straggler`` (rank=, node=, factor=, why= lines), for prelaunch:
    with ``--on-straggler requeue`` it warns the command to checkpoint and stop, and requeues the job without the
    node (launch/prelaunch_watchdog.sh, kit::watch_stragglers). Later verdicts of the run leave it as it is."""
    if not progress_dir:
        return
    path = Path(progress_dir) / JobDir.STRAGGLER
    if path.exists():
        return
    fields = {"rank": verdict.rank, "node": verdict.node, "factor": f"{verdict.factor:.2f}", "why": verdict.line()}
    try:
        files.write_atomic(path, fields_text(fields))
    except OSError:
        pass  # the verdict stands in stragglers.json; the run goes on
