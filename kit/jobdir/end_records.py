"""How a job ended, as its directory keeps it: the FINISHED marker (the work's own word), ``outcome.json`` (the end
Slurm gave, kept by kit.job.settle before Slurm forgets it), ``cancelled.json`` (who cancelled it and why), and the
end they tell together once Slurm has forgotten the job (:func:`recorded_state`)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from kit import files
from kit.errors import KitError
from kit.jobdir import JobDir
from kit.jobdir.records import array_job_dir, last_run


def finished(job_dir: Path) -> bool:
    """The FINISHED marker is there (see :func:`work_finished` for what it means)."""
    return (Path(job_dir) / JobDir.FINISHED).exists()


OUTCOME_RECORD = JobDir.OUTCOME


def keep_outcome(job_dir: Path, state: str, told: dict | None = None) -> None:
    """Record the end state Slurm gave the job (``outcome.json``), so that once Slurm
    forgets it kit tells the same end (a requeued job's later end replaces it); with ``told`` (the end as
    ``--wait`` tells it: exit_code, meaning, restarts) that too, for the report. Only in a directory of the
    caller's own."""
    path = Path(job_dir) / OUTCOME_RECORD
    try:
        if os.stat(job_dir).st_uid != os.geteuid():
            return
        try:
            kept = files.read_json(path, 4096)
            if kept.get("state") == state and (told is None or "meaning" in kept):
                return
        except (OSError, ValueError, AttributeError):
            pass
        record = {"state": state, "time": round(time.time(), 3), **(told or {})}
        files.write_atomic(path, json.dumps(record) + "\n")
    except OSError:
        pass  # a read-only or full directory: the end is still told from the rest of it


def kept_outcome(job_dir: Path) -> dict | None:
    """``outcome.json`` as :func:`keep_outcome` writes it (its state a word of Slurm's: A-Z and _), else None."""
    try:
        kept = files.read_json(Path(job_dir) / OUTCOME_RECORD, 4096)
    except (OSError, ValueError):
        return None
    state = kept.get("state") if isinstance(kept, dict) else None
    return kept if isinstance(state, str) and re.fullmatch(r"[A-Z_]{1,20}", state) else None


def recorded_state(job_dir: Path) -> str:
    """A job's end as its directory tells it (for a job the scheduler has
    forgotten): what Slurm said at its end when kit saw it (``outcome.json``);
    else COMPLETED only with the FINISHED marker."""
    kept = kept_outcome(job_dir)
    if kept is not None:
        return kept["state"]
    if finished(job_dir):
        return "COMPLETED" if work_finished(job_dir) else "FAILED"
    if cancelled(job_dir):
        return "CANCELLED"
    last = last_run(job_dir)
    return "FAILED" if last and last.end in ("failed", "hang", "incomplete") else "ENDED"


def work_finished(job_dir: Path) -> bool:
    """The FINISHED marker, and the run that ended with it exited 0: a rank can still
    fail after the trainer marked the work done (Slurm then says FAILED, and so does kit)."""
    if not finished(job_dir):
        return False
    last = last_run(job_dir)
    return last is None or last.exit_code in (0, None)


CANCEL_RECORD = JobDir.CANCELLED


def record_cancel(job_dir: Path, reason: str | None, tasks: list[int] | None = None) -> dict:
    """Who cancelled the job, when and why, in the job directory (before the
    cancel); for an array job, which ``tasks`` were still to end."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry for this uid
        user = str(os.getuid())
    rec = {"by": user, "host": socket.gethostname(), "time": round(time.time(), 3), "reason": reason or ""}
    if tasks is not None:
        rec["tasks"] = sorted(tasks)
    try:
        files.write_atomic(job_dir / CANCEL_RECORD, json.dumps(rec, indent=2) + "\n")
    except OSError as e:
        raise KitError(
            f"cannot write the cancel record in {job_dir}: {e.strerror}",
            field="JOB",
            exit_code=1,
            hint="nothing was cancelled; scancel still works",
        ) from None
    return rec


def cancelled(job_dir: Path) -> bool:
    """Did ``kit cancel`` end this job, or this task of an array job (one the
    array's record names as still to end)?"""
    if (job_dir / CANCEL_RECORD).exists():
        return True
    array = array_job_dir(job_dir)
    if array is None:
        return False
    try:
        rec = files.read_json(array / CANCEL_RECORD)
    except (OSError, ValueError):
        return (array / CANCEL_RECORD).exists()  # there, but damaged: a cancel happened
    tasks = rec.get("tasks") if isinstance(rec, dict) else None
    return not isinstance(tasks, list) or int(Path(job_dir).name) in tasks
