"""A planned job written and submitted: its directory made atomically (the scripts, job.env, job.json,
sbatch.json, an array job's tasks), then handed to sbatch and its id recorded."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from kit import files, slurm
from kit.code import snapshot as snapshots
from kit.core import sweep as sweep_lib
from kit.core.spec import ResolvedJob
from kit.errors import KitError
from kit.jobdir import JobDir, job_index
from kit.submission.plan import check_output_dir
from kit.submission.scripts import render_scripts, start_dir, step


@dataclass
class PreparedJob:
    job: ResolvedJob
    job_dir: Path
    sbatch_argv: list[str]
    srun_argv: list[str]  # the step prelaunch.sh runs (--container-env as if every candidate were set)
    job_id: str | None = None

    def as_json(self) -> dict:
        return {
            "job_id": self.job_id,
            "job_dir": str(self.job_dir),
            "sbatch_argv": self.sbatch_argv,
            "srun_argv": self.srun_argv,
        }


def _new_job_dir(out_dir: Path, job_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = files.safe_name(job_name) or "job"
    return out_dir / f"{safe}-{stamp}-{os.urandom(3).hex()}"


def prepare(job: ResolvedJob, *, job_dir: Path | None = None, dry_run: bool = False) -> PreparedJob:
    """Write the job directory (all or nothing) and return what to submit; a dry run's leaves the code
    snapshot in the store (its copy in the directory is made for a job that runs, as its image's is)."""
    out_dir = Path(job.spec.output_dir)
    final = job_dir or _new_job_dir(out_dir, job.spec.job_name)
    argv = slurm.sbatch_argv(job, final, start_dir(job, final))
    the_step = step(job, final)  # checks the image: before anything is written
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KitError(f"cannot create {out_dir}: {e.strerror}", field="--output-dir") from None
    check_output_dir(out_dir)
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
            path.chmod(0o700 if name.endswith(".sh") else 0o600)
        _write_tasks(job, tmp)
        if job.snapshot is not None and not dry_run:
            snapshots.materialize(job.snapshot, JobDir(tmp).code, tmp / JobDir.CODE_LIST)
        # job.json holds --env's and --notify's values: its user's alone, whatever the directory becomes.
        files.create(tmp / JobDir.SPEC, json.dumps(spec_record(job), indent=2, sort_keys=True) + "\n", mode=0o600)
        files.create(tmp / JobDir.SBATCH, json.dumps(argv, indent=2) + "\n", mode=0o600)
        os.rename(tmp, final)
    except OSError as e:
        files.remove_tree(tmp)
        raise KitError(
            f"cannot write the job directory {final}: {e.strerror}",
            field="--output-dir",
            exit_code=1,
            hint="nothing was written or submitted; free space or choose another --output-dir",
        ) from None
    except BaseException:
        files.remove_tree(tmp)
        raise
    return PreparedJob(job=job, job_dir=final, sbatch_argv=argv, srun_argv=the_step.argv(final))


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


def _made_by_the_prolog(targets: Path) -> bool:
    """A per-user targets directory whose parent only root writes (0755, root's): the cluster's Prolog makes it,
    the user's own, before the job's first step (kit's local cluster; a site may do the same)."""
    try:
        st = targets.parent.stat()
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022 and os.geteuid() != 0


def submit(prepared: PreparedJob, target: slurm.Target) -> PreparedJob:
    """Submit with sbatch --parsable; on failure the job directory is removed."""
    s = prepared.job.spec
    try:
        if prepared.job.image and s.prometheus_targets and s.exporter:
            # pyxis mounts it into the container: it must exist when the job starts. A user's directory in
            # one only root writes (the local cluster's targets) is the job's Prolog's to make.
            try:
                Path(s.prometheus_targets).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                if not (isinstance(e, PermissionError) and _made_by_the_prolog(Path(s.prometheus_targets))):
                    raise KitError(
                        f"cannot create {s.prometheus_targets}: {e.strerror}",
                        field="--prometheus-targets",
                        hint="give a directory Prometheus reads (file_sd) that this user can create",
                    ) from None
        job_id = slurm.submit(target, prepared.sbatch_argv)
    except BaseException:
        files.remove_tree(prepared.job_dir)
        raise
    prepared.job_id = job_id
    # job_id first (it marks a submitted job), then which Slurm has it (for kit ps/logs/cancel).
    try:
        files.write_atomic(prepared.job_dir / JobDir.JOB_ID, job_id + "\n")
        files.write_atomic(
            prepared.job_dir / JobDir.SLURM, json.dumps({"target": target.name, "conf": target.conf}) + "\n"
        )
    except OSError as e:
        raise KitError(
            f"job {job_id} was submitted and runs, but its record in {prepared.job_dir} could not be "
            f"written: {e.strerror}",
            exit_code=1,
            hint=f"free space there; scancel {job_id} stops it",
        ) from None
    job_index.remember(prepared.job_dir)
    return prepared
