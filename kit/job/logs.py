"""A job's logs, for `kit logs` and ``Job.logs()`` alike: which logs a request means (a run's
ranks, one rank, a node's ranks, a sidecar's, the batch log when no rank has one), each fed
a chunk at a time (a log of gigabytes is never held whole), the first failure of each run,
and the batch logs followed as they grow until the job has ended."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from kit import files, jobdir, slurm, targets
from kit.errors import KitError
from kit.jobdir import JobDir, failures, records, slow_ranks
from kit.jobdir.runs import read_verdict, verdict_text

Write = Callable[[bytes], None]


@dataclass(frozen=True)
class Selection:
    """The logs a request means: (path, line prefix) each; ``note``: what to tell first (the batch
    log stands in for ranks that left none)."""

    parts: tuple[tuple[Path, str], ...]
    note: str = ""
    text: str = ""  # what stands in for the parts (the batch log's end)


def select(
    job_dir: Path,
    rank: int | None = None,
    node: str | None = None,
    run: int | None = None,
    sidecar: str | None = None,
    prefixed: bool | None = None,
    batch_instead: bool = True,
) -> Selection:
    """The logs of run ``run`` (default: the latest) that ``rank``/``node``/``sidecar`` name; each
    rank's lines prefixed ``R: `` when ``prefixed`` (None: when more than one rank is chosen). No rank
    log yet: the batch log's end with ``batch_instead`` (`kit logs`; KitError when there is none
    either), else nothing (``Job.logs()``: "" until a rank writes). An array job's (its id, not ``ID_TASK``):
    each task's, every line prefixed ``task I: `` too."""
    tasks = _tasks(job_dir, rank, node, run, sidecar)
    if tasks.parts:
        return tasks
    done = records.runs(job_dir)
    run = run if run is not None else (done[-1] if done else 0)
    d = JobDir(job_dir)
    if sidecar is not None:
        paths = d.sidecar_logs(node, run, sidecar)
        if not paths:
            raise KitError(f"no {sidecar!r} sidecar log of run {run}", field="--sidecar")
        return Selection(tuple((p, p.name.split(".")[0] + ": " if len(paths) > 1 else "") for p in paths))
    present = records.ranks(job_dir, run)
    if not present and rank is None and node is None:
        return _batch_instead(job_dir, run) if batch_instead else Selection(())
    chosen = present
    if rank is not None:
        chosen = [r for r in chosen if r == rank]
        if not chosen and present:
            raise KitError(
                f"run {run} has no rank {rank}: kit's ranks are its tasks, {present[0]}-{present[-1]} here",
                field="--rank",
                hint="with a per-node launcher (torchrun: one task per node) a task's log holds every "
                "process it started: kit logs --node NAME",
            )
    if node is not None:
        chosen = [r for r in chosen if records.node_of(job_dir, run, r) == node]
    if not chosen:
        raise KitError(
            f"no rank log of run {run} matches",
            field="JOB",
            hint=f"runs with logs: {', '.join(map(str, done)) or 'none yet'}",
        )
    many = len(chosen) > 1 if prefixed is None else prefixed
    return Selection(tuple((d.rank_log(r, run), f"{r}: " if many else "") for r in chosen))


def _tasks(job_dir: Path, rank: int | None, node: str | None, run: int | None, sidecar: str | None) -> Selection:
    """An array job's tasks' logs that the request names (none: not an array job, or no task has written)."""
    parts: list[tuple[Path, str]] = []
    for index in records.task_indices(job_dir):
        try:
            task = select(JobDir(job_dir).task(index).path, rank, node, run, sidecar, True, False)
        except KitError:  # this task has no such rank, node or sidecar log
            continue
        parts += [(path, f"task {index}: {prefix}") for path, prefix in task.parts]
    return Selection(tuple(parts))


