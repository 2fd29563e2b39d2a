"""Everything kit knows about Slurm: option composition, submission, job state.

:class:`Target` names which Slurm to talk to (the site's, or kit's local
cluster through its ``SLURM_CONF``); every Slurm command goes through
:func:`kit.runner.run` with that target's environment.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from kit.core import outcome
from kit.core import sweep as sweep_lib
from kit.core.spec import ResolvedJob
from kit.errors import KitError
from kit.jobdir import JobDir, records
from kit.runner import run

# Slurm's per-task variables -> the names torch.distributed, torchrun-style
# scripts and Lightning read. The launcher exports each one from its source.
RANK_MAPPING: tuple[tuple[str, str], ...] = (
    ("RANK", "SLURM_PROCID"),
    ("LOCAL_RANK", "SLURM_LOCALID"),
    ("WORLD_SIZE", "SLURM_NTASKS"),
    ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"),
    ("NODE_RANK", "SLURM_NODEID"),
    ("GROUP_RANK", "SLURM_NODEID"),
)

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE",
})


@dataclass(frozen=True)
class Target:
    """Which Slurm to use: ``conf`` is a slurm.conf path (None: the site default)."""

    conf: str | None = None
    name: str = "site"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.conf} if self.conf else {}

    def run(self, argv: list[str], **kw):
        return run(argv, env=self.env, **kw)


def _escape_filename_pattern(path: str) -> str:
    # sbatch expands %j, %x, ... in --output; a literal % is written %%.
    return path.replace("%", "%%")


def sbatch_argv(job: ResolvedJob, job_dir: Path) -> list[str]:
    """The exact sbatch command line for a prepared job directory."""
    s = job.spec
    opts: dict[str, str | None] = {
        "--job-name": s.job_name,
        "--nodes": str(s.nodes),
        "--ntasks-per-node": str(s.ntasks_per_node),
        "--output": _escape_filename_pattern(str(JobDir(job_dir).logs)) + "/" + JobDir.BATCH_LOG.format(job_id="%j"),
        "--open-mode": "append",
    }
    if job.tasks is not None:
        # Each array task's batch log goes to its own task directory.
        opts["--array"] = job.tasks.render()
        opts["--output"] = (_escape_filename_pattern(str(job_dir / JobDir.TASKS)) + f"/%a/{JobDir.LOGS}/"
                            + JobDir.ARRAY_BATCH_LOG)
    if s.gpus_per_node:
        opts["--gpus-per-node"] = str(s.gpus_per_node)
    for name in ("cpus_per_task", "mem", "time", "partition", "account"):
        value = getattr(s, name)
        if value is not None:
            opts["--" + name.replace("_", "-")] = str(value)
    if job.time_seconds is not None or s.max_restarts:
        opts["--signal"] = f"B:{s.signal}@{s.signal_lead}"
    if s.after:
        # Slurm's --dependency: a comma means all of them; a dependency that can
        # never be met cancels the job (it never pends forever).
        opts["--dependency"] = ",".join(f"after{kind}:{job_id}" for job_id, _, kind in
                                        (a.partition(":") for a in s.after))
        opts["--kill-on-invalid-dep"] = "yes"
    argv = ["sbatch", "--parsable"]
    argv += [f"{k}={v}" for k, v in sorted(opts.items())]
    argv.append("--requeue" if s.max_restarts else "--no-requeue")
    argv += list(s.sbatch_args)
    argv.append(str(job_dir / JobDir.PRELAUNCH))
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
    ]
    if s.cpus_per_task is not None:
        # Slurm 22.05's srun no longer inherits --cpus-per-task from sbatch.
        args.append(f"--cpus-per-task={s.cpus_per_task}")
    if s.gpus_per_node:
        args.append(f"--gpus-per-node={s.gpus_per_node}")
    return args + list(container_flags)


def rank_exports() -> str:
    return "\n".join(
        f'export {name}="${{{source}:?is not set: launcher.sh runs as a task of an srun step}}"'
        for name, source in RANK_MAPPING)


def partitions(target: Target) -> list[str]:
    out = target.run(["sinfo", "--noheader", "--format=%R"], what="slurm",
                     hint="is Slurm reachable? For kit's local cluster run: kit cluster up").stdout
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def check_partition(target: Target, partition: str, label: str) -> None:
    known = partitions(target)
    if partition not in known:
        raise KitError(f"unknown partition {partition!r}", field=label,
                       hint="partitions here: " + (", ".join(known) or "(none)"))


_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def check_fits(target: Target, partition: str | None, nodes: int, cpus_per_node: int, mem: str | None,
               labels: tuple[str, str, str], note=lambda msg: None) -> None:
    """The request can ever run: the partition (the job's, else the default one) has
    ``nodes`` nodes with ``cpus_per_node`` CPUs and ``mem`` (sbatch's --mem) each. Slurm
    would queue an impossible request and leave it pending for good. Nodes Slurm holds
    back (drained, down) count, with a note: they may come back."""
    out = target.run(["sinfo", "--noheader", "--Node", "--format=%N|%c|%m|%t|%P|%E"], what="sinfo",
                     check=False).stdout
    found: dict[str, tuple[int, int, str, str]] = {}
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|", 5)]
        if len(fields) < 6 or not fields[1].isdigit():
            continue
        name, count, memory, state, part, reason = fields
        if part.endswith("*") if partition is None else part.rstrip("*") == partition:
            found[name] = (int(count), int(memory) if memory.isdigit() else 0, state, reason)
    if not found:
        return  # sinfo said nothing usable: sbatch will tell
    where = f"partition {partition}" if partition else "the default partition"
    if nodes > len(found):
        raise KitError(f"{where} has {len(found)} node(s); {nodes} asked for would wait forever", field=labels[0],
                       hint=f"ask for at most {len(found)}")
    fitting = [n for n, (c, _, _, _) in found.items() if c >= cpus_per_node]
    if len(fitting) < nodes:
        raise KitError(f"{nodes} node(s) with {cpus_per_node} CPUs each: {where} has "
                       f"{len(fitting)} such node(s) (its largest has {max(c for c, *_ in found.values())} CPUs); "
                       "the job would wait forever", field=labels[1],
                       hint="ask for fewer CPUs per task or fewer tasks per node")
    if mem:
        need_mb = int(mem[:-1]) * _MEM_UNITS[mem[-1]] if mem[-1] in _MEM_UNITS else int(mem)
        fitting = [n for n in fitting if found[n][1] >= need_mb]
        if len(fitting) < nodes:
            largest = max(m for _, m, _, _ in found.values())
            raise KitError(f"{nodes} node(s) with {mem} of memory each: {where} has {len(fitting)} such node(s) "
                           f"(its largest has {largest} MB for jobs); the job would wait forever", field=labels[2],
                           hint=f"ask for at most --mem {largest}M")
    held = sorted(n for n in fitting if any(w in found[n][2] for w in ("drain", "drng", "down", "fail")))
    if len(fitting) - len(held) < nodes:
        which = ", ".join(f"{n} ({found[n][2]}: {found[n][3] or 'no reason given'})" for n in held)
        note(f"{which}: Slurm holds back {'this node' if len(held) == 1 else 'these nodes'}; the job waits until "
             "enough are back (kit cluster up resumes the local cluster's)")


def kill_wait(target: Target) -> int | None:
    """Slurm's KillWait (seconds between a job's TERM and its KILL), or None if unknown."""
    out = target.run(["scontrol", "show", "config"], what="scontrol", check=False).stdout
    m = re.search(r"^KillWait\s*=\s*(\d+)", out, re.M)
    return int(m.group(1)) if m else None


def check_stop_grace(target: Target, grace: int, label: str) -> None:
    """kit's grace between a stop's TERM and its KILL must end before Slurm's own KILL."""
    wait = kill_wait(target)
    if wait is not None and grace >= wait:
        raise KitError(f"a grace of {grace} s would be cut short: Slurm kills a job's processes {wait} s "
                       "(KillWait) after it signals them", field=label, hint=f"use a --stop-grace below {wait}")


def mpi_types(target: Target) -> list[str]:
    """The MPI plugin types the target's srun offers (``srun --mpi=list``)."""
    proc = target.run(["srun", "--mpi=list"], what="srun --mpi=list", check=False)
    text = proc.stdout + proc.stderr
    types = [line.strip() for line in text.splitlines() if line.startswith(("\t", " ")) and line.strip()]
    return [t for t in types if re.fullmatch(r"[A-Za-z0-9_]+", t)]


def check_mpi(target: Target, mpi: str, label: str) -> None:
    known = mpi_types(target)
    if mpi not in known:
        raise KitError(f"unknown MPI type {mpi!r}", field=label,
                       hint="this cluster's srun offers: " + (", ".join(known) or "(none listed)"))


def cancel(target: Target, job_id: str) -> None:
    """scancel the job (every task of an array job)."""
    target.run(["scancel", job_id], what="scancel", timeout=60)


def check_after(target: Target, deps: list, label: str, note=lambda msg: None) -> list:
    """Each (job id, kind, job dir) dependency must be able to be met: the job is
    known to Slurm and has not already ended the wrong way. A job Slurm has
    forgotten counts only through its kit job directory's FINISHED marker."""
    kept = []
    for job_id, kind, job_dir in deps:
        st = job_status(target, job_id)
        if st.state == "GONE":
            finished = job_dir is not None and records.finished(job_dir)
            if finished and kind in ("ok", "any"):
                note(f"job {job_id} finished and Slurm no longer lists it: that dependency is met")
                continue
            raise KitError(f"job {job_id} is unknown to Slurm", field=label,
                           hint="give a job that is pending, running or recently ended (or its kit job directory)")
        ended = st.state in TERMINAL_STATES
        if ended and kind == "ok" and st.state != "COMPLETED":
            raise KitError(f"job {job_id} already ended {st.state}: a job after it succeeded would never run",
                           field=label, hint=f"use --after {job_id}:any to run after it however it ended")
        if ended and kind == "notok" and st.state == "COMPLETED":
            raise KitError(f"job {job_id} already succeeded: a job after it failed would never run", field=label)
        kept.append((job_id, kind, job_dir))
    return kept


def submit(target: Target, argv: list[str], cwd: str | None = None) -> str:
    proc = target.run(argv, what="sbatch", cwd=cwd, timeout=120)
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise KitError(f"sbatch printed no job id: {proc.stdout.strip()!r}", exit_code=1)
    return job_id


@dataclass
class JobStatus:
    """One job as Slurm reports it (``squeue --json``: no user string can fake a field)."""

    job_id: str
    state: str                # PENDING, RUNNING, COMPLETED, ...; GONE once Slurm has forgotten the job
    exit_code: int = 0        # the batch script's, as a shell reports it (128+N when killed by signal N)
    restarts: int = 0
    requeue: bool = False
    nodes: str = ""
    reason: str = ""
    start_time: int = 0
    end_time: int = 0
    excluded_nodes: str = ""
    dependency: str = ""
    detail: str = ""          # Slurm's longer word on the reason (squeue's %R: "ReqNodeNotAvail, UnavailableNodes:node2")


class ControllerUnreachable(KitError):
    """slurmctld did not answer (down, restarting, or the network)."""


_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
                "Zero Bytes were transmitted")


