"""`kit launch`: write a job directory and submit it with sbatch."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time
from pathlib import Path

import click

from kit import slurm
from kit import submission as lib
from kit.cli.help import GroupedCommand
from kit.core import jobfile, options
from kit.core import spec as specs
from kit.errors import KitError
from kit.job import handle, settle
from kit.remote import wire


def _click_options(command):
    """``command`` with a Click option for every entry of kit's option table (kit.core.options)."""
    for o in reversed(options.OPTIONS):
        if o.name == "command":
            continue
        names = [n for n in (o.short, o.label) if n]
        if o.kind == options.CHOICE:
            for flag, value, help in reversed(o.choices):
                command = click.option(flag, o.name, flag_value=value, default=None, help=help)(command)
            continue
        if o.kind == options.INT:
            decl = click.option(*names, o.name, type=int, default=None, help=o.help_text)
        elif o.kind == options.STR:
            kind = click.Path(dir_okay=False) if o.name == "job_file" else None
            decl = click.option(*names, o.name, type=kind, default=None, metavar=o.metavar or "TEXT", help=o.help_text)
        elif o.kind in (options.LIST, options.TABLE, options.SWEEP):
            decl = click.option(*names, o.name, multiple=True, metavar=o.metavar, help=o.help_text)
        elif o.kind == options.SWITCH:
            decl = click.option(f"{o.label}/--no-{o.label[2:]}", o.name, default=None, help=o.help_text)
        elif o.kind == options.OFF:
            decl = click.option(o.label, o.name, flag_value=False, default=None, help=o.help_text)
        else:  # FLAG: True when given; not given is None for a job's field (the job file may say)
            decl = click.option(*names, o.name, is_flag=True, default=None if o.spec else False, help=o.help_text)
        command = decl(command)
    return command


GROUPS = tuple(
    (
        title,
        purpose,
        tuple(o.name for o in options.OPTIONS if o.group == title and o.name != "command")
        + (("help",) if title == options.SUBMISSION else ()),
    )
    for title, purpose in options.GROUPS
)


def _given(values: dict) -> dict:
    """The job's fields as the command line gave them, handed over as given (a repeatable option's values a list;
    not given: left out), checked with a job file's values (kit.core.jobfile.coerce_value)."""
    given = {}
    for name in specs.FIELD_NAMES:
        value = values.get(name)
        if options.BY_NAME[name].kind in (options.LIST, options.TABLE, options.SWEEP):
            if value:
                given[name] = list(value)
        elif value is not None:
            given[name] = value
    return given


@click.command(cls=GroupedCommand, groups=GROUPS, context_settings={"allow_interspersed_args": False})
@_click_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def launch(job_file, where, dry_run, wait, as_json, parsable, **values):
    """Submit COMMAND as a multi-node job: kit launch [OPTIONS] -- COMMAND...

    Writes a job directory (prelaunch.sh, launcher.sh, job.json, sbatch.json),
    submits prelaunch.sh with sbatch and prints the job id and directory.

    \b
    Example:
      kit launch --nodes 2 --time 30 -- python -m kit.train --max-steps 100
    """
    return launched(_request(job_file, where, dry_run, wait, as_json, parsable, values))


def _request(job_file, where, dry_run, wait, as_json, parsable, values: dict) -> jobfile.Request:
    return jobfile.Request(_given(values), where, job_file, dry_run, wait, as_json, parsable)


def request_of(args: list[str]) -> jobfile.Request:
    """`kit --host LOGIN launch ARGS`: the command line read here, as `kit launch` reads it, into the one request
    that crosses (a usage error is this side's, before any connection)."""
    with launch.make_context("kit launch", list(args)) as ctx:
        p = dict(ctx.params)
    return _request(*(p.pop(k) for k in ("job_file", "where", "dry_run", "wait", "as_json", "parsable")), p)


def launched(request: jobfile.Request, received: lib.Rerun | None = None) -> int:
    """`kit launch`'s work once its command line is read (here, or the laptop's on a login node: ``received``,
    the code snapshot it sent, which the job runs): the job submitted, its id and directory printed (a record
    first for a laptop), and ``--wait``."""
    if request.parsable and (request.as_json or request.dry_run):
        raise KitError(
            "--parsable prints the submitted job's id: not with " + ("--json" if request.as_json else "--dry-run"),
            field="--parsable",
        )
    spec, origins = request.spec()
    plan, prepared = handle.submit_spec(
        spec,
        origins,
        where=request.where,
        dry_run=request.dry_run,
        rerun=received,
        say=lambda message: click.echo(f"kit: {message}", err=True),
    )
    if wire.serving():  # for a laptop (kit --host, kit.launch(host=)): the job in one record, before any line
        wire.write({"launched": prepared.as_json()})
    if request.dry_run:
        if request.as_json:
            click.echo(json.dumps(prepared.as_json()))
        else:
            click.echo(shlex.join(prepared.sbatch_argv))
            click.echo(shlex.join(prepared.srun_argv))
            click.echo(f"job dir: {prepared.job_dir}")
        return 0
    if request.as_json:
        click.echo(json.dumps(prepared.as_json()))
    elif request.parsable:
        click.echo(prepared.job_id)
    else:
        click.echo(f"Submitted job {prepared.job_id}")
        click.echo(f"job dir: {prepared.job_dir}")
    if not request.wait:
        return 0
    if prepared.job.tasks is not None:
        return wait_and_report_tasks(plan.target, prepared.job_id, prepared.job_dir)
    return wait_and_report(plan.target, prepared.job_id, prepared.job_dir)