def _batch_instead(job_dir: Path, run: int) -> Selection:
    """No rank of the run left a log (the step failed before any started, or it has not
    started yet): the batch log is where its story is (its last 40 lines)."""
    tail = batch_tail(job_dir, 40)
    if not tail:
        raise KitError(
            f"no log of run {run} yet",
            field="JOB",
            exit_code=1,
            hint="the job has not started (kit ps shows why it waits)",
        )
    return Selection(
        (),
        text=tail + "\n",
        note=f"no rank of run {run} has a log (the step failed before any started, or has not "
        "started): the end of the batch log",
    )


def batch_tail(job_dir: Path, lines: int) -> str:
    """The last ``lines`` of the job's batch log(s), read from the end."""
    text = ""
    for path in JobDir(job_dir).batch_logs():
        try:
            text += files.tail(path, 256 << 10).decode(errors="replace")
        except OSError:
            continue
    return "\n".join(text.splitlines()[-lines:])


def feed(selection: Selection, write: Write) -> None:
    """Each selected log to ``write`` as it is, a chunk at a time, each line prefixed (the batch
    log standing in for ranks: its last 40 lines)."""
    if selection.text:
        write(selection.text.encode())
    for path, prefix in selection.parts:
        _feed_prefixed(path, prefix.encode(), write)


def _feed_prefixed(path: Path, prefix: bytes, write: Write) -> None:
    at_line_start = True

    def chunk(data: bytes) -> None:
        nonlocal at_line_start
        if prefix:
            head = prefix if at_line_start else b""
            data = head + data.replace(b"\n", b"\n" + prefix)
            at_line_start = data.endswith(b"\n" + prefix)
            if at_line_start:
                data = data[: -len(prefix)]
        write(data)

    try:
        files.copy_out(path, chunk)
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror}", field="JOB", exit_code=1) from None
    if not at_line_start and prefix:
        write(b"\n")


def errors(job_dir: Path, runs: list[int] | None = None) -> Iterator[str]:
    """The ranks named stragglers (kit.jobdir.slow_ranks: slow, not failed, and often why a job fell short); per
    run, the first rank that failed by itself: a headline, then its log's last lines (indented); a run that failed
    with no rank failing: the batch log's end; else nothing."""
    yield from (slow.line() for slow in slow_ranks.read(job_dir))
    numbers = records.runs(job_dir) if runs is None else runs
    found = False
    hung = {h["run"]: h for h in jobdir.hangs(job_dir)}
    for run in numbers:
        if run in hung:  # the watchdog stopped every rank: the hang is the failure, its stacks the lines
            found = True
            yield f"run {run}: hang: {hung[run]['summary']}"
            yield from ("  " + line for line in _stacks(hung[run]["stacks"]))
        failure = failures.failure_tail(job_dir, run)
        if failure is None:
            continue
        found = True
        try:
            when = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(failure.end.time))
        except (OverflowError, OSError, ValueError):
            when = "an unreadable time"
        yield f"run {run}: {failure.headline()}, at {when}"
        yield from ("  " + line for line in failure.text.splitlines())
    if found:
        return
    end = records.last_run(job_dir)
    if end is not None and end.end == "failed" and end.exit_code != 0:
        # A step that failed before any rank ran (srun, the container, MPI): the batch log says why.
        yield (
            f"run {end.run} failed (exit code {end.exit_code}) with no rank failing by itself: the end of the batch log"
        )
        yield from ("  " + line for line in batch_tail(job_dir, 20).splitlines())


def run_ends(job_dir: Path) -> Iterator[str]:
    """Each run that did not finish the job, as --wait's end tells it: how it ended, who (the hung rank, the
    straggler, the rank that failed first, the preflight's verdict) and what followed (a restart in the allocation,
    a requeue)."""
    ran = records.run_records(job_dir)
    hung = {h["run"]: h for h in jobdir.hangs(job_dir)}
    slow = slow_ranks.read(job_dir)
    for i, rec in enumerate(ran):
        if rec.end == "finished":
            continue
        if rec.run in hung:
            who = f"hang: {hung[rec.run]['summary']}"
        elif rec.end == "straggler" and slow:
            who = slow[0].line()
        elif rec.end == "preflight" and (v := read_verdict(JobDir(job_dir).run_progress(rec.run))):
            who = f"preflight {verdict_text(v)}"
        elif (failure := failures.failure_tail(job_dir, rec.run)) is not None:
            who = failure.headline()
        else:
            who = ""
        then = "; restarted in the allocation" if rec.then == "restart" else "; requeued" if i + 1 < len(ran) else ""
        code = f" (exit code {rec.exit_code})" if rec.exit_code else ""
        yield f"run {rec.run} ended {rec.end}{code}" + (f": {who}" if who else "") + then


