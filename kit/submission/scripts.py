"""The scripts a job runs: its srun step (pyxis flags, --container-env candidates), launch/'s scripts copied as
they ship, and the job's values in job.env (each quoted once)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from kit import slurm
from kit.code import snapshot as snapshots
from kit.core import bash, ending, outcome
from kit.core.spec import ResolvedJob
from kit.errors import KitError
from kit.image import is_reference
from kit.jobdir import JobDir
from kit.slurm import pyxis
from kit.submission import sidecars
from kit.version import __version__


@dataclass(frozen=True)
class Step:
    """The srun step: its options and the --container-env candidates."""

    srun_args: list[str]
    container_env: list[str]

    def argv(self, job_dir: Path) -> list[str]:
        extra = [f"--container-env={','.join(self.container_env)}"] if self.container_env else []
        return ["srun", *self.srun_args, *extra, str(job_dir / JobDir.LAUNCHER)]


def step(job: ResolvedJob, job_dir: Path) -> Step:
    flags, names = container_setup(job, job_dir)
    return Step(slurm.srun_args(job, flags), names)


def container_setup(job: ResolvedJob, job_dir: Path) -> tuple[list[str], list[str]]:
    """(srun container flags, --container-env candidates) for a job with an image."""
    s = job.spec
    if not job.image:
        return [], []
    from kit.image.runtime import IMAGE_PREFIX

    for m in job.mounts:
        for path, what in (
            (str(job_dir), "the job directory"),
            (s.prometheus_targets, "the Prometheus targets"),
            (IMAGE_PREFIX, "kit's runtime"),
        ):
            if path and pyxis.covers(m.dst, path):
                raise KitError(
                    f"{m.render()} would cover {what} ({path}), which the job uses inside the container",
                    field="--mount",
                    hint="mount it at another place",
                )
    mounts = [pyxis.Mount(str(job_dir), str(job_dir)), *job.mounts]
    if s.prometheus_targets and s.exporter:
        mounts.append(pyxis.Mount(s.prometheus_targets, s.prometheus_targets))
    workdir = s.container_workdir
    if job.snapshot is not None:
        # The command starts in the snapshot's view, as on the host; the work tree it links
        # to (ignored files, data) at its own path, unless a mount of the user's shows it.
        root = job.snapshot.root
        if not any(pyxis.covers(m.dst, root) for m in job.mounts):
            mounts.insert(0, pyxis.Mount(root, root))
        workdir = workdir or str(start_dir(job, job_dir))
    elif workdir is None and job.workdir and not _system(job.workdir):
        # No snapshot (a directory outside git): the job starts where it was submitted, as without --image and
        # as sbatch does; the directory is mounted at its own path unless a mount of the user's shows it.
        workdir = job.workdir
        if not any(pyxis.covers(m.dst, workdir) for m in job.mounts):
            mounts.insert(0, pyxis.Mount(workdir, workdir))
    if not is_reference(job.image):
        from kit.image import info, runtime

        image = Path(job.image)
        shown = job.image_source or job.image  # the file the user named (the job runs its pinned copy)
        found = info.image_has(
            image,
            ["bin/bash", "usr/bin/bash", "usr/bin/tee", "bin/tee", "opt/kit/VERSION"],
            shown=shown,
            field="--image",
        )
        missing = [tool for tool in ("bash", "tee") if not found & {f"bin/{tool}", f"usr/bin/{tool}"}]
        if missing:
            raise KitError(
                f"{shown} has no {' or '.join(missing)}, which launcher.sh needs inside the container",
                field="--image",
                hint='add them to the image (e.g. a recipe step: run = "apt-get install -y bash coreutils")',
            )
        if "opt/kit/VERSION" not in found:
            # Not built by kit: the job mounts kit's runtime instead of needing a rebuild.
            bundle = runtime.bundle()
            mounts.append(pyxis.Mount(str(bundle), runtime.IMAGE_PREFIX, ("ro",)))
        if workdir is None:
            meta = info.image_metadata(image) or {}
            workdir = (meta.get("config") or {}).get("workdir") or None
    flags = pyxis.srun_flags(
        image=job.image,
        mounts=mounts,
        workdir=workdir,
        name=job.container_name or s.container_name,
        writable=s.container_writable,
        mount_home=s.container_mount_home,
        remap_root=s.container_remap_root,
    )
    names = sorted(set(pyxis.JOB_VARIABLES) | set(s.env) | set(s.container_env))
    return flags, names


# Paths of the image a submission directory is not mounted onto: the container's system would be the host's
# (a job submitted from one, a function's from "/", starts in the image's WORKDIR, as pyxis does).
SYSTEM_DIRS = (
    "/",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/opt",
)


def _system(path: str) -> bool:
    from kit.image.runtime import IMAGE_PREFIX

    return path in SYSTEM_DIRS or pyxis.covers(path, IMAGE_PREFIX)


# launch/'s scripts, copied into every job directory as they ship: a job runs the scripts it was submitted
# with (a kit upgrade or a requeue never changes them), its values in JobDir.ENV beside them.
SHIPPED = (JobDir.PRELAUNCH, JobDir.LAUNCHER, *JobDir.SCRIPT_PARTS)


def job_values(job: ResolvedJob, job_dir: Path, the_step: Step | None = None) -> dict[str, str | list[str]]:
    """The job's values for its scripts, by the name the scripts read (a word, or a list for a bash array)."""
    s = job.spec
    the_step = the_step or step(job, job_dir)
    per_node = s.ntasks_per_node == 1
    return {
        # prelaunch.sh
        "KIT_MAX_RESTARTS": str(s.max_restarts),
        "KIT_SIGNAL_LEAD": str(s.signal_lead),
        "KIT_STOP_GRACE": str(s.stop_grace),
        "KIT_WORLD_SIZE": str(s.nodes * s.ntasks_per_node),
        "KIT_EXIT_CODES": [f"{name}={code}" for name, code in outcome.PRELAUNCH_CODES.items()],
        "KIT_ENDINGS": list(ending.as_bash()),
        "KIT_HANG_TIMEOUT": str(s.hang_timeout),
        "KIT_FIRST_PROGRESS_TIMEOUT": str(s.first_progress_timeout),
        "KIT_HEARTBEAT_SECONDS": str(s.heartbeat),
        "KIT_PORT_LOW": str(job.port_low),
        "KIT_PORT_HIGH": str(job.port_high),
        "KIT_MASTER_IFACE": s.master_interface or "",
        "KIT_SRUN_ARGS": list(the_step.srun_args),
        "KIT_CONTAINER": "1" if job.image else "0",
        "KIT_CONTAINER_ENV": list(the_step.container_env),
        "KIT_WARNING_SIGNAL": s.signal,
        "KIT_DEBUG": "1" if s.debug else "0",
        "KIT_ENV": [f"{k}={v}" for k, v in sorted(s.env.items())],
        "KIT_EXPORTER_PORTS": s.exporter_ports,
        "KIT_TARGETS_DIR": s.prometheus_targets or "",
        # Outside a container the exporter runs on the Python that has kit (this one).
        "KIT_HOST_PYTHON": "" if job.image else sys.executable,
        # --notify's watcher runs on the batch node's host: the Python that has kit, the one submitting it.
        "KIT_NOTIFY_PYTHON": sys.executable if s.notify else "",
        # launcher.sh
        "KIT_RANK_MAPPING": [f"{name}={source}" for name, source in slurm.RANK_MAPPING],
        "KIT_PER_NODE_LAUNCHER": "1" if per_node else "0",
        "KIT_NPROC_PER_NODE": str(s.gpus_per_node) if per_node and s.gpus_per_node else "",
        "KIT_COMMAND": [] if job.params else list(s.command),
        "KIT_SWEEP_TASK": "1" if job.params else "0",
        "KIT_SIDECARS": sidecars.as_words(sidecars.for_job(s.sidecars, exporter=s.exporter)),
        "KIT_PREFLIGHT": "1" if s.preflight or s.preflight_network else "0",
        "KIT_PREFLIGHT_NETWORK": "1" if s.preflight_network else "0",
        "KIT_ON_STRAGGLER": s.on_straggler,
        "KIT_ON_FAILURE": s.on_failure,
        "KIT_STEP_NODES": str(s.nodes),  # of the allocation's, --spare-nodes more (kit::step_nodes)
    }


