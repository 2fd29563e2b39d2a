"""Goodput: how much of a job's time trained, and where the rest went, from the timestamps kit writes.

The job's wall time, from its submission (the ``job_id`` record, written as sbatch returns) to its last run's
end (``runs.jsonl``'s ``end_ms``; a running job's: now), is cut into parts that add up to it exactly:

=============  ==================================================================================================
queue          the submission to the first run's start (the batch script's first line)
start          a run's start to its last task's first line: prelaunch, srun, and under an image the container
init           to rank 0's first step: imports, the model, the data, the rendezvous
productive     rank 0's steps that stand (a running job's last ones included)
checkpoint     its saves: from the mark a save writes (``kit.train.progress.checkpointing``) to the next step
redone         steps a later run trained again: from the save it resumed from to this run's last step
hang           a run that ended as a hang: from its last step (no later than the stuck rank's last progress) to
               its end (the watchdog's wait, the stacks, the stop)
ending         any other run's last step to its end (the warning's save, the command's exit, the teardown)
restart        one run's end to the next one's start (a requeue: Slurm's hold, the queue, a killed run's end; a
               restart in the allocation, ``runs.jsonl``'s ``then``: the new step's preparation, its nodes held)
unreported     a run whose command reports no steps (kit.train.progress.step): its time after init, unsplit
=============  ==================================================================================================

Rank 0 speaks for the job (synchronous training moves every rank together): its run's timeline
(``progress/r<run>/timeline-0``, :mod:`kit.train.progress`), or where a run was killed before it wrote its last
line, its heartbeat (the progress file's time). Goodput is the productive node-time against the node-time the
job's runs held (``start`` to end of each run, times its nodes); the queue and requeues hold no nodes, a restart in
the allocation does.
"""

from __future__ import annotations

import time as _time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir
from kit.jobdir.runs import hangs
from kit.jobdir.starts import read_task_record

PARTS = (
    *("queue", "start", "preflight", "init", "productive", "checkpoint", "redone"),
    *("hang", "ending", "restart", "unreported"),
)
HELD = ("start", "preflight", "init", "productive", "checkpoint", "redone", "hang", "ending", "unreported")  # held


@dataclass
class Goodput:
    """A job's time in parts (seconds, :data:`PARTS`), what its runs held (node-seconds) and the share that
    trained; ``goodput`` None when a run's command reported no steps (its time then is ``unreported``)."""

    wall_seconds: float
    parts: dict[str, float]
    nodes: int
    held_node_seconds: float
    productive_node_seconds: float
    goodput: float | None
    runs: int
    live: bool = False  # the job still runs: its end is now
    per_run: list[dict] = field(default_factory=list)
    # Seconds a GPU sat idle (under kit.report's IDLE_UTIL) while the job held it, the mean over its GPUs: part of
    # the held time above, told apart by kit report, which reads the GPU samples (None: none seen).
    idle_gpu_seconds: float | None = None
    restarts_in_allocation: int = 0  # of the runs - 1 restarts, those that kept the allocation (the rest: requeues)
    resumes: list[dict] = field(default_factory=list)  # kit's checkpoints: each run's resume (kit.jobdir.recovery)

    def lost(self) -> list[tuple[str, float]]:
        """The parts that did not train, largest first (those under 0.05 s left out)."""
        rest = [(p, s) for p, s in self.parts.items() if p != "productive" and s >= 0.05]
        return sorted(rest, key=lambda x: -x[1])

    def line(self) -> str:
        """One line: the share trained and where the rest went."""
        lost = ", ".join(f"{p} {s:.1f} s" for p, s in self.lost()) or "nothing"
        share = "n/a (the command reports no steps)" if self.goodput is None else f"{100 * self.goodput:.1f}%"
        idle = "" if self.idle_gpu_seconds is None else f"; GPUs idle {self.idle_gpu_seconds:.1f} s (mean per GPU)"
        resumed = "".join(
            f"; run {r['run']} resumed at step {r['step']}, {r['redone']} step(s) redone, "
            f"{'+'.join(sorted(r['tiers'])) or '?'} in {r['load_seconds']:.2f} s"
            for r in self.resumes
        )
        return (
            f"goodput {share}: {self.parts['productive']:.1f} s trained of {self.wall_seconds:.1f} s "
            f"({self.nodes} node(s), {self.runs} run(s){self._restarts()}); lost: {lost}{idle}{resumed}"
        )

    def _restarts(self) -> str:
        kept = self.restarts_in_allocation
        return f", {kept} restart(s) in the allocation, {self.runs - 1 - kept} requeue(s)" if kept else ""

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class RunTimes:
    """What one run's records say of its times (Unix seconds; None: not recorded): kit.jobdir.events reads them
    too."""

    run: int
    start: float | None = None
    end: float | None = None
    end_word: str | None = None
    resumed_from: int | None = None  # the checkpoint step the next run started from (this run's end record)
    then: str | None = None  # "restart": the next run started in this run's allocation
    tasks: float | None = None  # the last task's first line
    preflight: float | None = None  # --preflight: when its verdict was written (the command starts after it)
    first: float | None = None
    last: float | None = None
    saves: list[tuple[float, float | None, int]] = field(default_factory=list)  # (start, end, step)
    # kit's checkpoints (kit.jobdir.recovery): the steps this run made that the next one made again, of the steps
    # it made (None: the next run resumed from no snapshot of kit's)
    redone_steps: int | None = None
    steps_made: int | None = None


