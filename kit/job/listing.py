"""`kit ps`: kit's jobs (from the job directories it knows) joined with the
scheduler's view of them.

One ``squeue`` per Slurm the jobs went to; a job Slurm has forgotten (or a
Slurm that does not answer) is told from its job directory instead, and the
row says which source it came from.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kit import jobdir, slurm, targets
from kit.core.text import printable
from kit.errors import KitError
from kit.jobdir import JobDir, end_records, job_index, records, slow_ranks, trained
from kit.jobdir.goodput import goodput
from kit.jobdir.runs import read_verdict
from kit.jobdir.sidecars import sidecar_ends
from kit.jobdir.tally import lost_exporters, tally

RECENT = 24 * 3600  # without --all: ended jobs submitted this recently


@dataclass
class JobRow:
    id: str  # the job id; ID_TASK for an array task
    name: str
    state: str  # Slurm's, or the job directory's (see state_from)
    state_from: str  # "slurm", "job directory" or "job directory (slurm: ...)"
    reason: str
    nodes: str
    run: int  # the latest run (0 is the first; each requeue adds one)
    step: int | None
    max_steps: int | None
    loss: float | None
    samples_per_second: float | None
    submitted: float | None  # Unix time
    job_dir: str
    finished: bool  # the FINISHED marker: the work is done
    task_start: dict | None = None  # the latest run's seconds from srun to each node's first task (container start)
    rerun_of: str | None = None  # kit rerun: the id of the job this one reruns
    tflops: float | None = None  # rank 0's device, the latest: the model's TFLOP/s (kit.train.mfu)
    mfu: float | None = None  # of that device's peak (None: n/a)
    stragglers: list | None = None  # the ranks named slow (kit.jobdir.slow_ranks: rank, node, factor, evidence, ...)
    preflight: dict | None = None  # --preflight: the latest run's verdict (verdict, nodes, why, checked)
    # An ended job's seconds from submission to its end (samples_per_second then its throughput: kit.jobdir.tally);
    # None while it runs (samples_per_second is then its ranks' latest).
    duration_seconds: float | None = None
    exporters_lost: list | None = None  # nodes whose exporter stopped while their run trained (kit.jobdir.tally)
    goodput: float | None = None  # the share of its time that trained so far (kit.jobdir.goodput; None: n/a)
    sidecars_ended: list | None = None  # the latest run's sidecars that ended by themselves: "NAME@NODE (exit N)"

    @property
    def unit_dir(self) -> Path:
        """The row's own directory: an array task's ``tasks/<i>``, else the job's."""
        _, sep, task = self.id.partition("_")
        return JobDir(self.job_dir).task(int(task)).path if sep and task.isdigit() else Path(self.job_dir)

    @property
    def active(self) -> bool:
        return self.state not in slurm.TERMINAL_STATES and self.state not in ("ENDED", "GONE")

    def as_json(self) -> dict:
        return {**asdict(self), "active": self.active}

    @classmethod
    def from_json(cls, value: dict) -> "JobRow":
        """The row :meth:`as_json` gave (on a login node, for ``kit.jobs(host=)``)."""
        return cls(**{k: v for k, v in value.items() if k != "active"})


def _units(job_dir: Path) -> list[tuple[str, Path]]:
    """(name, directory) for a job, or for each task of an array job."""
    job_id = records.job_id_of(job_dir) or "?"
    indices = records.task_indices(job_dir)
    if not indices:
        return [(job_id, job_dir)]
    return [(f"{job_id}_{i}", JobDir(job_dir).task(i).path) for i in indices]


def _row(
    name: str, unit_dir: Path, job_dir: Path, job_name: str, st: slurm.JobStatus | None, unreachable: str | None
) -> JobRow:
    p = trained.training_progress(unit_dir)
    done = records.runs(unit_dir)
    run = max(done[-1] if done else 0, st.restarts if st else 0)
    if st is not None and st.state != "GONE":
        state, source = st.state, "slurm"
    else:
        state = end_records.recorded_state(unit_dir)
        if unreachable and state not in ("COMPLETED", "CANCELLED", "FAILED"):
            state = "UNKNOWN"
        source = f"job directory (slurm: {unreachable})" if unreachable else "job directory"
    ended = state in slurm.TERMINAL_STATES or state == "ENDED"
    counted = tally(unit_dir, running=False) if ended else None  # the job's throughput and duration, as everywhere
    return JobRow(
        id=name,
        name=job_name,
        state=state,
        state_from=source,
        reason=(
            f"{st.reason}: release it with scontrol release {st.job_id}"
            if st and st.held
            else (st.detail or st.reason)
            if st and st.reason not in ("None", "")
            else ""
        ),
        nodes=st.nodes if st else "",
        run=run,
        step=p.step,
        max_steps=p.max_steps,
        loss=p.loss,
        samples_per_second=p.samples_per_second if state == "RUNNING" else counted and counted.rate(),
        submitted=records.submitted_at(job_dir),
        job_dir=str(job_dir),
        finished=end_records.finished(unit_dir),
        task_start=jobdir.task_starts(unit_dir, run) or None,
        rerun_of=records.rerun_of(job_dir),
        tflops=p.tflops,
        mfu=p.mfu,
        stragglers=[asdict(s) for s in slow_ranks.read(unit_dir)] or None,
        preflight=read_verdict(JobDir(unit_dir).run_progress(run)),
        duration_seconds=counted and counted.wall_seconds,
        exporters_lost=sorted({lost.node for lost in (counted.lost if counted else lost_exporters(unit_dir))}) or None,
        goodput=(g := goodput(unit_dir, running=not ended)) and g.goodput,
        sidecars_ended=[
            f"{e['name']}@{e['node']} (exit {e['code']})" for e in sidecar_ends(unit_dir) if e["run"] == run
        ]
        or None,
    )


