"""Slurm commands kit composes and runs: sbatch's and srun's options for a job, the checks
made against the cluster before submitting (partition, sizes, KillWait, MPI, --after), and
submitting and cancelling."""

from __future__ import annotations

import os
import re
from pathlib import Path

from kit.core.spec import ResolvedJob
from kit.errors import KitError
from kit.jobdir import JobDir, end_records
from kit.slurm import pyxis
from kit.slurm.status import job_status
from kit.slurm.target import TERMINAL_STATES, Target


def _escape_filename_pattern(path: str) -> str:
    # sbatch expands %j, %x, ... in --output; a literal % is written %%.
    return path.replace("%", "%%")


def sbatch_argv(job: ResolvedJob, job_dir: Path, chdir: str | Path | None = None) -> list[str]:
    """The exact sbatch command line for a prepared job directory (started in ``chdir``)."""
    s = job.spec
    opts: dict[str, str | None] = {
        "--job-name": s.job_name,
        "--nodes": str(s.nodes + s.spare_nodes),  # the step runs on --nodes of them (srun_args)
        "--ntasks-per-node": str(s.ntasks_per_node),
        "--output": _escape_filename_pattern(str(JobDir(job_dir).logs)) + "/" + JobDir.BATCH_LOG.format(job_id="%j"),
        "--open-mode": "append",
    }
    if job.tasks is not None:
        # Each array task's batch log goes to its own task directory.
        opts["--array"] = job.tasks.render()
        opts["--output"] = (
            _escape_filename_pattern(str(job_dir / JobDir.TASKS)) + f"/%a/{JobDir.LOGS}/" + JobDir.ARRAY_BATCH_LOG
        )
    if chdir is not None:
        opts["--chdir"] = str(chdir)
    if s.gpus_per_node:
        opts["--gpus-per-node"] = str(s.gpus_per_node)
    for name in ("cpus_per_task", "mem", "time", "partition", "account"):
        value = getattr(s, name)
        if value is not None:
            opts["--" + name.replace("_", "-")] = str(value)
    if job.time_seconds is not None or s.max_restarts:
        opts["--signal"] = f"B:{s.signal}@{s.signal_lead}"
    if job.after:
        # Slurm's --dependency: a comma means all of them; a dependency that can
        # never be met cancels the job (it never pends forever).
        opts["--dependency"] = ",".join(
            f"after{kind}:{job_id}" for job_id, _, kind in (a.partition(":") for a in job.after)
        )
        opts["--kill-on-invalid-dep"] = "yes"
    argv = ["sbatch", "--parsable"]
    argv += [f"{k}={v}" for k, v in sorted(opts.items())]
    argv.append("--requeue" if s.max_restarts else "--no-requeue")
    argv += list(s.sbatch_args)
    # Slurm runs a copy of the batch script: the job directory, where its values and parts are, is its argument.
    argv += [str(job_dir / JobDir.PRELAUNCH), str(job_dir)]
    return argv


def srun_args(job: ResolvedJob, container_flags: list[str] = ()) -> list[str]:
    """The options of the one srun step prelaunch.sh runs, container flags included."""
    s = job.spec
    args = [
        "--kill-on-bad-exit=1",
        # The step carries prelaunch's environment whatever the site sets
        # (SBATCH_EXPORT=NONE leaves SLURM_EXPORT_ENV=NONE in the job).
        "--export=ALL",
        f"--wait={s.step_wait}",
        f"--mpi={s.mpi}",
        "--label",
        f"--nodes={s.nodes}",
        f"--ntasks-per-node={s.ntasks_per_node}",
        # Not the allocation's SLURM_NTASKS: with --spare-nodes it counts the spares' tasks too.
        f"--ntasks={s.nodes * s.ntasks_per_node}",
    ]
    if s.cpus_per_task is not None:
        # Slurm 22.05's srun no longer inherits --cpus-per-task from sbatch.
        args.append(f"--cpus-per-task={s.cpus_per_task}")
    if s.gpus_per_node:
        args.append(f"--gpus-per-node={s.gpus_per_node}")
    return args + list(container_flags)


