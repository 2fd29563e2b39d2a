"""The scripts a job runs: its srun step (pyxis flags, --container-env candidates) and prelaunch.sh and launcher.sh
rendered from launch/ templates, every slot a quoted value."""

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


PRELAUNCH_PARTS = ("step", "watchdog", "ending")  # launch/prelaunch_<part>.sh: its functions by concern


def prelaunch_template() -> str:
    """prelaunch.sh with its parts pasted in (their slots filled with the rest)."""
    text = bash.template(JobDir.PRELAUNCH)
    for part in PRELAUNCH_PARTS:
        text = text.replace("{{ %s }}" % part, bash.template(f"prelaunch_{part}.sh").rstrip("\n"), 1)
    return text


def render_scripts(job: ResolvedJob, job_dir: Path, the_step: Step | None = None) -> dict[str, str]:
    """The text of prelaunch.sh and launcher.sh for ``job`` living in ``job_dir``: every slot
    a quoted value or an array body; the bash that uses them lives in the templates."""
    s = job.spec
    the_step = the_step or step(job, job_dir)
    lib = bash.template("lib.sh").rstrip("\n")  # shared functions, included whole (no side effects)
    prelaunch = bash.render(
        prelaunch_template(),
        {
            "kit_version": __version__,
            "lib": lib,
            "job_dir": bash.quote(job_dir),
            "max_restarts": str(s.max_restarts),
            "signal_lead": str(s.signal_lead),
            "stop_grace": str(s.stop_grace),
            "world_size": str(s.nodes * s.ntasks_per_node),
            "exit_codes": bash.array(f"{name}={code}" for name, code in outcome.PRELAUNCH_CODES.items()),
            "endings": bash.array(ending.as_bash()),
            "hang_timeout": str(s.hang_timeout),
            "first_progress_timeout": str(s.first_progress_timeout),
            "heartbeat": str(s.heartbeat),
            "port_low": str(job.port_low),
            "port_high": str(job.port_high),
            "master_interface": bash.quote(s.master_interface or ""),
            "srun_args": bash.array(the_step.srun_args),
            "container": "1" if job.image else "0",
            "container_env": bash.array(the_step.container_env),
            "signal": bash.quote(s.signal),
            "debug": "1" if s.debug else "0",
            "env": bash.array(f"{k}={v}" for k, v in sorted(s.env.items())),
            "exporter_ports": bash.quote(s.exporter_ports),
            "prometheus_targets": bash.quote(s.prometheus_targets or ""),
            # Outside a container the exporter runs on the Python that has kit (this one).
            "host_python": bash.quote("" if job.image else sys.executable),
        },
    )
    per_node = s.ntasks_per_node == 1
    launcher = bash.render(
        bash.template(JobDir.LAUNCHER),
        {
            "kit_version": __version__,
            "lib": lib,
            "rank_mapping": bash.array(f"{name}={source}" for name, source in slurm.RANK_MAPPING),
            "per_node_launcher": "1" if per_node else "0",
            "nproc_per_node": bash.quote(s.gpus_per_node if per_node and s.gpus_per_node else ""),
            "command": bash.array([] if job.params else s.command),
            "sweep": "1" if job.params else "0",
            "stop_grace": str(s.stop_grace),
            "sidecars": bash.array(sidecars.as_words(sidecars.for_job(s.sidecars, exporter=s.exporter))),
        },
    )
    return {JobDir.PRELAUNCH: prelaunch, JobDir.LAUNCHER: launcher}


def start_dir(job: ResolvedJob, job_dir: Path) -> Path | None:
    """Where every run starts: the submission directory's place in the snapshot's view."""
    if job.snapshot is not None:
        return snapshots.workdir(job.snapshot, JobDir(job_dir).code, Path(job.workdir))
    return Path(job.workdir) if job.workdir else None
