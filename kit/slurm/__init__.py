"""Everything kit knows about Slurm: option composition, submission, job state.

:class:`Target` names which Slurm to talk to (the site's, or kit's local
cluster through its ``SLURM_CONF``); every Slurm command goes through
:func:`kit.runner.run` with that target's environment.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from kit.core.spec import ResolvedJob
from kit.errors import KitError
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
        "--output": _escape_filename_pattern(str(job_dir / "logs")) + "/slurm-%j.out",
        "--open-mode": "append",
    }
    if s.gpus_per_node:
        opts["--gpus-per-node"] = str(s.gpus_per_node)
    for name in ("cpus_per_task", "mem", "time", "partition", "account"):
        value = getattr(s, name)
        if value is not None:
            opts["--" + name.replace("_", "-")] = str(value)
    if job.time_seconds is not None or s.max_restarts:
        opts["--signal"] = f"B:{s.signal}@{s.signal_lead}"
    argv = ["sbatch", "--parsable"]
    argv += [f"{k}={v}" for k, v in sorted(opts.items())]
    argv.append("--requeue" if s.max_restarts else "--no-requeue")
    argv += list(s.sbatch_args)
    argv.append(str(job_dir / "prelaunch.sh"))
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
        "--mpi=none",
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


def submit(target: Target, argv: list[str], cwd: str | None = None) -> str:
    proc = target.run(argv, what="sbatch", cwd=cwd, timeout=120)
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise KitError(f"sbatch printed no job id: {proc.stdout.strip()!r}", exit_code=1)
    return job_id


_FIELD = re.compile(r"(\w+)=(\S*)")


def job_info(target: Target, job_id: str) -> dict[str, str] | None:
    """``scontrol show job`` as a dict; None once Slurm has forgotten the job."""
    proc = target.run(["scontrol", "--oneliner", "show", "job", job_id], check=False)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise KitError(f"scontrol show job {job_id} failed", detail=proc.stderr.strip(), exit_code=1)
    return dict(_FIELD.findall(proc.stdout))


@dataclass
class JobEnd:
    state: str
    exit_code: int
    restarts: int = 0
    info: dict = field(default_factory=dict)


def exit_code_of(info: Mapping[str, str]) -> int:
    """ExitCode=RC:SIG as a shell would report it (128+SIG when killed by a signal)."""
    rc, _, sig = info.get("ExitCode", "0:0").partition(":")
    if sig and sig != "0":
        return 128 + int(sig)
    return int(rc or 0)


def wait(target: Target, job_id: str, *, poll: float = 1.0, timeout: float | None = None,
         on_state: Callable[[str], None] | None = None) -> JobEnd:
    """Block until the job reaches a final state (requeues are waited through)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        info = job_info(target, job_id)
        if info is None:
            raise KitError(f"job {job_id} is no longer known to Slurm", exit_code=1,
                           hint="its record expired (MinJobAge); look at the job directory's logs")
        state = info.get("JobState", "UNKNOWN")
        if state != last and on_state:
            on_state(state)
        last = state
        if state in TERMINAL_STATES:
            return JobEnd(state=state, exit_code=exit_code_of(info),
                          restarts=int(info.get("Restarts", "0") or 0), info=info)
        if deadline is not None and time.monotonic() > deadline:
            raise KitError(f"job {job_id} still {state} after {timeout:g} s", exit_code=1)
        time.sleep(poll)
