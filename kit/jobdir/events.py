"""A job's timeline: what happened to it, in order, across every run, from its directory (``kit events``).

Each :class:`Event` is read from a record kit writes as it happens — the submission (``job_id``), each run's start
(``runs.jsonl``'s ``start_ms``, else prelaunch's ``step-start``), its tasks running (their records), rank 0's first
step (its timeline), the preflight's verdict, the time limit's warning, a hang report, how the run ended
(``runs.jsonl``), a ``kit cancel`` and the end Slurm gave the job (``outcome.json``) — so the timeline is the same
whoever reads it and whenever, here or over ``--host``.
"""

from __future__ import annotations

import time as _time
from dataclasses import asdict, dataclass
from pathlib import Path

from kit import files
from kit.jobdir import recovery
from kit.jobdir.goodput import run_times
from kit.jobdir.layout import JobDir
from kit.jobdir.runs import hangs, parse_fields, read_verdict
from kit.jobdir.sidecars import sidecar_ends, sidecar_text
from kit.jobdir.starts import read_task_record
from kit.jobdir.tally import lost_exporters, tally

# Ties in time keep this order (a run's start before its tasks, its end before the next run's start).
KINDS = (
    "submitted",
    "started",
    "running",
    "preflight",
    "resumed",
    "first-step",
    "checkpoint-interval",
    "warned",
    "hang",
    "straggler",
    "exporter-lost",
    "sidecar-ended",
    "run-ended",
    "restarted",
    "requeued",
    "cancelled",
    "stopped",
    "exited",
    "ended",
)


@dataclass(frozen=True)
class Event:
    time: float  # Unix seconds
    kind: str  # one of KINDS
    text: str
    run: int | None = None
    pending: bool = False  # more is soon known of it (a later run's nodes): --notify waits for it

    def line(self, since: float | None = None) -> str:
        """``+12.3 s  run 1  every task running …`` (``since``: the job's first event), else the local time."""
        when = (
            f"+{self.time - since:9.1f} s"
            if since is not None
            else _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(self.time)) + f".{int(self.time % 1 * 1000):03d}"
        )
        return f"{when}  {'' if self.run is None else f'run {self.run}':<7} {self.text}"

    def as_json(self) -> dict:
        return asdict(self)


def _run_events(d: JobDir, times, record, before) -> list[Event]:
    r, out = times.run, []
    if times.start is not None:
        how = " (restarted in the allocation)" if before is not None and before.then == "restart" else " (requeued)"
        nodes, pending = _replaced(d, r), False
        if r and not _nodes(d, r) and record is None and _time.time() - times.start < NODES_WAIT:
            pending = True  # its tasks are starting: the nodes it runs on are known in a moment
        out.append(Event(times.start, "started", "started" + (how if r else "") + nodes, r, pending))
    if times.tasks is not None:
        since = f" ({times.tasks - times.start:.1f} s after the run's start)" if times.start is not None else ""
        out.append(Event(times.tasks, "running", f"every task running{since}", r))
    progress = d.run_progress(r)
    verdict = read_verdict(progress)
    if verdict is not None and (when := files.mtime(progress / JobDir.PREFLIGHT)) is not None:
        said = f"preflight {verdict['verdict']}" + (f": {verdict['why']}" if verdict["why"] else "")
        out.append(Event(when, "preflight", said, r))
    if times.first is not None:
        out.append(Event(times.first, "first-step", "first step", r))
    if (when := files.mtime(progress / JobDir.WARNING)) is not None:
        out.append(Event(when, "warned", _warning(progress), r))
    if record is not None:
        if record.start_ms is None and record.end == "killed":  # caught up by the next run as it began
            text = "ended without a record of its own (killed): the next run found it so"
        else:
            text = f"ended: {record.end}" + (f", exit code {record.exit_code}" if record.exit_code is not None else "")
        when = record.end_ms / 1000 if record.end_ms is not None else record.time
        if when is not None:
            out.append(Event(float(when), "run-ended", text, r))
            if record.then == "restart":
                out.append(
                    Event(float(when), "restarted", f"restarting in the allocation after run {r} ({record.end})", r)
                )
    # Written after the run's record: never before it, whatever a file's coarser clock says (its mtime may lag
    # the time kit::_append_run read by a clock tick).
    ended = max((e.time for e in out if e.kind == "run-ended"), default=0.0)
    if (when := files.mtime(progress / JobDir.REQUEUED)) is not None:
        out.append(Event(max(when, ended), "requeued", f"requeued: {_line(progress / JobDir.REQUEUED)}", r))
    if (exited := _exited(progress, r)) is not None:
        out.append(Event(max(exited.time, ended), exited.kind, exited.text, r))
    return out


NODES_WAIT = 60.0  # s a later run's start waits, for --notify, to name the nodes it runs on


def _nodes(d: JobDir, run: int) -> set[str]:
    """The nodes run ``run``'s tasks ran on (``progress/r<run>/task-<rank>``: the node first)."""
    records = (read_task_record(p) for p in d.run_progress(run).glob(JobDir.TASK.format(rank="*")))
    return {rec[0] for rec in records if rec}


def _replaced(d: JobDir, run: int) -> str:
    """``; node3 in place of node1`` where run ``run`` runs on nodes the run before it did not (a spare, or what a
    requeue was given), '' otherwise or while its tasks are unknown."""
    now, before = _nodes(d, run), _nodes(d, run - 1) if run else set()
    if not now or not before or now == before:
        return ""
    gone, new = sorted(before - now), sorted(now - before)
    return f"; {_shown(', '.join(new))} in place of {_shown(', '.join(gone))}" if gone and new else ""


