"""Which job directory a command's JOB names: a directory, a job id (``ID_TASK`` for an array task) under an
output directory, or a name (``--job-name``) that is one of the user's jobs."""

from __future__ import annotations

import os
from pathlib import Path

from kit import files, jobdir
from kit.errors import KitError
from kit.jobdir import JobDir
from kit.jobdir.job_index import known_job_dirs
from kit.jobdir.records import job_id_of, job_name


def find_job_dir(job: str, output_dir: str | Path) -> Path:
    """``job`` as a job directory, or a job id looked up under ``output_dir``;
    an array task's ``ID_TASK`` names its task directory."""
    job_dir = Path(job)
    if job_dir.is_dir():
        return job_dir
    if "/" in job:  # a path (a job id has none)
        raise KitError(f"no such job directory: {job}", field="JOB")
    array_id, sep, task = job.partition("_")
    if sep and array_id.isdigit() and task.isdigit():
        task_dir = JobDir(find_job_dir(array_id, output_dir)).task(int(task)).path
        if not task_dir.is_dir():
            raise KitError(
                f"job {array_id} has no task {task}", field="JOB", hint="kit ps lists the tasks of an array job"
            )
        return task_dir
    matches = []
    for p in Path(output_dir).glob(f"*/{JobDir.JOB_ID}"):
        try:
            if files.read_text(p, 64).strip() == job:
                matches.append(p.parent)
        except OSError:
            continue
    mine = [m for m in matches if jobdir.owner(m) == os.geteuid()]
    matches = mine or matches  # in a shared output directory anyone may write a directory naming any id
    if not matches and not job.isdigit():
        return _by_name(job, output_dir)
    return _one(
        sorted(matches),
        f"no job directory for job {job} under {output_dir}",
        "give the job directory itself, or --output-dir where it lives",
        f"job id {job} names {len(matches)} job directories under {output_dir}",
        str,
        "give the job directory itself",
    )


def _by_name(name: str, output_dir: str | Path) -> Path:
    """The one job of the user's (kit's index, and ``output_dir``) named ``name`` (``--job-name``)."""
    named = [d for d in known_job_dirs([Path(output_dir)]) if jobdir.owner(d) == os.geteuid() and job_name(d) == name]
    return _one(
        named,
        f"no job with id or name {name!r} (under {output_dir}, or among the jobs kit submitted for you)",
        "kit ps --all lists them; give a job id, a job directory, or --output-dir where it lives",
        f"{len(named)} of your jobs are named {name!r}",
        lambda d: f"{job_id_of(d) or '?'}  {d}",
        "give the job id or its directory (newest first above)",
    )


def _one(found: list[Path], none: str, none_hint: str, many: str, shown, many_hint: str) -> Path:
    """The one directory ``found``, else the error for none or for many (each shown)."""
    if not found:
        raise KitError(none, field="JOB", hint=none_hint)
    if len(found) > 1:
        raise KitError(many, field="JOB", detail="\n".join(shown(d) for d in found), hint=many_hint)
    return found[0]