def partitions(target: Target) -> list[str]:
    where = (
        "For kit's local cluster run: kit cluster up"
        if os.geteuid() == 0
        else "Its configuration: SLURM_CONF (your site's admins know where it is)"
    )
    out = target.run(["sinfo", "--noheader", "--format=%R"], what="slurm", hint=f"is Slurm reachable? {where}").stdout
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def check_partition(target: Target, partition: str, label: str) -> None:
    known = partitions(target)
    if partition not in known:
        raise KitError(
            f"unknown partition {partition!r}", field=label, hint="partitions here: " + (", ".join(known) or "(none)")
        )


_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def check_fits(
    target: Target,
    partition: str | None,
    nodes: int,
    cpus_per_node: int,
    mem: str | None,
    labels: tuple[str, ...],
    note=lambda msg: None,
    gpus_per_node: int = 0,
) -> None:
    """The request can ever run: the partition (the job's, else the default one) has
    ``nodes`` nodes with ``gpus_per_node`` GPUs, ``cpus_per_node`` CPUs and ``mem`` (sbatch's
    --mem) each. Slurm would queue an impossible request and leave it pending for good, or
    refuse it. Nodes Slurm holds back (drained, down) count, with a note: they may come back.
    ``labels``: the fields of nodes, CPUs, memory and GPUs."""
    out = target.run(
        ["sinfo", "--noheader", "--Node", "--format=%N|%c|%m|%G|%t|%P|%E"], what="sinfo", check=False
    ).stdout
    found: dict[str, tuple[int, int, str, str, int]] = {}
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|", 6)]
        if len(fields) < 7 or not fields[1].isdigit():
            continue
        name, count, memory, gres, state, part, reason = fields
        if part.endswith("*") if partition is None else part.rstrip("*") == partition:
            found[name] = (int(count), int(memory) if memory.isdigit() else 0, state, reason, gpu_count(gres))
    if not found:
        return  # sinfo said nothing usable: sbatch will tell
    where = f"partition {partition}" if partition else "the default partition"
    if nodes > len(found):
        raise KitError(
            f"{where} has {len(found)} node(s); {nodes} asked for would wait forever",
            field=labels[0],
            hint=f"ask for at most {len(found)}",
        )
    fitting = list(found)
    if gpus_per_node:
        fitting = [n for n in fitting if found[n][4] >= gpus_per_node]
        if len(fitting) < nodes:
            raise KitError(
                f"{nodes} node(s) with {gpus_per_node} GPUs each: {where} has {len(fitting)} such node(s) "
                f"(its largest has {max(f[4] for f in found.values())} GPUs); Slurm would refuse the job",
                field=labels[3] if len(labels) > 3 else "--gpus-per-node",
                hint="ask for fewer GPUs per node, or another --partition",
            )
    fitting = [n for n in fitting if found[n][0] >= cpus_per_node]
    if len(fitting) < nodes:
        raise KitError(
            f"{nodes} node(s) with {cpus_per_node} CPUs each: {where} has "
            f"{len(fitting)} such node(s) (its largest has {max(f[0] for f in found.values())} CPUs); "
            "the job would wait forever",
            field=labels[1],
            hint="ask for fewer CPUs per task or fewer tasks per node",
        )
    if mem:
        need_mb = int(mem[:-1]) * _MEM_UNITS[mem[-1]] if mem[-1] in _MEM_UNITS else int(mem)
        fitting = [n for n in fitting if found[n][1] >= need_mb]
        if len(fitting) < nodes:
            largest = max(f[1] for f in found.values())
            raise KitError(
                f"{nodes} node(s) with {mem} of memory each: {where} has {len(fitting)} such node(s) "
                f"(its largest has {largest} MB for jobs); the job would wait forever",
                field=labels[2],
                hint=f"ask for at most --mem {largest}M",
            )
    held = sorted(n for n in fitting if any(w in found[n][2] for w in ("drain", "drng", "down", "fail")))
    if len(fitting) - len(held) < nodes:
        which = ", ".join(f"{n} ({found[n][2]}: {found[n][3] or 'no reason given'})" for n in held)
        note(
            f"{which}: Slurm holds back {'this node' if len(held) == 1 else 'these nodes'}; the job waits until "
            "enough are back (kit cluster up resumes the local cluster's)"
        )


def gpu_count(gres: str) -> int:
    """The GPUs in sinfo's %G: ``gpu:2``, ``gpu:a100:8(S:0-1)``, several entries comma-separated;
    0 for ``(null)``."""
    return sum(int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres))


