"""Turning a job spec into a job directory and an sbatch submission.

:func:`plan` resolves and checks a spec once and returns a frozen value (what is decided after the check: the pinned
image, the checked dependencies, the code snapshot, are its own fields; :mod:`~kit.submission.plan`).
:func:`prepare` validates nothing itself (give it a plan's :class:`ResolvedJob`); it writes the job directory
atomically: ``prelaunch.sh``, ``launcher.sh`` and what they source as kit ships them, with the job's values in
``job.env`` (:mod:`~kit.submission.scripts`), ``job.json`` (the resolved spec)
and ``sbatch.json``; :func:`submit` hands it to sbatch and records the job id (:mod:`~kit.submission.write`).
"""

from kit.submission.plan import Plan, Rerun, pin_code_and_image, plan, resolve, resolve_after
from kit.submission.scripts import (
    SHIPPED,
    Step,
    container_setup,
    job_env,
    job_values,
    render_scripts,
    start_dir,
    step,
)
from kit.submission.write import PreparedJob, prepare, spec_record, submit

__all__ = [
    "Plan",
    "PreparedJob",
    "Rerun",
    "SHIPPED",
    "Step",
    "container_setup",
    "pin_code_and_image",
    "plan",
    "job_env",
    "job_values",
    "prepare",
    "render_scripts",
    "resolve",
    "resolve_after",
    "spec_record",
    "start_dir",
    "step",
    "submit",
]