def _wait_status(raw: int) -> int:
    """A raw wait status (what Slurm stores) as a shell reports it."""
    return 128 + (raw & 0x7F) if raw & 0x7F else (raw >> 8) & 0xFF


def _squeue_jobs(target: Target) -> list[dict]:
    """Every job record ``squeue --json`` prints (Slurm 22.05's ``--json``
    ignores ``--jobs`` and the other filters: callers pick their jobs)."""
    proc = target.run(["squeue", "--json"], check=False, timeout=60)
    if proc.returncode != 0:
        if any(m in proc.stderr for m in _UNREACHABLE):
            raise ControllerUnreachable("slurmctld is not answering", detail=proc.stderr.strip(), exit_code=1)
        raise KitError("squeue --json failed", detail=proc.stderr.strip(), exit_code=1)
    try:
        data = json.loads(proc.stdout)
        jobs, errors = data["jobs"], data.get("errors") or []
    except (ValueError, KeyError, TypeError):
        raise KitError("squeue --json printed no job list", detail=proc.stdout[:2000], exit_code=1,
                       hint="kit reads job states with squeue --json (Slurm 21.08 or newer)") from None
    if errors:
        # A controller that does not answer gives exit 0, no jobs and this list.
        raise ControllerUnreachable("squeue could not load jobs", exit_code=1,
                                    detail="; ".join(str(e.get("description") or e) for e in errors))
    return [j for j in jobs if isinstance(j, dict)]


