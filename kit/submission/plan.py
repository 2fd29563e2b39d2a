"""A job planned: a spec resolved and checked once, for its Slurm (partition, MPI, dependencies), and the code and
image it runs pinned (:class:`Plan`, :class:`Rerun`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from kit import files, slurm
from kit.code import snapshot as snapshots
from kit.core.spec import ResolvedJob, parse_after
from kit.errors import KitError
from kit.image import is_reference
from kit.jobdir import JobDir, trust
from kit.slurm import pyxis


def resolve(spec, origins=None, *, cwd: Path | None = None) -> ResolvedJob:
    """:func:`kit.core.spec.resolve`, then the container part through pyxis's
    room (the scheduler-neutral core does not know pyxis's mount syntax)."""
    from kit.core import spec as specs

    origins = origins or specs.Origins()
    job = specs.resolve(spec, origins, cwd=cwd)
    if not job.spec.image:
        return job
    image, mounts = pyxis.check_container(job.spec, origins)
    return dataclasses.replace(job, image=image, mounts=tuple(mounts))


@dataclass
class Plan:
    """A job decided and checked, nothing written yet: what :func:`prepare` writes and
    :func:`submit` submits. ``target`` is None for a dry run (nothing is submitted);
    ``messages`` are what the user should hear, in order ("warning: …" or a note)."""

    job: ResolvedJob
    target: slurm.Target | None
    messages: list[str] = dataclasses.field(default_factory=list)


def plan(
    spec,
    origins=None,
    *,
    target: slurm.Target | None = None,
    target_note: str | None = None,
    cwd: Path | None = None,
    rerun: Rerun | None = None,
) -> Plan:
    """Resolve and validate ``spec`` once, for ``target`` (chosen before: see
    :func:`kit.targets.plan`), and check it against that Slurm: partition, MPI
    plugin, node sizes, KillWait, ``--after`` jobs; snapshot the code and pin an image
    file (or keep ``rerun``'s). The result is final."""
    from kit.core import spec as specs

    origins = origins or specs.Origins()
    job = resolve(spec, origins, cwd=cwd)
    said = [f"warning: {w}" for w in job.warnings]
    job = pin_code_and_image(job, origins, rerun or Rerun(), dry_run=target is None)
    live = [
        n
        for n in (snapshots.live_directories(job.snapshot, Path(job.workdir)) if job.snapshot else [])
        if (Path(job.workdir) / n).resolve() != Path(job.spec.output_dir).resolve()
    ]
    if live:
        said.append(
            "note: " + ", ".join(f"./{n}" for n in live) + " are your work tree's, linked live: what the job "
            "writes there lands in " + str(Path(job.workdir)) + "; a relative path that does not exist now is "
            "created in the job's own code/ (write results to an absolute path to choose)"
        )
    deps = resolve_after(job, origins.label("after"))
    if target is not None:
        if target_note:
            said.append(target_note)
        inside = os.environ.get("SLURM_JOB_ID")
        if inside:  # typed inside salloc (or a job): what is launched is a job of its own
            said.append(
                f"note: this shell is inside Slurm job {inside} (an salloc allocation or a job): kit launch "
                "submits a separate job with nodes of its own; to use the allocation's nodes, run the "
                "command there with srun"
            )
        s = job.spec
        if s.partition:
            slurm.check_partition(target, s.partition, origins.label("partition"))
        if s.mpi != "none":
            slurm.check_mpi(target, s.mpi, origins.label("mpi"))
        slurm.check_fits(
            target,
            s.partition,
            s.nodes + s.spare_nodes,
            (s.cpus_per_task or 1) * s.ntasks_per_node,
            s.mem,
            (
                origins.label("nodes"),
                origins.label("cpus_per_task"),
                origins.label("mem"),
                origins.label("gpus_per_node"),
            ),
            note=lambda msg: said.append(f"warning: {msg}"),
            gpus_per_node=s.gpus_per_node,
        )
        slurm.check_stop_grace(target, s.stop_grace, origins.label("stop_grace"), config := slurm.slurm_config(target))
        if job.image and not s.container_name and pyxis.epilog_removes(slurm.pyxis_settings(target, config)):
            job = dataclasses.replace(job, container_name=pyxis.KIT_CONTAINER)  # removed after the job, not in it
        deps = slurm.check_after(target, deps, origins.label("after"), note=said.append)
    return Plan(dataclasses.replace(job, after=tuple(f"{job_id}:{kind}" for job_id, kind, _ in deps)), target, said)


@dataclass(frozen=True)
class Rerun:
    """What a rerun keeps of the job it reruns (``kit rerun``): its code snapshot, and the
    name its pinned image was given as."""

    snapshot: snapshots.Snapshot | None = None
    image_source: str | None = None


def check_output_dir(out_dir: Path) -> None:
    """The directory job directories go in is the user's (or root's) and nobody else's to write (unless sticky):
    whoever else could rename a job's directory there before it starts would put their own scripts in its place,
    run as this user (prelaunch checks the same before it reads anything: launch/prelaunch.sh)."""
    try:
        why = trust.replaceable_by_others(os.stat(out_dir), sticky_ok=True)
    except FileNotFoundError:
        return  # made by the launch, the user's
    except OSError as e:
        raise KitError(f"cannot read {out_dir}: {e.strerror}", field="--output-dir") from None
    if why:
        raise KitError(
            f"{out_dir}: {why}: whoever can replace a job's directory there runs their code as you when the job starts",
            field="--output-dir",
            hint="give a directory of your own that only you can write (the default: ./kit-jobs)",
        )


def pin_code_and_image(job: ResolvedJob, origins, rerun: Rerun, dry_run: bool = False) -> ResolvedJob:
    """``job`` with the code it runs (a snapshot; none outside a git work tree without --code,
    as docs/job-directory.md says) and its image file (a copy by content; a dry run only hashes it)
    fixed now, so that a pending or requeued job runs what was submitted."""
    s = job.spec
    snapshot = rerun.snapshot
    check_output_dir(Path(s.output_dir))  # before anything is written there (the code store may be)
    snapshots.require_workdir(s.code_snapshot, Path(job.workdir), origins.label("code_snapshot"))
    if s.code_snapshot and snapshot is None:
        snapshot = snapshots.take(
            Path(job.workdir),
            s.code,
            store=snapshots.store_for(Path(s.output_dir)),
            label=origins.label("code"),
            exclude=(Path(s.output_dir),),
        )
    changes: dict = {"snapshot": snapshot if s.code_snapshot else None}
    if job.image and not is_reference(job.image):
        from kit.image import pin

        pinned, digest = pin.pin(Path(job.image), origins.label("image"), copy=not dry_run)
        same = rerun.image_source is not None and pinned == Path(job.image)  # a rerun's pinned copy, again
        changes.update(image=str(pinned), image_digest=digest, image_source=rerun.image_source if same else job.image)
    return dataclasses.replace(job, **changes)


def resolve_after(job: ResolvedJob, label: str) -> list[tuple[str, str, Path | None]]:
    """``--after`` items as (job id, kind, job directory or None): a job
    directory is read for its id (written at submission)."""
    deps = []
    for item in job.spec.after:
        ref, kind = parse_after(item, label)
        if ref.isdigit():
            deps.append((ref, kind, None))
            continue
        d = Path(ref).expanduser()
        try:
            job_id = files.read_text(d / JobDir.JOB_ID, 64).strip() if d.is_dir() else ""
        except OSError:
            job_id = ""
        if not job_id.isdigit():
            raise KitError(
                f"{ref!r} is neither a job id nor a submitted kit job directory",
                field=label,
                hint="give the id kit launch printed, or the job directory it printed",
            )
        deps.append((job_id, kind, d))
    return deps