def _stacks(path: str | None, lines: int = 60) -> list[str]:
    """The first ``lines`` lines of a hung rank's stacks file (its process states, then py-spy's stacks)."""
    if path is None:
        return []
    try:
        text = files.read_text(Path(path), 1 << 20)
    except (OSError, ValueError):
        return []
    out = text.splitlines()
    return out[:lines] + ([f"... ({len(out) - lines} more lines in {path})"] if len(out) > lines else [])


def unit_states(
    target: slurm.Target, job_dir: Path, job_id: str, patience: float = slurm.BUSY_PATIENCE
) -> dict[int | None, str]:
    """Slurm's state of the job ({None: state}), or of each task of an array job."""
    indices = records.task_indices(job_dir)
    if indices:
        return {i: st.state for i, st in slurm.array_status(target, job_id, indices, patience).items()}
    return {None: slurm.job_status(target, job_id, patience).state}


def final(state: str) -> bool:
    return state in slurm.TERMINAL_STATES or state == "GONE"


def ended(states: dict[int | None, str]) -> str | None:
    """The end state(s) once the job (every task of an array job) has ended, else None."""
    if not all(final(state) for state in states.values()):
        return None
    return ", ".join(sorted(set(states.values())))


def follow(job_dir: Path, job_id: str, write: Write, on_outage=lambda message: None) -> str:
    """Feed the batch log(s) to ``write`` as they grow (srun's rank-prefixed lines, every run:
    Slurm appends a requeued run to the same file) until the job has ended; an array job's
    tasks' logs with each line prefixed ``task I: ``. Through a controller outage the logs go
    on (as ``--wait`` waits through one). Returns how it ended."""
    target = targets.target_of(job_dir)
    indices = records.task_indices(job_dir)
    offsets: dict[Path, int] = {}
    ended_at: list[float | None] = [None]

    def check() -> str | None:
        if _feed_new(job_dir, indices, offsets, write):
            ended_at[0] = None
        end = ended(unit_states(target, job_dir, job_id, patience=0))  # ControllerUnreachable: follow() asks again
        if not end:
            ended_at[0] = None
            return None
        ended_at[0] = ended_at[0] or time.monotonic()
        return end if time.monotonic() - ended_at[0] > 1.0 else None  # the last lines are in

    return slurm.follow(check, what=f"job {job_id}", poll=0.5, timeout=None, outage=900.0, on_outage=on_outage)


def _feed_new(job_dir: Path, indices: list[int], offsets: dict[Path, int], write: Write) -> bool:
    """What the batch logs gained since ``offsets`` (whole lines) to ``write``; True if any."""
    grew = False
    paths = [(p, b"") for p in JobDir(job_dir).batch_logs()]
    paths += [(p, f"task {i}: ".encode()) for i in indices for p in JobDir(job_dir).task(i).batch_logs()]
    for path, prefix in paths:
        try:
            with files.open_regular(path) as (fd, _):
                os.lseek(fd, offsets.get(path, 0), os.SEEK_SET)
                data = os.read(fd, 16 << 20)
        except OSError:
            continue
        cut = data.rfind(b"\n") + 1  # whole lines only
        if cut:
            chunk = data[:cut]
            if prefix:
                chunk = b"".join(prefix + line for line in chunk.splitlines(keepends=True))
            write(chunk)
            offsets[path] = offsets.get(path, 0) + cut
            grew = True
    return grew