def _timeline(path: Path) -> tuple[float | None, float | None, list[tuple[float, float | None, int]]]:
    """(first, last, saves) of one rank's timeline file; torn or foreign lines skipped."""
    first = last = None
    saves: list[tuple[float, float | None, int]] = []
    try:
        lines = files.read_text(path, 1 << 20).splitlines()
    except OSError:
        return None, None, []
    for line in lines:
        words = line.split()
        try:
            event, at, step = words[0], float(words[1]), int(words[2])
        except (IndexError, ValueError):
            continue
        if event == "first" and first is None:
            first = at
        elif event == "last":
            last = at if last is None else max(last, at)
        elif event == "save":
            saves.append((at, None, step))
        elif event == "saved" and saves and saves[-1][1] is None:
            saves[-1] = (saves[-1][0], at, saves[-1][2])
    return first, last, saves


def _read_run(d: JobDir, run: int) -> RunTimes:
    progress = d.run_progress(run)
    r = RunTimes(run)
    try:
        r.start = float(files.read_text(progress / JobDir.STEP_START, 64).strip())
    except (OSError, ValueError):
        pass
    starts = [rec[2] for p in progress.glob(JobDir.TASK.format(rank="*")) if (rec := read_task_record(p)) and rec[2]]
    r.tasks = max(starts) if starts else None
    r.preflight = files.mtime(progress / JobDir.PREFLIGHT)
    r.first, r.last, r.saves = _timeline(progress / JobDir.TIMELINE.format(rank=0))
    beat = files.mtime(progress / JobDir.RANK_PROGRESS.format(rank=0))
    if r.first is not None and r.last is None and beat is not None:  # killed before its last line: the heartbeat
        r.last = max(r.first, beat)
    return r


def run_times(job_dir: Path) -> list[RunTimes]:
    from kit.jobdir import records  # (records imports this package's face)

    d = JobDir(job_dir)
    numbers = set(d.run_dirs(JobDir.PROGRESS))
    ended = {rec.run: rec for rec in records.run_records(job_dir)}
    stuck = {h["run"]: h["rank"] for h in hangs(job_dir) if h["rank"].isdigit()}
    out = []
    for n in sorted(numbers | set(ended)):
        r = _read_run(d, n)
        beat = files.mtime(d.run_progress(n) / JobDir.RANK_PROGRESS.format(rank=stuck[n])) if n in stuck else None
        if beat is not None and r.first is not None and r.last is not None:
            # A hung run trained no further than its stuck rank's last progress, whatever rank 0 did after
            # (a rank the watchdog's stack dump let run on for a moment: ptrace resumes a stopped process).
            r.last = max(r.first, min(r.last, beat))
        rec = ended.get(n)
        if rec is not None:
            r.end_word, r.resumed_from, r.then = rec.end, rec.checkpoint_step, rec.then
            if rec.start_ms is not None:
                r.start = rec.start_ms / 1000
            if rec.end_ms is not None and rec.start_ms is not None:  # a caught-up run's end_ms is not its end
                r.end = rec.end_ms / 1000
        out.append(r)
    _snapshot_resumes(job_dir, out)
    return out


def _snapshot_resumes(job_dir: Path, runs: list[RunTimes]) -> None:
    """Each run the next resumed from a snapshot of kit's: the steps it made, and those made again."""
    from kit.jobdir import recovery

    resumed = {r["run"]: r for r in recovery.resumes(job_dir)}
    for r in runs:
        after, began = resumed.get(r.run + 1), resumed.get(r.run, {}).get("step", 0)
        if after is not None:
            r.redone_steps, r.steps_made = after["redone"], max(after["newest"] - began, 1)


def _nodes(job_dir: Path) -> int:
    """The nodes the job's allocation held: --nodes, and --spare-nodes beside them (an array task's: its array's)."""
    from kit.jobdir import records

    try:
        spec = files.read_json(records.submission_dir(job_dir) / JobDir.SPEC)
        nodes, spare = spec.get("nodes"), spec.get("spare_nodes", 0)
    except (OSError, ValueError, AttributeError):
        return 1
    nodes = nodes if type(nodes) is int and nodes > 0 else 1
    return nodes + (spare if type(spare) is int and spare > 0 else 0)


