"""The one act on a job whose end a command has seen: Slurm's final state kept in its directory
(``outcome.json``: told the same once Slurm forgets the job) and what its batch script could not send
(``--notify``) handed on, each event once (the ledger).

Reading a job has no effects: ``Job.state()``, `kit ps`'s rows, `kit events`, `kit logs` and `kit ui`'s pages
only read. The commands that see an end act here, where they see it: `kit launch --wait` and ``Job.wait()``
(:func:`observe`), `kit ps`, `kit events` and `kit report` (:func:`settle`). `kit ui` says it is read-only and
never does. Settling twice changes nothing: a kept state is not written again, a sent event not sent again.
"""

from __future__ import annotations

from pathlib import Path

from kit import slurm
from kit.core import outcome
from kit.jobdir import end_records


def settle(job_dir: str | Path, state: str | None = None, told: outcome.Outcome | None = None, wait: bool = False):
    """``job_dir``'s end seen: ``state`` (Slurm's final one; None when Slurm gave none, as for a job it forgot)
    kept with what it means (``told``), and the events its batch script could not send handed to a sender of
    their own (``wait``: sent from here, before this returns)."""
    from kit.notify import deliver

    if state is not None and state in slurm.TERMINAL_STATES:
        kept = None if told is None else {k: getattr(told, k) for k in ("exit_code", "meaning", "restarts")}
        end_records.keep_outcome(Path(job_dir), state, kept)
    if wait:
        deliver.catch_up(job_dir)
    else:
        deliver.tell_pending([job_dir])


def observe(end: slurm.JobStatus, job_dir: str | Path) -> outcome.Outcome:
    """What an end a wait saw means (:func:`kit.slurm.job_outcome`, with the work's own record of being finished),
    settled. ``kit launch --wait``, ``Job.wait`` and an array's tasks all end here."""
    told = slurm.job_outcome(end, Path(job_dir), end_records.work_finished(Path(job_dir)))
    if end.state != "GONE":
        settle(job_dir, end.state, told, wait=True)
    return told


def settle_rows(rows) -> None:
    """`kit ps`'s rows seen: each ended job settled (its state kept when Slurm gave it)."""
    for row in rows:
        if not row.active:
            settle(row.unit_dir, row.state if row.state_from == "slurm" else None)
