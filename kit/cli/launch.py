"""`kit launch`: write a job directory and submit it with sbatch."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time

import click

from kit import launch as lib
from kit import slurm, targets
from kit.core import spec as specs
from kit.core import sweep as sweep_lib
from kit.cli.help import GroupedCommand
from kit.errors import KitError

# `kit launch --help`, by topic; the README's option table follows the same order.
GROUPS = (
    ("Resources", "What the job holds on the cluster.",
     ("nodes", "gpus_per_node", "ntasks_per_node", "cpus_per_task", "mem", "time", "partition", "account")),
    ("Command and environment", "What runs in every task, and with which variables.",
     ("job_file", "job_name", "env_items", "debug", "sidecars", "output_dir")),
    ("Sweeps, arrays and chains", "Many tasks from one command; jobs that wait for others.",
     ("array", "sweeps", "after")),
    ("Container", "Every task in a container image, through pyxis and enroot.",
     ("image", "mounts", "container_workdir", "container_env", "container_name", "container_writable",
      "container_mount_home", "container_remap_root", "mount_check")),
    ("Metrics", "The Prometheus exporter beside the training on each node.",
     ("exporter", "exporter_ports", "prometheus_targets")),
    ("Preemption and recovery", "The time limit's warning, requeues, hangs and how long a stop may take.",
     ("signal", "signal_lead", "max_restarts", "hang_timeout", "first_progress_timeout", "stop_grace",
      "step_wait", "heartbeat")),
    ("Networking", "The rendezvous address and port, and MPI.",
     ("port_range", "master_interface", "mpi")),
    ("Submission", "Where the job goes, and what kit launch prints or waits for.",
     ("where", "sbatch_args", "dry_run", "wait_", "as_json", "parsable", "help")),
)


def _int(name: str, help: str):
    return click.option(name, type=int, default=None, help=help)


def _str(name: str, help: str, metavar: str = "TEXT"):
    return click.option(name, default=None, metavar=metavar, help=help)


@click.command(cls=GroupedCommand, groups=GROUPS, context_settings={"allow_interspersed_args": False})
@click.option("-f", "--job-file", type=click.Path(dir_okay=False), default=None,
              help="TOML job file; options given here override its values.")
@_int("--nodes", "Number of nodes [default: 1].")
@_int("--gpus-per-node", "GPUs per node [default: 0].")
@_int("--ntasks-per-node", "Tasks (ranks) per node [default: GPUs per node, at least 1].")
@_int("--cpus-per-task", "CPUs per task.")
@_str("--mem", "Memory per node, e.g. 64G (Slurm --mem).", "SIZE")
@_str("--time", "Time limit: minutes, HH:MM:SS or D-HH:MM:SS.", "LIMIT")
@_str("--partition", "Slurm partition.", "NAME")
@_str("--account", "Slurm account.", "NAME")
@_str("--job-name", "Job name [default: kit].", "NAME")
@_str("--output-dir", "Where job directories go [default: ./kit-jobs].", "DIR")
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE",
              help="A variable for every task (repeatable).")
@click.option("--debug/--no-debug", default=None,
              help="set -x, NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=INFO, CUDA_LAUNCH_BLOCKING=1 (--env beats each).")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="OPTION",
              help="Pass an option to sbatch as is, e.g. --sbatch-arg=--constraint=a100 (repeatable).")
@click.option("--sidecar", "sidecars", multiple=True, metavar="COMMAND",
              help="A bash command local rank 0 runs beside the training on each node (repeatable).")
@_str("--signal", "Warning signal sent before the time limit [default: USR1].", "SIG")
@_int("--signal-lead", "Seconds before the time limit to send it [default: 90].")
@_int("--max-restarts", "How often the job may requeue itself after the warning [default: 3].")
@_int("--heartbeat", "Seconds between heartbeat lines in the batch log; 0: none [default: 60].")
@_str("--port-range", "Where MASTER_PORT is looked for [default: 29500-30499].", "LOW-HIGH")
@_str("--master-interface", "Take MASTER_ADDR from this network interface.", "IFACE")
@_int("--hang-timeout", "Stop and requeue the run when a rank reports no progress for this many seconds; "
     "0: off [default: 900].")
@_int("--first-progress-timeout", "The same before a rank's first progress in a run [default: 3600].")
@_int("--stop-grace", "Seconds a command may take to exit after a stop signal before it is killed [default: 3].")
@_int("--step-wait", "Seconds the other ranks may run on after one exits (srun --wait) [default: 60].")
@_str("--array", "Run the job as a Slurm array of tasks, each its own unit of work (own directory, "
     "requeue and port): 0-9, 1,3,5, 0-99%8 (at most 8 at once); with --sweep, %K alone.", "SPEC")
@click.option("--sweep", "sweeps", multiple=True, metavar="NAME=V1,V2,...",
              help="A parameter swept over: one array task per combination of all --sweep values; "
                   "{NAME} in the command and $KIT_SWEEP_NAME give each task its value (repeatable).")
@click.option("--after", "after", multiple=True, metavar="JOB[:ok|any|notok]",
              help="Start only after JOB (a job id or a kit job directory) succeeded (ok, the default), ended "
                   "however (any) or failed (notok); checked before submitting (repeatable).")
@_str("--mpi", "Slurm's MPI plugin for the step (srun --mpi), checked against the cluster's "
     "`srun --mpi=list` [default: none].", "TYPE")
@_str("--image", "Run every task in this container image: a .sqsh path or docker://... (pyxis).", "IMAGE")
@click.option("--mount", "mounts", multiple=True, metavar="SRC:DST[:FLAGS]",
              help="Bind SRC (absolute, on the nodes) at DST in the container; flags like ro, joined with + (repeatable).")
@_str("--container-workdir", "Working directory in the container [default: the image's].", "PATH")
@click.option("--container-env", "container_env", multiple=True, metavar="NAME[,NAME...]",
              help="More variables whose job values win over the image's (kit's own are always listed).")
@_str("--container-name", "Name under which pyxis keeps the container on the node.", "NAME")
@click.option("--container-writable", is_flag=True, default=None, help="Writable root filesystem in the container.")
@click.option("--container-mount-home/--no-container-mount-home", default=None,
              help="Bind the home directory into the container [default: no].")
@click.option("--container-remap-root", is_flag=True, default=None, help="Be root inside the container (pyxis).")
@click.option("--no-mount-check", "mount_check", flag_value=False, default=None,
              help="Do not check that mount sources exist on this host (node-local paths).")
@click.option("--no-exporter", "exporter", flag_value=False, default=None,
              help="No Prometheus exporter sidecar on the nodes.")
@_str("--exporter-ports", "Ports the exporter may take, first free one [default: 9400-9499].", "LOW-HIGH")
@_str("--prometheus-targets", "Directory Prometheus watches (file_sd) [default: the local cluster's, when it "
      "runs Prometheus].", "DIR")
@click.option("--local", "where", flag_value="local", default=None,
              help="Submit to kit's local cluster (the default when no site Slurm is configured).")
@click.option("--site", "where", flag_value="site", help="Submit to the site's Slurm.")
@click.option("--dry-run", is_flag=True, help="Write the job directory and print the sbatch line; submit nothing.")
@click.option("--wait", "wait_", is_flag=True, help="Block until the job ends; exit with its exit code.")
@click.option("--json", "as_json", is_flag=True, help="Print {job_id, job_dir, sbatch_argv} as JSON.")
@click.option("--parsable", is_flag=True, help="Print only the job id, as sbatch --parsable does (for scripts).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def launch(job_file, env_items, sbatch_args, sidecars, mounts, container_env, sweeps, after, where, dry_run,
           wait_, as_json, parsable, command, **fields):
    """Submit COMMAND as a multi-node job: kit launch [OPTIONS] -- COMMAND...

    Writes a job directory (prelaunch.sh, launcher.sh, job.json, sbatch.json),
    submits prelaunch.sh with sbatch and prints the job id and directory.

    \b
    Example:
      kit launch --nodes 2 --time 30 -- python -m kit.train --max-steps 100
    """
    if parsable and (as_json or dry_run):
        raise KitError("--parsable prints the submitted job's id: not with " + ("--json" if as_json else "--dry-run"),
                       field="--parsable")
    base, origins = (specs.load_job_file(job_file) if job_file else (specs.JobSpec(), specs.Origins()))
    given = specs.JobSpec(**{k.replace("-", "_"): v for k, v in fields.items()})
    if env_items:
        env = {}
        for item in env_items:
            try:
                key, value = specs.parse_env_item(item)
            except specs.KitError as e:
                raise e.with_field("--env") from None
            env[key] = value
        given.env = env
    if sbatch_args:
        given.sbatch_args = list(sbatch_args)
    if sidecars:
        given.sidecars = list(sidecars)
    if after:
        given.after = list(after)
    if sweeps:
        given.sweep = dict(sweep_lib.parse_sweep_item(item, "--sweep") for item in sweeps)
    if mounts:
        given.mounts = list(mounts)
    if container_env:
        given.container_env = [n for item in container_env for n in item.split(",") if n]
    if command:
        given.command = list(command)
    spec, origins = specs.merge(base, given, origins)
    plan = targets.plan(spec, origins, where=where, dry_run=dry_run)
    for message in plan.messages:
        click.echo(f"kit: {message}", err=True)
    prepared = lib.prepare(plan.job)
    if dry_run:
        if as_json:
            click.echo(json.dumps(prepared.as_json()))
        else:
            click.echo(shlex.join(prepared.sbatch_argv))
            click.echo(shlex.join(prepared.srun_argv))
            click.echo(f"job dir: {prepared.job_dir}")
        return 0
    lib.submit(prepared, plan.target)
    if as_json:
        click.echo(json.dumps(prepared.as_json()))
    elif parsable:
        click.echo(prepared.job_id)
    else:
        click.echo(f"Submitted job {prepared.job_id}")
        click.echo(f"job dir: {prepared.job_dir}")
    if not wait_:
        return 0
    if prepared.job.tasks is not None:
        return wait_and_report_tasks(plan.target, prepared)
    return wait_and_report(plan.target, prepared.job_id, prepared.job_dir)


def wait_and_report(target: slurm.Target, job_id: str, job_dir) -> int:
    """--wait: follow the job to its end; exit with kit's code for that end.

    On a terminal one live progress line (state, run, step, loss, samples/s,
    elapsed); otherwise a line per state change and a progress line a minute.
    Ctrl-C stops waiting and leaves the job running.
    """
    from kit.jobdir import records

    live = sys.stderr.isatty()
    if live and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started from a shell that ran it in the background (which ignores SIGINT for
        # its children, and Python then installs no handler): a user at this terminal
        # still stops waiting with Ctrl-C.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    seen = {"line": "", "printed": 0.0}

    def say(msg: str) -> None:
        if live and seen["line"]:
            click.echo("\r\x1b[K", nl=False, err=True)
            seen["line"] = ""
        click.echo(f"kit: job {job_id}: {msg}", err=True)

    def progress(st: slurm.JobStatus) -> None:
        p = records.training_progress(job_dir)
        now = time.monotonic()
        parts = [st.state, f"run {st.restarts}", *records.progress_words(p)]
        parts.append(f"{int(now - t0)} s")
        line = ", ".join(parts)
        if live:
            click.echo(f"\r\x1b[Kkit: job {job_id}: {line}", nl=False, err=True)
            seen["line"] = line
        elif p.step is not None and now - seen["printed"] >= 60:
            click.echo(f"kit: job {job_id}: {line}", err=True)
            seen["printed"] = now

    try:
        end = slurm.wait(target, job_id, poll=0.5, on_state=lambda st: say(st.state), on_outage=say,
                         on_poll=progress)
    except KeyboardInterrupt:
        where = shlex.quote(str(job_dir))  # the directory, not the id: it works whatever --output-dir was
        say(f"stopped waiting; the job goes on. Follow it: kit logs -f {where}; cancel it: kit cancel {where}")
        return 130
    if live and seen["line"]:
        click.echo("\r\x1b[K", nl=False, err=True)
    if end.state != "GONE":
        records.keep_outcome(job_dir, end.state)
    result = slurm.job_outcome(end, job_dir, records.work_finished(job_dir))
    click.echo(f"kit: job {job_id} {result.describe()}", err=True)
    return result.exit_code


def wait_and_report_tasks(target: slurm.Target, prepared: lib.PreparedJob) -> int:
    """--wait on an array job: every task to its end, one line per task; the
    exit code is 0 when every task finished, else the lowest-index failing task's."""
    from kit.jobdir import JobDir, records

    job_id, job = prepared.job_id, prepared.job
    params = job.params or ({},) * len(job.tasks.indices)
    names = {i: " ".join(f"{k}={shlex.quote(v)}" for k, v in p.items()) for i, p in zip(job.tasks.indices, params)}

    def say(msg: str) -> None:
        click.echo(f"kit: job {job_id}: {msg}", err=True)

    ends = slurm.wait_array(target, job_id, job.tasks.indices, poll=0.5, on_outage=say,
                            on_state=lambda i, st: say(f"task {i}: {st.state}"))
    codes = []
    for i in job.tasks.indices:
        task = JobDir(prepared.job_dir).task(i).path
        if ends[i].state != "GONE":
            records.keep_outcome(task, ends[i].state)
        result = slurm.job_outcome(ends[i], task, records.work_finished(task))
        codes.append(result.exit_code)
        label = f" ({names[i]})" if names[i] else ""
        click.echo(f"kit: job {job_id}_{i}{label} {result.describe()}", err=True)
    finished = sum(1 for c in codes if c == 0)
    say(f"{finished} of {len(codes)} task(s) finished")
    return next((c for c in codes if c != 0), 0)
