"""`kit ps`, `kit logs` and `kit cancel`: follow submitted jobs without raw Slurm commands."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import click

from kit.errors import KitError
from kit.jobdir import JobDir

_OUTPUT_DIR = click.option("--output-dir", default="kit-jobs", show_default=True,
                           help="Where to look up a job id.")


def _job(job: str, output_dir: str) -> tuple[Path, str]:
    from kit.jobdir import records

    job_dir = records.find_job_dir(job, output_dir)
    job_id = records.job_id_of(job_dir)
    if job_id is None:
        raise KitError(f"{job_dir} was never submitted (no job_id in it)", field="JOB",
                       hint="a --dry-run writes the directory only")
    return job_dir, job_id


@click.command()
@click.option("-a", "--all", "everything", is_flag=True,
              help="Every job kit knows [default: active jobs, and ended ones submitted in the last 24 hours].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, as a list.")
@click.option("--output-dir", "output_dirs", multiple=True, default=("kit-jobs",), show_default=True,
              help="Also look for job directories here (repeatable); jobs kit submitted are always known.")
@click.option("-t", "--tasks", "expand", is_flag=True,
              help="A row per task of an array job [default: one row per array job, its tasks' states counted].")
@click.option("--state", "states", metavar="STATES", help="Only these states, comma-separated (RUNNING,PENDING; "
              "active: every state not ended).")
@click.option("--name", metavar="PATTERN", help="Only jobs whose name holds PATTERN (or matches it, with * ? []).")
@click.option("--since", metavar="AGE", help="Only jobs submitted in the last AGE (90s, 30m, 2h, 1d).")
@click.option("--user", metavar="USER", help="Only jobs whose directory USER owns.")
def ps(everything, as_json, output_dirs, expand, states, name, since, user):
    """kit's jobs, newest first, with Slurm's view of them.

    JOB is the job id (an array job's tasks are counted in one row; --tasks
    shows ID_TASK rows, as --json always does), RUN the latest run (each
    requeue adds one), STEP, LOSS and SAMPLES/S the training's latest report.
    A state marked * comes from the job directory: Slurm has forgotten the job
    (or does not answer); it is the end Slurm gave it when kit last saw it,
    else COMPLETED only with the job's FINISHED marker.
    """
    from kit import listing

    wanted = listing.Filter(frozenset(w.strip().upper() for w in states.split(",") if w.strip()) if states else None,
                            name, _age_seconds(since) if since else None, user)
    now = time.time()
    rows = [r for r in listing.list_jobs([Path(d) for d in output_dirs], everything=everything or bool(since))
            if wanted(r, now)]
    if as_json:
        click.echo(json.dumps([r.as_json() for r in rows], indent=2))
        return 0
    if not rows:
        click.echo("no jobs" + ("" if everything else " (active, or submitted in the last 24 hours); "
                                                         "kit ps --all lists every job"), err=True)
        return 0
    for line in listing.table(rows if expand else listing.collapse_arrays(rows)):
        click.echo(line)
    return 0


def _age_seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text.strip())
    if not m:
        raise KitError(f"not an age: {text!r}", field="--since", hint="e.g. 90s, 30m, 2h or 1d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@click.command()
@click.argument("job")
@click.option("--reason", default=None, metavar="TEXT", help="Why: recorded in the job directory.")
@_OUTPUT_DIR
def cancel(job, reason, output_dir):
    """Cancel JOB (an id or a job directory), recording who and why in its directory.

    The job ends CANCELLED and is never marked finished; an array job's every task is cancelled.
    """
    from kit import api
    from kit.jobdir import records

    job_dir, job_id = _job(job, output_dir)
    rec = api.cancel(job_dir, reason)
    why = f" ({rec['reason']})" if rec["reason"] else ""
    click.echo(f"cancelled job {job_id}{why}; recorded in {job_dir / records.CANCEL_RECORD}")


@click.command()
@click.argument("job")
@click.option("--rank", type=int, default=None, help="Only this rank's own log.")
@click.option("--node", default=None, metavar="NAME", help="Only the ranks that ran on this node.")
@click.option("--restart", type=int, default=None, metavar="K", help="Run K (0 is the first) [default: the latest].")
@click.option("--sidecar", default=None, metavar="NAME", help="A sidecar's log (e.g. exporter) instead of the ranks'.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what is written, across requeues, until the job ends.")
@click.option("--errors", is_flag=True, help="Per run, the first rank that failed by itself: node, code, its last lines.")
@_OUTPUT_DIR
def logs(job, rank, node, restart, sidecar, follow, errors, output_dir):
    """Show JOB's log (an id or a job directory): every rank's output, rank-prefixed."""
    from kit.jobdir import records

    for value, field in ((sidecar, "--sidecar"), (node, "--node")):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", value):
            raise KitError(f"{value!r} is not a {field[2:]} name", field=field,
                           hint="letters, digits, '.', '_' and '-' (as kit ps and the job directory show them)")
    job_dir, job_id = _job(job, output_dir)
    done = records.runs(job_dir)
    if errors:
        return _errors(job_dir, done if restart is None else [restart])
    if follow:
        if rank is not None or node is not None or sidecar is not None or restart is not None:
            raise KitError("-f follows the whole job's log (every run, every rank)", field="--follow",
                           hint="leave out --rank/--node/--sidecar/--restart, or drop -f")
        return _follow(job_dir, job_id)
    run = restart if restart is not None else (done[-1] if done else 0)
    if sidecar is not None:
        paths = JobDir(job_dir).sidecar_logs(node, run, sidecar)
        if not paths:
            raise KitError(f"no {sidecar!r} sidecar log of run {run}", field="--sidecar")
        for p in paths:
            _print_log(p, p.name.split(".")[0] + ": " if len(paths) > 1 else "")
        return 0
    present = records.ranks(job_dir, run)
    if not present and rank is None and node is None:
        return _batch_log_instead(job_dir, run)
    chosen = present
    if rank is not None:
        chosen = [r for r in chosen if r == rank]
        if not chosen and present:
            raise KitError(f"run {run} has no rank {rank}: kit's ranks are its tasks, "
                           f"{present[0]}-{present[-1]} here", field="--rank",
                           hint="with a per-node launcher (torchrun: one task per node) a task's log holds every "
                                "process it started: kit logs --node NAME")
    if node is not None:
        chosen = [r for r in chosen if records.node_of(job_dir, run, r) == node]
    if not chosen:
        raise KitError(f"no rank log of run {run} matches", field="JOB",
                       hint=f"runs with logs: {', '.join(map(str, done)) or 'none yet'}")
    for r in chosen:
        _print_log(JobDir(job_dir).rank_log(r, run), f"{r}: " if len(chosen) > 1 else "")
    return 0


def _batch_logs(job_dir: Path) -> list[Path]:
    return JobDir(job_dir).batch_logs()


def _batch_tail(job_dir: Path, lines: int) -> str:
    """The last ``lines`` of the job's batch log(s), read from the end."""
    from kit import files

    text = ""
    for path in _batch_logs(job_dir):
        try:
            text += files.tail(path, 256 << 10).decode(errors="replace")
        except OSError:
            continue
    return "\n".join(text.splitlines()[-lines:])