def job_env(values: dict[str, str | list[str]]) -> str:
    """``job.env``: each value quoted once (a bash array for a list), for prelaunch.sh and launcher.sh to source."""
    lines = [
        f"# job.env: this job's values, written by kit {__version__} at submission; prelaunch.sh and launcher.sh",
        "# source it. Every value is literal (quoted once): no shell expands the words here.",
        "# shellcheck shell=bash disable=SC2016,SC2034",
    ]
    for name, value in values.items():
        if not isinstance(value, list):
            lines.append(f"{name}={bash.quote(value)}")
        elif len(one := f"{name}=({bash.array(value)})") <= 120:
            lines.append(one)
        else:  # a long array: a row a line (a sidecar's three words, else one word)
            n = 3 if name == "KIT_SIDECARS" else 1
            lines += [f"{name}=(", *(f"  {bash.array(value[i : i + n])}" for i in range(0, len(value), n)), ")"]
    return "\n".join(lines) + "\n"


def render_scripts(job: ResolvedJob, job_dir: Path, the_step: Step | None = None) -> dict[str, str]:
    """What a job directory holds to run ``job``: launch/'s scripts as they ship, and its values in job.env."""
    texts = {name: bash.template(name) for name in SHIPPED}
    texts[JobDir.ENV] = job_env(job_values(job, job_dir, the_step))
    return texts


def start_dir(job: ResolvedJob, job_dir: Path) -> Path | None:
    """Where every run starts: the submission directory's place in the snapshot's view."""
    if job.snapshot is not None:
        return snapshots.workdir(job.snapshot, JobDir(job_dir).code, Path(job.workdir))
    return Path(job.workdir) if job.workdir else None