def slurm_config(target: Target) -> str:
    """``scontrol show config``'s text ("" when it does not answer)."""
    return target.run(["scontrol", "show", "config"], what="scontrol", check=False).stdout


def kill_wait(target: Target, config: str | None = None) -> int | None:
    """Slurm's KillWait (seconds between a job's TERM and its KILL), or None if unknown; ``config``:
    :func:`slurm_config`'s text, when the caller has it."""
    m = re.search(r"^KillWait\s*=\s*(\d+)", slurm_config(target) if config is None else config, re.M)
    return int(m.group(1)) if m else None


def pyxis_settings(target: Target, config: str | None = None) -> dict[str, str] | None:
    """The settings of the cluster's pyxis (its plugstack.conf line: PlugStackConfig, else the one beside
    slurm.conf); None where that file cannot be read here. ``config`` as for :func:`kill_wait`."""
    text = slurm_config(target) if config is None else config
    m = re.search(r"^PlugStackConfig\s*=\s*(/\S+)", text, re.M)
    conf = re.search(r"^SLURM_CONF\s*=\s*(/\S+)", text, re.M)
    path = m.group(1) if m else (str(Path(conf.group(1)).parent / "plugstack.conf") if conf else None)
    return pyxis.plugstack_settings(Path(path)) if path else None


def check_stop_grace(target: Target, grace: int, label: str, config: str | None = None) -> None:
    """kit's grace between a stop's TERM and its KILL must end before Slurm's own KILL."""
    wait = kill_wait(target, config)
    if wait is not None and grace >= wait:
        raise KitError(
            f"a grace of {grace} s would be cut short: Slurm kills a job's processes {wait} s "
            "(KillWait) after it signals them",
            field=label,
            hint=f"use a --stop-grace below {wait}",
        )


def mpi_types(target: Target) -> list[str]:
    """The MPI plugin types the target's srun offers (``srun --mpi=list``)."""
    proc = target.run(["srun", "--mpi=list"], what="srun --mpi=list", check=False)
    text = proc.stdout + proc.stderr
    types = [line.strip() for line in text.splitlines() if line.startswith(("\t", " ")) and line.strip()]
    return [t for t in types if re.fullmatch(r"[A-Za-z0-9_]+", t)]


def check_mpi(target: Target, mpi: str, label: str) -> None:
    known = mpi_types(target)
    if mpi not in known:
        raise KitError(
            f"unknown MPI type {mpi!r}",
            field=label,
            hint="this cluster's srun offers: " + (", ".join(known) or "(none listed)"),
        )


def cancel(target: Target, job_id: str) -> None:
    """scancel the job (every task of an array job)."""
    target.run(["scancel", job_id], what="scancel", timeout=60)


def submit(target: Target, argv: list[str], cwd: str | None = None) -> str:
    proc = target.run(argv, what="sbatch", cwd=cwd, timeout=120)
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise KitError(f"sbatch printed no job id: {proc.stdout.strip()!r}", exit_code=1)
    return job_id


def check_after(target: Target, deps: list, label: str, note=lambda msg: None) -> list:
    """Each (job id, kind, job dir) dependency must be able to be met: the job is
    known to Slurm and has not already ended the wrong way. A job Slurm has
    forgotten counts only through its kit job directory's FINISHED marker."""
    kept = []
    for job_id, kind, job_dir in deps:
        st = job_status(target, job_id)
        if st.state == "GONE":
            finished = job_dir is not None and end_records.finished(job_dir)
            if finished and kind in ("ok", "any"):
                note(f"job {job_id} finished and Slurm no longer lists it: that dependency is met")
                continue
            raise KitError(
                f"job {job_id} is unknown to Slurm",
                field=label,
                hint="give a job that is pending, running or recently ended (or its kit job directory)",
            )
        ended = st.state in TERMINAL_STATES
        if ended and kind == "ok" and st.state != "COMPLETED":
            raise KitError(
                f"job {job_id} already ended {st.state}: a job after it succeeded would never run",
                field=label,
                hint=f"use --after {job_id}:any to run after it however it ended",
            )
        if ended and kind == "notok" and st.state == "COMPLETED":
            raise KitError(f"job {job_id} already succeeded: a job after it failed would never run", field=label)
        kept.append((job_id, kind, job_dir))
    return kept