def _warning(progress: Path) -> str:
    """Whose warning reached the run: a straggler's (--on-straggler: prelaunch warned the command for it), else the
    time limit's."""
    if not (progress / JobDir.STRAGGLER_STOP).exists():
        return "the time limit's warning reached the run"
    try:
        why = parse_fields(files.read_text(progress / JobDir.STRAGGLER, 4096)).get("why", "")
    except (OSError, ValueError):
        why = ""
    return "a straggler's warning reached the run" + (f" ({_shown(why)})" if why else "")


def _line(path: Path) -> str:
    """A record's first line, as printable text (a record is the job's own, but a terminal shows it)."""
    try:
        text = files.read_text(path, 4096).splitlines()[0]
    except (OSError, IndexError, ValueError):
        return "?"
    return _shown(text)


def _shown(text: str) -> str:
    """A record's text as a terminal may show it (a record is the job's own: its control characters as '?')."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _exited(progress: Path, r: int) -> Event | None:
    """The batch script's last word after run ``r`` (``exited.json``): the job's exit code, as prelaunch decided it
    (``exited``), or that a stop signal ended it (``stopped``: the job's end, or its next run, is Slurm's to tell)."""
    record, when = files.read_record(progress / JobDir.EXITED, 1 << 16), files.mtime(progress / JobDir.EXITED)
    code = record.get("code")
    if not isinstance(code, int) or when is None:
        return None
    if record.get("stopped"):
        why = "a stop signal came (a cancel, a requeue or preemption by Slurm, the time limit): Slurm says what follows"
        return Event(when, "stopped", f"the batch script ended with exit code {code}: {why}", r)
    return Event(when, "exited", f"the batch script ended with exit code {code}", r)


def events(job_dir: str | Path) -> list[Event]:
    """Everything the job's records say happened to it, in order; [] for a job never submitted."""
    from kit.jobdir import records, slow_ranks

    job_dir = Path(job_dir)
    d, out = JobDir(job_dir), []
    submitted = records.submitted_at(job_dir)
    if submitted is not None:
        out.append(Event(submitted, "submitted", f"submitted as job {records.job_id_of(job_dir) or '?'}"))
    ended = {rec.run: rec for rec in records.run_records(job_dir)}
    for times in run_times(job_dir):
        out += _run_events(d, times, ended.get(times.run), ended.get(times.run - 1))
    for h in hangs(job_dir):
        report = d.path / JobDir.HANG / JobDir.RUN.format(run=h["run"]) / JobDir.HANG_REPORT
        if (when := files.mtime(report)) is not None:
            who = f"rank {h['rank']} on {h['node']}" if h["rank"] != "unknown" else "no rank named"
            out.append(Event(when, "hang", f"hang: {h['summary'] or who}", h["run"]))
    for s in slow_ranks.read(job_dir):
        out.append(Event(s.since, "straggler", s.line()))
    for r in recovery.resumes(job_dir):
        if r["time"] is not None:
            out.append(Event(r["time"], "resumed", recovery.resume_line(r).removeprefix(f"run {r['run']} "), r["run"]))
    for i in recovery.intervals(job_dir):
        out.append(Event(i["time"], "checkpoint-interval", recovery.interval_line(i)))
    for lost in lost_exporters(job_dir):
        out.append(Event(lost.last_poll, "exporter-lost", lost.line(), lost.run))
    out += [Event(e["time"], "sidecar-ended", sidecar_text(e), e["run"]) for e in sidecar_ends(job_dir)]
    cancelled = files.read_record(d / JobDir.CANCELLED, 1 << 16)
    if isinstance(cancelled.get("time"), (int, float)):
        why = f": {cancelled['reason']}" if cancelled.get("reason") else ""
        out.append(Event(float(cancelled["time"]), "cancelled", f"cancelled by {cancelled.get('by', '?')}{why}"))
    outcome = files.read_record(d / JobDir.OUTCOME, 1 << 16)
    if isinstance(outcome.get("time"), (int, float)) and isinstance(outcome.get("state"), str):
        counted = tally(job_dir, running=False)
        told = f": {counted.words()}" if counted is not None else ""
        out.append(Event(float(outcome["time"]), "ended", f"ended {outcome['state']} (as Slurm gave it){told}"))
    return sorted(out, key=_order)


def _order(e: Event) -> tuple:
    """By time; at one time, by run (a run's end before the next one's start), the job's own first and last."""
    run = e.run if e.run is not None else (-1 if e.kind == "submitted" else float("inf"))
    return (e.time, run, KINDS.index(e.kind))


# Slurm's states while a requeued run's batch script may still be ending (and writing why it asked for the requeue)
REQUEUE_ENDING = frozenset({"COMPLETING", "REQUEUED"})


def requeue_line(job_dir: str | Path, restarts: int, state: str) -> str | None:
    """What a follower says of a requeue Slurm shows (its restart count went up): kit's record of why, once the
    ending run's prelaunch has written it (a few scontrol calls after its ``scontrol requeue``, which Slurm shows at
    once); Slurm's word once the run has ended without one (an admin, a preemption, a node failure); None while the
    run still ends and no record is there yet (ask again)."""
    said = [e for e in events(job_dir) if e.kind in ("requeued", "started")]
    if said and said[-1].kind == "requeued":
        told = said[-1].text
    elif state in REQUEUE_ENDING:
        return None
    else:
        told = "requeued by Slurm (an admin, a preemption or a node failure)"
    return f"{told}; run {max(e.run or 0 for e in said) + 1 if said else restarts} comes next"