def _status_of(target: Target, j: dict, name: str) -> JobStatus:
    state = str(j.get("job_state") or "UNKNOWN")
    if state in TERMINAL_STATES and _completing(target, str(j.get("job_id"))):
        state = "COMPLETING"  # JSON shows the end state while processes are still being killed
    return JobStatus(job_id=name, state=state, exit_code=_wait_status(int(j.get("exit_code") or 0)),
                     restarts=int(j.get("restart_cnt") or 0), requeue=bool(j.get("requeue")),
                     nodes=str(j.get("nodes") or ""), reason=str(j.get("state_reason") or ""),
                     detail=str(j.get("state_description") or ""),
                     start_time=int(j.get("start_time") or 0), end_time=int(j.get("end_time") or 0),
                     excluded_nodes=str(j.get("excluded_nodes") or ""), dependency=str(j.get("dependency") or ""))


def _by_name(records: list[dict]) -> dict[str, dict]:
    """Job records by the names kit uses: ``ID``, and ``ID_TASK`` for an array
    task (pending tasks share one record whose ``array_task_string`` lists
    them); an array task's own job id names it too."""
    out: dict[str, dict] = {}
    for j in records:
        array_id, task = j.get("array_job_id"), j.get("array_task_id")
        if array_id and isinstance(task, int) and not isinstance(task, bool):
            out[f"{array_id}_{task}"] = j
        pending = str(j.get("array_task_string") or "").partition("%")[0]
        if array_id and pending and task is None:
            for i in sweep_lib.parse_tasks(pending, "squeue").indices:
                out[f"{array_id}_{i}"] = j
    for j in records:  # plain ids last: never in place of a task's name
        out.setdefault(str(j.get("job_id")), j)
    return out