def wait_and_report(target: slurm.Target, job_id: str, job_dir) -> int:
    """--wait: follow the job to its end; exit with kit's code for that end.

    On a terminal one live progress line (state, run, step, loss, samples/s,
    elapsed); otherwise a line per state change and a progress line a minute.
    Ctrl-C stops waiting and leaves the job running.
    """
    from kit.job import logs as joblogs
    from kit.jobdir import events as jobevents
    from kit.jobdir import goodput, slow_ranks, tally, trained
    from kit.jobdir.sidecars import sidecar_ends, sidecar_text

    live = sys.stderr.isatty()
    if live and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started from a shell that ran it in the background (which ignores SIGINT for
        # its children, and Python then installs no handler): a user at this terminal
        # still stops waiting with Ctrl-C.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    seen = {"line": "", "printed": 0.0, "restarts": 0, "sidecars": 0, "requeue": False}

    def say(msg: str) -> None:
        if live and seen["line"]:
            click.echo("\r\x1b[K", nl=False, err=True)
            seen["line"] = ""
        click.echo(f"kit: job {job_id}: {msg}", err=True)

    def progress(st: slurm.JobStatus) -> None:
        tell_requeue(st)  # the ending run's reason, as soon as it is written
        for ended in sidecar_ends(job_dir)[seen["sidecars"] :]:  # a sidecar that died: said as it is seen
            seen["sidecars"] += 1
            say(sidecar_text(ended))
        p = trained.training_progress(job_dir)
        now = time.monotonic()
        parts = [st.state, f"run {st.restarts}", *trained.progress_words(p)]
        parts += [f"straggler rank {s.rank} on {s.node} ({s.factor:.2f}x)" for s in slow_ranks.read(job_dir)]
        parts.append(f"{int(now - t0)} s")
        line = ", ".join(parts)
        if live:
            click.echo(f"\r\x1b[Kkit: job {job_id}: {line}", nl=False, err=True)
            seen["line"] = line
        elif p.step is not None and now - seen["printed"] >= 60:
            click.echo(f"kit: job {job_id}: {line}", err=True)
            seen["printed"] = now

    def tell_requeue(st: slurm.JobStatus) -> None:
        if st.restarts > seen["restarts"]:  # Slurm requeued it: said now, not when the next run starts
            seen["restarts"] = st.restarts
            seen["requeue"] = True
        if seen["requeue"] and (line := jobevents.requeue_line(job_dir, st.restarts, st.state)):
            seen["requeue"] = False
            say(line)

    def on_state(st: slurm.JobStatus) -> None:
        tell_requeue(st)
        say(st.shown())

    try:
        result = handle.Job(job_dir, job_id=job_id, target=target).wait(
            poll=0.5, on_state=on_state, on_outage=say, on_poll=progress
        )
    except KeyboardInterrupt:
        where = shlex.quote(str(job_dir))  # the directory, not the id: it works whatever --output-dir was
        say(f"stopped waiting; the job goes on. Follow it: kit logs -f {where}; cancel it: kit cancel {where}")
        return 130
    if live and seen["line"]:
        click.echo("\r\x1b[K", nl=False, err=True)
    click.echo(f"kit: job {job_id} {result.describe()}", err=True)
    for line in joblogs.run_ends(Path(job_dir)):  # each run that did not finish it: who, and what followed
        click.echo(f"kit: job {job_id}: {line}", err=True)
    spent = goodput.goodput(job_dir, running=False)
    if spent is not None:
        click.echo(f"kit: job {job_id}: {spent.line()}", err=True)
        click.echo(f"kit: job {job_id}: {tally.tally(job_dir, spent=spent).words()}", err=True)
    for slow in slow_ranks.read(job_dir):
        click.echo(f"kit: job {job_id}: {slow.line()}", err=True)
    return result.exit_code


def wait_and_report_tasks(target: slurm.Target, job_id: str, job_dir) -> int:
    """--wait on an array job: every task to its end, one line per task; the
    exit code is 0 when every task finished, else the lowest-index failing task's."""
    from kit.jobdir import JobDir, records

    indices = records.task_indices(Path(job_dir))
    names = {
        i: " ".join(f"{k}={shlex.quote(str(v))}" for k, v in records.params(JobDir(job_dir).task(i).path).items())
        for i in indices
    }

    def say(msg: str) -> None:
        click.echo(f"kit: job {job_id}: {msg}", err=True)

    ends = slurm.wait_array(
        target, job_id, indices, poll=0.5, on_outage=say, on_state=lambda i, st: say(f"task {i}: {st.shown()}")
    )
    codes = []
    for i in indices:
        result = settle.observe(ends[i], JobDir(job_dir).task(i).path)
        codes.append(result.exit_code)
        label = f" ({names[i]})" if names[i] else ""
        click.echo(f"kit: job {job_id}_{i}{label} {result.describe()}", err=True)
    finished = sum(1 for c in codes if c == 0)
    say(f"{finished} of {len(codes)} task(s) finished")
    return next((c for c in codes if c != 0), 0)
