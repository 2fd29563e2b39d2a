"""Turning a job spec into a job directory and an sbatch submission.

:func:`plan` resolves and checks a spec once and returns a frozen value (what is decided after
the check: the pinned image, the checked dependencies, the code snapshot, are its own fields).
:func:`prepare` validates nothing itself (give it a plan's :class:`ResolvedJob`); it writes the job
directory atomically: ``prelaunch.sh``, ``launcher.sh``, ``job.json`` (the resolved spec) and ``sbatch.json``.
:func:`submit` hands it to sbatch and records the job id.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kit import files, slurm
from kit import snapshot as snapshots
from kit.version import __version__
from kit.core import bash, ending, outcome
from kit.core import sweep as sweep_lib
from kit.core.spec import ResolvedJob, parse_after
from kit.errors import KitError
from kit.image import is_reference
from kit.jobdir import JobDir, records
from kit.submission import sidecars
from kit.slurm import pyxis


@dataclass
class PreparedJob:
    job: ResolvedJob
    job_dir: Path
    sbatch_argv: list[str]
    srun_argv: list[str]  # the step prelaunch.sh runs (--container-env as if every candidate were set)
    job_id: str | None = None

    def as_json(self) -> dict:
        return {"job_id": self.job_id, "job_dir": str(self.job_dir), "sbatch_argv": self.sbatch_argv,
                "srun_argv": self.srun_argv}


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
        for path, what in ((str(job_dir), "the job directory"), (s.prometheus_targets, "the Prometheus targets"),
                           (IMAGE_PREFIX, "kit's runtime")):
            if path and pyxis.covers(m.dst, path):
                raise KitError(f"{m.render()} would cover {what} ({path}), which the job uses inside the container",
                               field="--mount", hint="mount it at another place")
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
        found = info.image_has(image, ["bin/bash", "usr/bin/bash", "usr/bin/tee", "bin/tee", "opt/kit/VERSION"],
                               shown=shown, field="--image")
        missing = [tool for tool in ("bash", "tee") if not found & {f"bin/{tool}", f"usr/bin/{tool}"}]
        if missing:
            raise KitError(f"{shown} has no {' or '.join(missing)}, which launcher.sh needs inside the container",
                           field="--image", hint="add them to the image (e.g. a recipe step: run = \"apt-get "
                                                 "install -y bash coreutils\")")
        if "opt/kit/VERSION" not in found:
            # Not built by kit: the job mounts kit's runtime instead of needing a rebuild.
            bundle = runtime.bundle()
            mounts.append(pyxis.Mount(str(bundle), runtime.IMAGE_PREFIX, ("ro",)))
        if workdir is None:
            meta = info.image_metadata(image) or {}
            workdir = (meta.get("config") or {}).get("workdir") or None
    flags = pyxis.srun_flags(image=job.image, mounts=mounts, workdir=workdir, name=job.container_name or
                             s.container_name, writable=s.container_writable, mount_home=s.container_mount_home,
                             remap_root=s.container_remap_root)
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
    prelaunch = bash.render(prelaunch_template(), {
        "kit_version": __version__, "lib": lib,
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
    })
    per_node = s.ntasks_per_node == 1
    launcher = bash.render(bash.template(JobDir.LAUNCHER), {
        "kit_version": __version__,
        "lib": lib,
        "rank_mapping": bash.array(f"{name}={source}" for name, source in slurm.RANK_MAPPING),
        "per_node_launcher": "1" if per_node else "0",
        "nproc_per_node": bash.quote(s.gpus_per_node if per_node and s.gpus_per_node else ""),
        "command": bash.array([] if job.params else s.command),
        "sweep": "1" if job.params else "0",
        "stop_grace": str(s.stop_grace),
        "sidecars": bash.array(sidecars.as_words(sidecars.for_job(s.sidecars, exporter=s.exporter))),
    })
    return {JobDir.PRELAUNCH: prelaunch, JobDir.LAUNCHER: launcher}


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


def plan(spec, origins=None, *, target: slurm.Target | None = None, target_note: str | None = None,
         cwd: Path | None = None, rerun: Rerun | None = None) -> Plan:
    """Resolve and validate ``spec`` once, for ``target`` (chosen before: see
    :func:`kit.targets.plan`), and check it against that Slurm: partition, MPI
    plugin, node sizes, KillWait, ``--after`` jobs; snapshot the code and pin an image
    file (or keep ``rerun``'s). The result is final."""
    from kit.core import spec as specs

    origins = origins or specs.Origins()
    job = resolve(spec, origins, cwd=cwd)
    said = [f"warning: {w}" for w in job.warnings]
    job = pin_code_and_image(job, origins, rerun or Rerun(), dry_run=target is None)
    live = [n for n in (snapshots.live_directories(job.snapshot, Path(job.workdir)) if job.snapshot else [])
            if (Path(job.workdir) / n).resolve() != Path(job.spec.output_dir).resolve()]
    if live:
        said.append("note: " + ", ".join(f"./{n}" for n in live) + " are your work tree's, linked live: what the job "
                    "writes there lands in " + str(Path(job.workdir)) + "; a relative path that does not exist now is "
                    "created in the job's own code/ (write results to an absolute path to choose)")
    deps = resolve_after(job, origins.label("after"))
    if target is not None:
        if target_note:
            said.append(target_note)
        inside = os.environ.get("SLURM_JOB_ID")
        if inside:  # typed inside salloc (or a job): what is launched is a job of its own
            said.append(f"note: this shell is inside Slurm job {inside} (an salloc allocation or a job): kit launch "
                        "submits a separate job with nodes of its own; to use the allocation's nodes, run the "
                        "command there with srun")
        s = job.spec
        if s.partition:
            slurm.check_partition(target, s.partition, origins.label("partition"))
        if s.mpi != "none":
            slurm.check_mpi(target, s.mpi, origins.label("mpi"))
        slurm.check_fits(target, s.partition, s.nodes, (s.cpus_per_task or 1) * s.ntasks_per_node, s.mem,
                         (origins.label("nodes"), origins.label("cpus_per_task"), origins.label("mem"),
                          origins.label("gpus_per_node")),
                         note=lambda msg: said.append(f"warning: {msg}"), gpus_per_node=s.gpus_per_node)
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


def pin_code_and_image(job: ResolvedJob, origins, rerun: Rerun, dry_run: bool = False) -> ResolvedJob:
    """``job`` with the code it runs (a snapshot; none outside a git work tree without --code,
    as docs/job-directory.md says) and its image file (a copy by content; a dry run only hashes it)
    fixed now, so that a pending or requeued job runs what was submitted."""
    s = job.spec
    snapshot = rerun.snapshot
    snapshots.require_workdir(s.code_snapshot, Path(job.workdir), origins.label("code_snapshot"))
    if s.code_snapshot and snapshot is None:
        snapshot = snapshots.take(Path(job.workdir), s.code, store=snapshots.store_for(Path(s.output_dir)),
                                  label=origins.label("code"), exclude=(Path(s.output_dir),))
    changes: dict = {"snapshot": snapshot if s.code_snapshot else None}
    if job.image and not is_reference(job.image):
        from kit.image import pin

        pinned, digest = pin.pin(Path(job.image), origins.label("image"), copy=not dry_run)
        same = rerun.image_source is not None and pinned == Path(job.image)  # a rerun's pinned copy, again
        changes.update(image=str(pinned), image_digest=digest, image_source=rerun.image_source if same else job.image)
    return dataclasses.replace(job, **changes)


def _new_job_dir(out_dir: Path, job_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = files.safe_name(job_name) or "job"
    return out_dir / f"{safe}-{stamp}-{secrets.token_hex(3)}"


def prepare(job: ResolvedJob, *, job_dir: Path | None = None) -> PreparedJob:
    """Write the job directory (all or nothing) and return what to submit."""
    out_dir = Path(job.spec.output_dir)
    final = job_dir or _new_job_dir(out_dir, job.spec.job_name)
    argv = slurm.sbatch_argv(job, final, start_dir(job, final))
    the_step = step(job, final)  # checks the image: before anything is written
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KitError(f"cannot create {out_dir}: {e.strerror}", field="--output-dir") from None
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        # The job's directory is its user's alone (0700): job.json and the scripts hold --env
        # values, which may be secrets (tokens), and the logs what the job printed.
        tmp.mkdir(mode=0o700)
        os.chmod(tmp, 0o700)
        JobDir(tmp).logs.mkdir()
        for name, text in render_scripts(job, final, the_step).items():
            path = tmp / name
            path.write_text(text, encoding="utf-8")
            path.chmod(0o700)
        _write_tasks(job, tmp)
        if job.snapshot is not None:
            snapshots.materialize(job.snapshot, JobDir(tmp).code, tmp / JobDir.CODE_LIST)
        (tmp / JobDir.SPEC).write_text(json.dumps(spec_record(job), indent=2, sort_keys=True) + "\n")
        (tmp / JobDir.SBATCH).write_text(json.dumps(argv, indent=2) + "\n")
        os.rename(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise KitError(f"cannot write the job directory {final}: {e.strerror}", field="--output-dir",
                       exit_code=1, hint="nothing was written or submitted; free space or choose another "
                                         "--output-dir") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PreparedJob(job=job, job_dir=final, sbatch_argv=argv, srun_argv=the_step.argv(final))


def start_dir(job: ResolvedJob, job_dir: Path) -> Path | None:
    """Where every run starts: the submission directory's place in the snapshot's view."""
    if job.snapshot is not None:
        return snapshots.workdir(job.snapshot, JobDir(job_dir).code, Path(job.workdir))
    return Path(job.workdir) if job.workdir else None


def spec_record(job: ResolvedJob) -> dict:
    """``job.json``: the resolved spec, and what was fixed at submission (the directory the
    command starts in, the code snapshot, the image file's digest)."""
    record = job.spec.to_dict()
    record.update(workdir=job.workdir, after=list(job.after))  # the dependencies as checked
    if job.image:
        record["image"] = job.image  # the pinned copy: a rerun runs the same bytes
    if job.snapshot is not None:
        record["snapshot"] = job.snapshot.record()
    if job.image_digest:
        record["image_digest"] = job.image_digest
        record["image_source"] = job.image_source
    return record


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
            raise KitError(f"{ref!r} is neither a job id nor a submitted kit job directory", field=label,
                           hint="give the id kit launch printed, or the job directory it printed")
        deps.append((job_id, kind, d))
    return deps


def _write_tasks(job: ResolvedJob, job_dir: Path) -> None:
    """An array job's task directories: ``tasks/<index>/`` with its logs and, for
    a sweep, its parameters (``params.json``), its command with the values in
    place and its ``KIT_SWEEP_*`` values (``command``, ``sweep``: NUL-separated)."""
    if job.tasks is None:
        return
    params = job.params or ({},) * len(job.tasks.indices)
    for index, values in zip(job.tasks.indices, params):
        task = JobDir(job_dir).task(index)
        task.logs.mkdir(parents=True)
        if not values:
            continue
        (task / JobDir.PARAMS).write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
        words = [sweep_lib.substitute(w, values) for w in job.spec.command]
        (task / JobDir.COMMAND).write_bytes(b"".join(w.encode() + b"\0" for w in words))
        (task / JobDir.SWEEP).write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in values.items()))


def submit(prepared: PreparedJob, target: slurm.Target) -> PreparedJob:
    """Submit with sbatch --parsable; on failure the job directory is removed."""
    s = prepared.job.spec
    try:
        if prepared.job.image and s.prometheus_targets and s.exporter:
            # pyxis mounts it into the container: it must exist when the job starts.
            try:
                Path(s.prometheus_targets).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise KitError(f"cannot create {s.prometheus_targets}: {e.strerror}", field="--prometheus-targets",
                               hint="give a directory Prometheus reads (file_sd) that this user can create") from None
        job_id = slurm.submit(target, prepared.sbatch_argv)
    except BaseException:
        shutil.rmtree(prepared.job_dir, ignore_errors=True)
        raise
    prepared.job_id = job_id
    # job_id first (it marks a submitted job), then which Slurm has it (for kit ps/logs/cancel).
    try:
        files.write_atomic(prepared.job_dir / JobDir.JOB_ID, job_id + "\n")
        files.write_atomic(prepared.job_dir / JobDir.SLURM,
                           json.dumps({"target": target.name, "conf": target.conf}) + "\n")
    except OSError as e:
        raise KitError(f"job {job_id} was submitted and runs, but its record in {prepared.job_dir} could not be "
                       f"written: {e.strerror}", exit_code=1,
                       hint=f"free space there; scancel {job_id} stops it") from None
    records.remember(prepared.job_dir)
    return prepared