def list_jobs(
    output_dirs: list[Path],
    *,
    everything: bool = False,
    now: float | None = None,
    only: list[Path] | None = None,
    ask=None,
) -> list[JobRow]:
    """Rows for kit's known jobs, newest first: every active job, and (without
    ``everything``) ended ones submitted in the last 24 hours; ``only``: these job directories' rows; ``ask``:
    what asks a Slurm for its jobs' states (default :func:`kit.slurm.statuses`; kit ui's answers from the
    background, kit.ui.states)."""
    now = time.time() if now is None else now
    dirs = job_index.known_job_dirs(output_dirs) if only is None else only
    by_target: dict[slurm.Target, list[Path]] = {}
    known: dict[Path, tuple[dict[str, slurm.JobStatus], str | None]] = {}
    for d in dirs:
        if records.job_id_of(d) is None:
            known[d] = ({}, "its job_id is damaged")
            continue
        try:
            by_target.setdefault(targets.target_of(d), []).append(d)
        except KitError as e:  # this row's problem (an untrusted or damaged record) stays in its row
            known[d] = ({}, e.message)
    for target, group in by_target.items():
        names = [n for d in group for n, _ in _units(d)]
        found, problem = {}, targets.unavailable(target)
        if problem is None:
            try:
                found = (ask or slurm.statuses)(target, names)
            except KitError as e:  # down, or no Slurm here: the job directories still tell a lot
                problem = e.message
        for d in group:
            known[d] = (found, problem)
    rows, mine = [], {d: jobdir.owner(d) == os.geteuid() for d in dirs}
    for d in dirs:
        found, problem = known[d]
        job_name = records.job_name(d)
        for name, unit in _units(d):
            row = _row(name, unit, d, job_name, found.get(name), problem)
            if everything or row.active or row.state == "UNKNOWN" or (now - (row.submitted or 0)) < RECENT:
                rows.append(row)
    # Another user's directory naming the id of one of this user's own (a shared output directory): not a row.
    own_ids = {r.id for r in rows if mine[Path(r.job_dir)]}
    return [r for r in rows if mine[Path(r.job_dir)] or r.id not in own_ids]


@dataclass(frozen=True)
class Filter:
    """Which rows `kit ps` shows: states (Slurm's words, or ``active``), a name pattern (a glob),
    submitted at most ``since`` seconds ago, the job directory's owner; None: any."""

    states: frozenset[str] | None = None
    name: str | None = None
    since: float | None = None
    user: str | None = None

    # What a row's STATE can say: Slurm's words, kit's own (ENDED: the directory's end, Slurm forgot the
    # job; GONE, UNKNOWN) and ``active`` (every state not ended).
    STATES = slurm.TERMINAL_STATES | slurm.LIVE_STATES | {"ENDED", "GONE", "UNKNOWN", "ACTIVE"}

    @classmethod
    def checked(
        cls, states: str | None = None, name: str | None = None, since: float | None = None, user: str | None = None
    ) -> "Filter":
        """The filter `kit ps` was given: a state no job can be in, or a user this machine does not know,
        is refused (it would list nothing, silently)."""
        wanted = frozenset(w.strip().upper() for w in states.split(",") if w.strip()) if states else None
        unknown = sorted((wanted or set()) - cls.STATES)
        if unknown:
            raise KitError(
                f"no job is ever in state {', '.join(unknown)}",
                field="--state",
                hint="one or more of: active, " + ", ".join(sorted(s.lower() for s in cls.STATES if s != "ACTIVE")),
            )
        if user is not None:
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise KitError(
                    f"no user {user!r} on this machine",
                    field="--user",
                    hint="a login name, as `ls -l` shows a job directory's owner",
                ) from None
        return cls(wanted, name, since, user)

    def __call__(self, r: JobRow, now: float) -> bool:
        if self.states and not (r.state.upper() in self.states or ("ACTIVE" in self.states and r.active)):
            return False
        if self.name and not fnmatch.fnmatchcase(
            r.name, self.name if any(c in self.name for c in "*?[") else f"*{self.name}*"
        ):
            return False
        if self.since is not None and (r.submitted is None or now - r.submitted > self.since):
            return False
        return self.user is None or jobdir.owner_name(jobdir.owner(Path(r.job_dir))) == self.user


