"""`kit ps`, `kit logs`, `kit cancel`, `kit rerun` and `kit events`: follow submitted jobs without raw Slurm commands."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import click

from kit.cli.common import OUTPUT_DIR_LOOKUP, output_dirs
from kit.errors import KitError


def _job(job: str, output_dir: str) -> tuple[Path, str]:
    import os

    from kit import jobdir
    from kit.jobdir import lookup, records

    job_dir = lookup.find_job_dir(job, output_dir)
    owner = jobdir.owner(job_dir)
    if owner != os.geteuid():  # what it says (its id, its logs) is its owner's word
        click.echo(f"kit: note: {job_dir} is {jobdir.owner_name(owner)}'s job directory, not yours", err=True)
    return job_dir, records.submitted_id(job_dir)


@click.command()
@click.option(
    "-a",
    "--all",
    "everything",
    is_flag=True,
    help="Every job kit knows [default: active jobs, and ended ones submitted in the last 24 hours].",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, as a list.")
@output_dirs("Also look for job directories here (repeatable); jobs kit submitted are always known.")
@click.option(
    "-t",
    "--tasks",
    "expand",
    is_flag=True,
    help="A row per task of an array job [default: one row per array job, its tasks' states counted].",
)
@click.option(
    "--state",
    "states",
    metavar="STATES",
    help="Only these states, comma-separated (RUNNING,PENDING; active: every state not ended).",
)
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
    from kit import api
    from kit.job import listing

    wanted = listing.Filter.checked(states, name, _age_seconds(since) if since else None, user)
    now = time.time()
    rows = [
        j.row for j in api.jobs(output_dirs=output_dirs, everything=everything or bool(since)) if wanted(j.row, now)
    ]
    from kit.job import settle

    settle.settle_rows(rows)  # the ends seen: kept, and what an ended job could not send handed on (--notify)
    if as_json:
        click.echo(json.dumps([r.as_json() for r in rows], indent=2))
        return 0
    if not rows:
        click.echo(
            "no jobs"
            + ("" if everything else " (active, or submitted in the last 24 hours); kit ps --all lists every job"),
            err=True,
        )
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
@OUTPUT_DIR_LOOKUP
def cancel(job, reason, output_dir):
    """Cancel JOB (an id or a job directory), recording who and why in its directory.

    The job ends CANCELLED and is never marked finished; an array job's every task is cancelled.
    """
    from kit import api
    from kit.jobdir import end_records

    job_dir, job_id = _job(job, output_dir)
    rec = api.Job(job_dir, job_id=job_id).cancel(reason)
    why = f" ({rec['reason']})" if rec["reason"] else ""
    click.echo(f"cancelled job {job_id}{why}; recorded in {job_dir / end_records.CANCEL_RECORD}")


@click.command()
@click.argument("job")
@click.option("--rank", type=int, default=None, help="Only this rank's own log.")
@click.option("--node", default=None, metavar="NAME", help="Only the ranks that ran on this node.")
@click.option("--restart", type=int, default=None, metavar="K", help="Run K (0 is the first) [default: the latest].")
@click.option("--sidecar", default=None, metavar="NAME", help="A sidecar's log (e.g. exporter) instead of the ranks'.")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing what is written, across requeues, until the job ends."
)
@click.option(
    "--errors", is_flag=True, help="Per run, the first rank that failed by itself: node, code, its last lines."
)
@OUTPUT_DIR_LOOKUP
def logs(job, rank, node, restart, sidecar, follow, errors, output_dir):
    """Show JOB's log (an id or a job directory): every rank's output, rank-prefixed."""
    from kit import api

    for value, field in ((sidecar, "--sidecar"), (node, "--node")):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", value):
            raise KitError(
                f"{value!r} is not a {field[2:]} name",
                field=field,
                hint="letters, digits, '.', '_' and '-' (as kit ps and the job directory show them)",
            )
    job_dir, _ = _job(job, output_dir)
    handle = api.Job(job_dir)
    if errors:
        told = handle.errors(None if restart is None else [restart])
        for line in told or ["no rank failed by itself" + (f" in run {restart}" if restart is not None else "")]:
            click.echo(line)
        return 0
    out = click.get_binary_stream("stdout")
    if follow:
        if rank is not None or node is not None or sidecar is not None or restart is not None:
            raise KitError(
                "-f follows the whole job's log (every run, every rank)",
                field="--follow",
                hint="leave out --rank/--node/--sidecar/--restart, or drop -f",
            )
        ended = handle.follow(
            lambda data: (out.write(data), out.flush()),
            on_outage=lambda message: click.echo(f"kit: {message}", err=True),
        )
        click.echo(f"kit: job {handle.id} ended {ended}", err=True)
        return 0
    handle.feed_logs(
        out.write,
        rank=rank,
        run=restart,
        node=node,
        sidecar=sidecar,
        say=lambda note: click.echo(f"kit: {note}", err=True),
    )
    out.flush()
    return 0


@click.command()
@click.argument("job")
@click.option(
    "--edit",
    "edits",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change a field first, as a job file writes it: --edit nodes=4 --edit time='\"1:00:00\"' (repeatable).",
)
@click.option("--wait", "wait_", is_flag=True, help="Block until the new job ends; exit with its exit code.")
@OUTPUT_DIR_LOOKUP
def rerun(job, edits, wait_, output_dir):
    """Submit JOB again: a new job with its resolved spec (job.json), in a new directory.

    The new job goes to the same Slurm and records which job it reruns (rerun_of.json;
    kit ps --json shows it). Only a job directory of your own is rerun.
    """
    from kit import api
    from kit.cli.launch import wait_and_report

    job_dir, _ = _job(job, output_dir)
    new = api.Job(job_dir).rerun(*edits)
    click.echo(f"Submitted job {new.id}")
    click.echo(f"job dir: {new.dir}")
    return wait_and_report(new.target, new.id, new.dir) if wait_ else 0


@click.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="The events as JSON: time (Unix seconds), kind, text, run.")
@OUTPUT_DIR_LOOKUP
def events(job, as_json, output_dir):
    """What happened to JOB (an id or a job directory), in order, across its runs.

    Its submission, each run's start, its tasks running, the first step, the preflight's verdict, the time
    limit's warning, a hang, how each run ended, a cancel and the end Slurm gave it: each from the record kit
    wrote as it happened. The first line gives the time; the others, seconds since.
    """
    from kit import api

    job_dir, job_id = _job(job, output_dir)
    got = api.Job(job_dir, job_id=job_id).events()
    from kit.job import settle

    settle.settle(job_dir)  # --notify: an ended job's untold events, handed on
    if as_json:
        click.echo(json.dumps([e.as_json() for e in got], indent=1))
        return
    for i, e in enumerate(got):
        click.echo(e.line() if i == 0 else e.line(since=got[0].time))
