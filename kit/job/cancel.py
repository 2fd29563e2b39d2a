"""`kit cancel` and ``Job.cancel``: the job cancelled through its own Slurm, only when its directory and the job Slurm
knows by its id are one user's, a record of who, where, when and why written first (``cancelled.json``)."""

from __future__ import annotations

import os
from pathlib import Path

from kit import jobdir, slurm, targets
from kit.errors import KitError
from kit.jobdir import end_records, records


def cancel(job_dir: Path, reason: str | None = None) -> dict:
    """Cancel a job (every task of an array job), recording who and why in its directory
    (``cancelled.json``) before Slurm is asked; the record. KitError when it already ended."""
    job_id = records.submitted_id(job_dir)
    target = targets.target_of(job_dir)
    _same_owner(target, job_dir, job_id)
    from kit.job import logs as joblogs  # (here: kit launch imports this module, and needs none of it)

    now = joblogs.unit_states(target, job_dir, job_id)
    end = joblogs.ended(now)
    if end:
        raise KitError(f"job {job_id} already ended ({end}): nothing to cancel", field="JOB", exit_code=1)
    rec = end_records.record_cancel(
        job_dir,
        reason,
        tasks=None if now.keys() == {None} else [i for i, state in now.items() if not joblogs.final(state)],
    )
    slurm.cancel(target, job_id)
    return rec


def _same_owner(target: slurm.Target, job_dir: Path, job_id: str) -> None:
    """A job directory of another user's names whatever id its owner wrote in it: acting on it (root's
    ``kit cancel DIR``) is for that owner's job alone."""
    owner = jobdir.owner(job_dir)
    if owner == os.geteuid():
        return
    base = job_id.partition("_")[0]  # an array task's: the array's owner
    user = slurm.statuses(target, [base]).get(base)
    if user is None or user.user_id != owner:
        theirs = (
            "no job Slurm knows" if user is None or user.user_id is None else f"{jobdir.owner_name(user.user_id)}'s job"
        )
        raise KitError(
            f"{job_dir} is {jobdir.owner_name(owner)}'s, and job {job_id} is {theirs}: not acted on",
            field="JOB",
            hint="a job directory names whatever id its owner wrote there: give the job's own directory",
        )