def _batch_log_instead(job_dir: Path, run: int) -> int:
    """No rank of the run left a log (the step failed before any started, or it has not
    started yet): the batch log is where its story is."""
    tail = _batch_tail(job_dir, 40)
    if not tail:
        raise KitError(f"no log of run {run} yet", field="JOB", exit_code=1,
                       hint="the job has not started (kit ps shows why it waits)")
    click.echo(f"kit: no rank of run {run} has a log (the step failed before any started, or has not started): "
               "the end of the batch log", err=True)
    _print_prefixed(tail, "")
    return 0


def _print_prefixed(text: str, prefix: str) -> None:
    for line in text.splitlines():
        click.echo(prefix + line)


def _print_log(path: Path, prefix: str) -> None:
    """A log as it is (a chunk at a time: a huge log is never held whole), each line prefixed."""
    from kit import files

    out = click.get_binary_stream("stdout")
    at_line_start = [True]

    def write(data: bytes) -> None:
        if prefix:
            head = prefix.encode() if at_line_start[0] else b""
            data = head + data.replace(b"\n", b"\n" + prefix.encode())
            if data.endswith(b"\n" + prefix.encode()):
                data = data[:-len(prefix.encode())]
                at_line_start[0] = True
            else:
                at_line_start[0] = False
        out.write(data)

    try:
        files.copy_out(path, write)
    except OSError as e:
        raise KitError(f"cannot read {path}: {e.strerror}", field="JOB", exit_code=1) from None
    if not at_line_start[0] and prefix:
        out.write(b"\n")
    out.flush()