def _clamp(t: float | None, lo: float, hi: float) -> float:
    return lo if t is None else min(max(t, lo), hi)


def _overlap(spans: list[tuple[float, float | None, int]], lo: float, hi: float, end: float) -> float:
    """Seconds of the saves ``spans`` (one still open ends at ``end``) inside [lo, hi]."""
    return sum(max(min(e if e is not None else end, hi) - max(s, lo), 0.0) for s, e, _ in spans)


def _cut(r: RunTimes, start: float, end: float, redone_from: float | None, parts: dict[str, float]) -> None:
    """Run ``r``'s held time, [start, end], into parts."""
    tasks = _clamp(r.tasks, start, end)
    parts["start"] += tasks - start
    checked = _clamp(r.preflight, tasks, end) if r.preflight is not None else tasks  # the preflight's own time
    parts["preflight"] += checked - tasks
    if r.first is None:
        parts["unreported"] += end - checked
        return
    first = _clamp(r.first, checked, end)
    last = _clamp(r.last, first, end)
    parts["init"] += first - checked
    saving, saving_after = _overlap(r.saves, first, last, end), _overlap(r.saves, last, end, end)
    parts["checkpoint"] += saving + saving_after
    training = last - first - saving
    redone = 0.0
    if r.redone_steps is not None:  # kit's snapshots: the steps redone, at the run's mean step time
        redone = min(r.redone_steps * (last - first - saving) / r.steps_made, last - first - saving)
    elif redone_from is not None:  # the steps after the save the next run resumed from (its own saves stay saves)
        mark = _clamp(redone_from, first, last)
        redone = last - mark - _overlap(r.saves, mark, last, end)
    parts["redone"] += redone
    parts["productive"] += training - redone
    parts["hang" if r.end_word == "hang" else "ending"] += end - last - saving_after


def _redone_from(r: RunTimes, following: RunTimes | None) -> float | None:
    """Where the steps the next run trained again begin in ``r``: the end of the save of the step it resumed from
    (``r``'s start when that save is older than ``r``); None when no run follows."""
    if following is None:
        return None
    step = r.resumed_from if r.resumed_from is not None else -1
    ends = [e for s, e, n in r.saves if n == step and e is not None]
    return max(ends) if ends else float("-inf")


def goodput(job_dir: str | Path, now: float | None = None, running: bool | None = None) -> Goodput | None:
    """The job's goodput from its directory; None before its first run began (or for a job never submitted).
    ``running``: whether the job still runs (None: when its last run has no end record); a running job's end is
    ``now``, an ended one's last run without a record (killed) ends at its last sign of life."""
    from kit.jobdir import records, recovery

    job_dir = Path(job_dir)
    runs = [r for r in run_times(job_dir) if r.start is not None]
    if not runs:
        return None
    now = _time.time() if now is None else now
    submitted = records.submitted_at(job_dir)
    begin = min(submitted, runs[0].start) if submitted is not None else runs[0].start
    parts = dict.fromkeys(PARTS, 0.0)
    parts["queue"] = runs[0].start - begin
    nodes, held, per_run, cursor, in_allocation = _nodes(job_dir), 0.0, [], begin, 0
    live = (runs[-1].end is None and runs[-1].end_word is None) if running is None else running
    for i, r in enumerate(runs):
        following = runs[i + 1] if i + 1 < len(runs) else None
        start = max(r.start, cursor)
        known_end = r.end if r.end is not None else (now if following is None and live else None)
        if following is None and live and r.end is None and r.first is not None:
            r.last = now  # training still: its steps up to now stand
        if known_end is None:  # killed and caught up: its end is its last sign of life, the rest a restart
            known_end = max(t for t in (r.last, r.tasks, start) if t is not None)
        limit = following.start if following is not None else max(known_end, start)
        end = _clamp(known_end, start, max(limit, start))
        before = dict(parts)
        _cut(r, start, end, _redone_from(r, following), parts)
        kept = following is not None and r.then == "restart"  # the allocation, its nodes waiting for the next run
        if following is not None:
            parts["restart"] += max(following.start - end, 0.0)
        held += (max(following.start, end) if kept else end) - start
        in_allocation += kept
        per_run.append(
            {"run": r.run, "end": r.end_word, **{p: parts[p] - before[p] for p in PARTS if parts[p] != before[p]}}
        )
        cursor = max(end, following.start) if following is not None else end
    wall = cursor - begin
    unreported = parts["unreported"] > 0
    return Goodput(
        wall_seconds=wall,
        parts=parts,
        nodes=nodes,
        held_node_seconds=held * nodes,
        productive_node_seconds=parts["productive"] * nodes,
        goodput=None if unreported or held <= 0 else parts["productive"] / held,
        runs=len(runs),
        live=live,
        per_run=per_run,
        restarts_in_allocation=in_allocation,
        resumes=recovery.resumes(job_dir),
    )
