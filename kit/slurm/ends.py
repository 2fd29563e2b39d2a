"""What the end of a job means: Slurm's final state and the job directory's record of its work (the outcome
table, kit.core.outcome). Keeping it is an act of the job room's (:mod:`kit.job.settle`)."""

from __future__ import annotations

import signal
from pathlib import Path

from kit.core import outcome
from kit.jobdir import JobDir, end_records
from kit.slurm.status import JobStatus

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
    if finished is None:  # the marker alone (the caller may know better: kit.jobdir.end_records.work_finished)
        finished = job_dir is not None and end_records.finished(job_dir)
    if st.state == "COMPLETED":
        code = outcome.FINISHED if finished else outcome.INCONSISTENT
    elif st.state == "FAILED":
        code = st.exit_code or outcome.INCONSISTENT
    elif st.state == "GONE":
        code = outcome.FINISHED if finished else outcome.LOST
    else:
        code = _STATE_CODES.get(st.state, outcome.LOST)
    meaning = outcome.command_failed(code) if st.state == "FAILED" else outcome.MEANING[code]
    preflight = code == outcome.PREFLIGHT_FAILED  # no command ran, by design: the verdict stopped it
    if st.state == "FAILED" and job_dir is not None and not preflight and not _any_rank_ran(Path(job_dir), st.restarts):
        meaning = _never_started(code)
    if st.state == "CANCELLED" and st.reason == "DependencyNeverSatisfied":
        meaning = f"it never ran: its dependency can never be met ({st.dependency or 'see squeue'})"
    return outcome.Outcome(state=st.state, exit_code=code, meaning=meaning, restarts=st.restarts)


def _never_started(code: int) -> str:
    """A failed job no rank of whose last run started: a signal that ended the batch script (128+N) is named."""
    try:
        name = signal.Signals(code - 128).name if 128 < code < 128 + signal.NSIG else None
    except ValueError:
        name = None
    why = f"the batch script ended by {name}" if name else "srun, its MPI plugin or the container failed"
    return (
        f"the job step never started (exit code {code}): {why} before any rank ran; `kit logs JOB --errors` "
        "shows the batch log's end"
    )


def _any_rank_ran(job_dir: Path, run: int) -> bool:
    """Whether a rank of the run started (a launcher's task record or exit record)."""
    d = JobDir(job_dir)
    return bool(d.exit_records(run)) or any(d.run_progress(run).glob(JobDir.TASK.format(rank="*")))