def statuses(target: Target, names: Iterable[str]) -> dict[str, JobStatus]:
    """Several jobs' states from one ``squeue --json``: each name is a job id or
    an array task's ``ID_TASK``; GONE for a job Slurm has forgotten."""
    records = _by_name(_squeue_jobs(target))
    return {n: _status_of(target, records[n], n) if n in records else JobStatus(job_id=n, state="GONE")
            for n in names}


def job_status(target: Target, job_id: str) -> JobStatus:
    """The job's state from ``squeue --json``; state GONE once Slurm has forgotten it."""
    return statuses(target, [job_id])[job_id]


def array_status(target: Target, array_id: str, indices: Iterable[int]) -> dict[int, JobStatus]:
    """Each task of an array job (``ARRAY_INDEX`` names it); GONE once Slurm forgot it."""
    indices = list(indices)
    found = statuses(target, [f"{array_id}_{i}" for i in indices])
    return {i: found[f"{array_id}_{i}"] for i in indices}


def _completing(target: Target, job_id: str) -> bool:
    """Is the job still COMPLETING (squeue's one-word state: nothing user-made can fake it)?"""
    proc = target.run(["squeue", "--noheader", f"--jobs={job_id}", "--states=all", "--format=%T"],
                      check=False, timeout=60)
    return proc.returncode == 0 and proc.stdout.strip() == "COMPLETING"