def _errors(job_dir: Path, run_numbers: list[int]) -> int:
    from kit.jobdir import failures, records

    found = False
    for run in run_numbers:
        failure = failures.failure_tail(job_dir, run)
        if failure is None:
            continue
        found = True
        e = failure.end
        try:
            when = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(e.time))
        except (OverflowError, OSError, ValueError):
            when = "an unreadable time"
        click.echo(f"run {run}: {failure.headline()}, at {when}")
        _print_prefixed(failure.text, "  ")
    if not found:
        end = records.last_run(job_dir) or {}
        if end.get("end") == "failed" and end.get("exit_code") not in (0, None):
            # A step that failed before any rank ran (srun, the container, MPI): the batch log says why.
            click.echo(f"run {end.get('run', '?')} failed (exit code {end.get('exit_code')}) with no rank failing "
                       "by itself: the end of the batch log")
            _print_prefixed(_batch_tail(job_dir, 20), "  ")
            return 0
        click.echo("no rank failed by itself" + (f" in run {run_numbers[0]}" if len(run_numbers) == 1 else ""))
    return 0


def _follow(job_dir: Path, job_id: str) -> int:
    """Print the batch log(s) as they grow (srun's rank-prefixed lines, every run:
    Slurm appends a requeued run to the same file) until the job has ended; an
    array job's tasks' logs with each line prefixed ``task I: ``. Through a
    controller outage the logs go on (as ``--wait`` waits through one)."""
    from kit import api, slurm, targets
    from kit.jobdir import records

    target = targets.target_of(job_dir)
    indices = records.task_indices(job_dir)
    offsets: dict[Path, int] = {}
    ended_at: list[float | None] = [None]

    def check() -> str | None:
        if _print_new(job_dir, indices, offsets):
            ended_at[0] = None
        ended = api.ended(api.unit_states(target, job_dir, job_id))  # ControllerUnreachable: follow() asks again
        if not ended:
            ended_at[0] = None
            return None
        ended_at[0] = ended_at[0] or time.monotonic()
        return ended if time.monotonic() - ended_at[0] > 1.0 else None  # the last lines are in

    ended = slurm.follow(check, what=f"job {job_id}", poll=0.5, timeout=None, outage=900.0,
                         on_outage=lambda message: click.echo(f"kit: {message}", err=True))
    click.echo(f"kit: job {job_id} ended {ended}", err=True)
    return 0


def _print_new(job_dir: Path, indices: list[int], offsets: dict[Path, int]) -> bool:
    """Print what the batch logs gained since ``offsets`` (whole lines); True if any."""
    from kit import files

    grew = False
    paths = [(p, "") for p in _batch_logs(job_dir)]
    paths += [(p, f"task {i}: ") for i in indices for p in JobDir(job_dir).task(i).batch_logs()]
    for path, prefix in paths:
        try:
            with files.open_regular(path) as (fd, _):
                os.lseek(fd, offsets.get(path, 0), os.SEEK_SET)
                data = os.read(fd, 16 << 20)
        except OSError:
            continue
        cut = data.rfind(b"\n") + 1  # whole lines only
        if cut:
            text = data[:cut].decode(errors="replace")
            if prefix:
                text = "".join(prefix + line for line in text.splitlines(keepends=True))
            sys.stdout.write(text)
            sys.stdout.flush()
            offsets[path] = offsets.get(path, 0) + cut
            grew = True
    return grew


@click.command()
@click.argument("job")
@click.option("--edit", "edits", multiple=True, metavar="KEY=VALUE",
              help="Change a field first, as a job file writes it: --edit nodes=4 --edit time='\"1:00:00\"' (repeatable).")
@click.option("--wait", "wait_", is_flag=True, help="Block until the new job ends; exit with its exit code.")
@_OUTPUT_DIR
def rerun(job, edits, wait_, output_dir):
    """Submit JOB again: a new job with its resolved spec (job.json), in a new directory.

    The new job goes to the same Slurm and records which job it reruns (rerun_of.json;
    kit ps --json shows it). Only a job directory of your own is rerun.
    """
    from kit import api
    from kit.cli.launch import wait_and_report

    job_dir, _ = _job(job, output_dir)
    new = api.rerun(job_dir, list(edits))
    click.echo(f"Submitted job {new.id}")
    click.echo(f"job dir: {new.dir}")
    return wait_and_report(new.target, new.id, new.dir) if wait_ else 0