def _age(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


COLUMNS = ("JOB", "NAME", "STATE", "NODES", "RUN", "STEP", "LOSS", "SAMPLES/S", "GOODPUT", "STRAGGLER", "AGE", "DIR")


def table(rows: list[JobRow], now: float | None = None) -> list[str]:
    """The rows as aligned text lines, a header first."""
    now = time.time() if now is None else now

    def cells(r: JobRow) -> tuple[str, ...]:
        step = "-" if r.step is None else (f"{r.step}/{r.max_steps}" if r.max_steps else str(r.step))
        state = r.state + (f" ({r.reason})" if r.reason and r.state == "PENDING" else "")
        if r.state_from != "slurm":
            state += "*"
        if r.exporters_lost:
            state += f" (exporter lost: {','.join(r.exporters_lost)})"
        if r.sidecars_ended:
            state += f" (sidecar ended: {', '.join(r.sidecars_ended)})"
        return (
            printable(r.id),
            printable(r.name)[:24],
            printable(state),
            printable(r.nodes or "-"),
            str(r.run),
            step,
            "-" if r.loss is None else f"{r.loss:.4g}",
            "-" if r.samples_per_second is None else f"{r.samples_per_second:.0f}",
            "-" if r.goodput is None else f"{100 * r.goodput:.0f}%",
            straggler_cell(r.stragglers),
            "-" if r.submitted is None else _age(now - r.submitted),
            printable(r.job_dir),
        )

    body = [cells(r) for r in rows]
    widths = [max(len(c[i]) for c in [COLUMNS, *body]) for i in range(len(COLUMNS) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + "  " + line[-1] for line in [COLUMNS, *body]]


def straggler_cell(named: list | None) -> str:
    """The ranks named stragglers, as ``rank 3@node2`` (the newest first), or ``-``."""
    newest = sorted(named or [], key=lambda s: -float(s.get("at") or 0))
    return ", ".join(printable(f"rank {s.get('rank')}@{s.get('node')}") for s in newest) or "-"


def collapse_arrays(rows: list[JobRow]) -> list[JobRow]:
    """One row per array job (its tasks' states counted: ``RUNNING [2 RUNNING, 9 COMPLETED]``);
    other rows as they are, in order."""
    out: list[JobRow] = []
    groups: dict[str, list[JobRow]] = {}
    for r in rows:
        array_id, sep, task = r.id.partition("_")
        if not (sep and task.isdigit()):
            out.append(r)
            continue
        if array_id not in groups:
            groups[array_id] = []
            out.append(
                JobRow(
                    id=array_id,
                    name=r.name,
                    state="",
                    state_from="",
                    reason="",
                    nodes="",
                    run=0,
                    step=None,
                    max_steps=None,
                    loss=None,
                    samples_per_second=None,
                    submitted=r.submitted,
                    job_dir=r.job_dir,
                    finished=False,
                )
            )
        groups[array_id].append(r)
    for row in out:
        tasks = groups.get(row.id) if not row.state else None
        if not tasks:
            continue
        counts: dict[str, int] = {}
        for t in tasks:
            counts[t.state] = counts.get(t.state, 0) + 1
        lead = next(
            (
                s
                for s in (
                    "RUNNING",
                    "COMPLETING",
                    "PENDING",
                    "REQUEUED",
                    "UNKNOWN",
                    "FAILED",
                    "TIMEOUT",
                    "NODE_FAIL",
                    "OUT_OF_MEMORY",
                    "CANCELLED",
                    "ENDED",
                )
                if s in counts
            ),
            max(counts, key=counts.get),
        )
        if set(counts) == {"COMPLETED"}:
            lead = "COMPLETED"
        row.state = (
            f"{lead} [{', '.join(f'{n} {s}' for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}]"
        )
        row.state_from = "slurm" if all(t.state_from == "slurm" for t in tasks) else "job directory"
        row.nodes = ",".join(sorted({t.nodes for t in tasks if t.nodes}))
        row.run = max(t.run for t in tasks)
        row.finished = all(t.finished for t in tasks)
        row.reason = next((t.reason for t in tasks if t.state == "PENDING" and t.reason), "")
    return out