# States from which Slurm may still requeue the job by itself (a job with
# --requeue): seen at the end of a run, they must hold a while to be final.
SETTLING_STATES = frozenset({"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})


class _Final:
    """Whether a status is final: terminal, and held ``settle`` seconds in a
    state Slurm may still requeue from (a job with --requeue)."""

    def __init__(self, settle: float):
        self.settle = settle
        self.since: dict = {}

    def __call__(self, key, st: JobStatus) -> bool:
        if st.state in TERMINAL_STATES or st.state == "GONE":
            if not (st.state in SETTLING_STATES and st.requeue):
                return True
            return time.monotonic() - self.since.setdefault(key, time.monotonic()) >= self.settle
        self.since.pop(key, None)
        return False


def follow(check: Callable[[], object], *, what: str, poll: float, timeout: float | None, outage: float,
            on_outage: Callable[[str], None] | None):
    """Call ``check`` every ``poll`` seconds until it returns something. A
    controller that does not answer is asked again for up to ``outage``
    seconds (``on_outage`` hears about it once per outage); then a KitError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    unreachable_since = None
    while True:
        try:
            result = check()
        except ControllerUnreachable as e:
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                if on_outage:
                    on_outage(f"slurmctld is not answering; still waiting (up to {outage:g} s)")
            elif now - unreachable_since > outage:
                raise KitError(f"slurmctld did not answer for {outage:g} s; {what} may still run",
                               exit_code=outcome.LOST, detail=e.detail,
                               hint="follow it in its job directory, or wait again: kit launch does not "
                                    "resubmit; squeue --jobs=ID") from None
            time.sleep(poll)
            continue
        if unreachable_since is not None:
            unreachable_since = None
            if on_outage:
                on_outage("slurmctld answers again")
        if result is not None:
            return result
        if deadline is not None and time.monotonic() > deadline:
            raise KitError(f"{what} has not ended after {timeout:g} s", exit_code=1)
        time.sleep(poll)


def wait(target: Target, job_id: str, *, poll: float = 1.0, timeout: float | None = None,
         on_state: Callable[[JobStatus], None] | None = None, outage: float = 900.0,
         on_outage: Callable[[str], None] | None = None, settle: float = 10.0,
         on_poll: Callable[[JobStatus], None] | None = None) -> JobStatus:
    """Block until the job reaches a final state (requeues and outages are waited through)."""
    final = _Final(settle)
    last: list = [None]

    def check():
        st = job_status(target, job_id)
        if st.state != last[0] and on_state:
            on_state(st)
        last[0] = st.state
        if on_poll:
            on_poll(st)
        return st if final(job_id, st) else None

    return follow(check, what=f"job {job_id}", poll=poll, timeout=timeout, outage=outage, on_outage=on_outage)


def wait_array(target: Target, array_id: str, indices: Iterable[int], *, poll: float = 1.0,
               timeout: float | None = None, on_state: Callable[[int, JobStatus], None] | None = None,
               outage: float = 900.0, on_outage: Callable[[str], None] | None = None,
               settle: float = 10.0) -> dict[int, JobStatus]:
    """Block until every task of the array job is final; each task's status by index."""
    final = _Final(settle)
    indices = list(indices)
    last: dict[int, str] = {}

    def check():
        states = array_status(target, array_id, indices)
        for i, st in states.items():
            if last.get(i) != st.state and on_state:
                on_state(i, st)
            last[i] = st.state
        done = [final(i, st) for i, st in states.items()]
        return states if all(done) else None

    return follow(check, what=f"array job {array_id}", poll=poll, timeout=timeout, outage=outage,
                   on_outage=on_outage)


# Slurm's final states -> kit's exit codes (kit.core.outcome).
_STATE_CODES = {
    "CANCELLED": outcome.CANCELLED,
    "TIMEOUT": outcome.TIME_LIMIT,
    "DEADLINE": outcome.TIME_LIMIT,
    "NODE_FAIL": outcome.NODE_FAILED,
    "BOOT_FAIL": outcome.NODE_FAILED,
    "PREEMPTED": outcome.PREEMPTED,
    "OUT_OF_MEMORY": outcome.OUT_OF_MEMORY,
}


def job_outcome(st: JobStatus, job_dir: Path | None, finished: bool | None = None) -> outcome.Outcome:
    """What the end of a job means, from Slurm's final state and the job directory.

    0 needs both Slurm's COMPLETED and the job's FINISHED marker: a result
    that only one of them reports is not trusted.
    """
    if finished is None:  # the marker alone (the caller may know better: kit.jobdir.records.work_finished)
        finished = job_dir is not None and records.finished(job_dir)
    if st.state == "COMPLETED":
        code = outcome.FINISHED if finished else outcome.INCONSISTENT
    elif st.state == "FAILED":
        code = st.exit_code or outcome.INCONSISTENT
    elif st.state == "GONE":
        code = outcome.FINISHED if finished else outcome.LOST
    else:
        code = _STATE_CODES.get(st.state, outcome.LOST)
    meaning = outcome.command_failed(code) if st.state == "FAILED" else outcome.MEANING[code]
    if st.state == "CANCELLED" and st.reason == "DependencyNeverSatisfied":
        meaning = f"it never ran: its dependency can never be met ({st.dependency or 'see squeue'})"
    return outcome.Outcome(state=st.state, exit_code=code, meaning=meaning, restarts=st.restarts)
