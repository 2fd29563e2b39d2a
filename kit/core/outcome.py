"""How a job ended, in words and in one exit code per kind of end.

The table every part of kit agrees on: prelaunch.sh exits with the codes it
decides itself (retry budget spent, no progress, hang), and ``kit launch
--wait`` turns the scheduler's final state into one of these. 0 only ever
means the work finished; a command that failed by itself gives its own code.
docs/endings.md's outcome table is this table.
"""

from __future__ import annotations

from dataclasses import dataclass

FINISHED = 0
LOST = 69  # the scheduler no longer knows the job (or was unreachable too long) and it did not finish
INCONSISTENT = 70  # success reported (srun's 0, or COMPLETED) that not every rank confirms: not finished
BUDGET_SPENT = 75  # stopped by the time limit's warning (or requeued by Slurm) with no restart left
NO_PROGRESS = 76  # two runs in a row ended without the checkpoint step advancing
HUNG = 77  # a rank stopped making progress and no restart was left
NODE_FAILED = 78  # a node failed and the job was not requeued
TIME_LIMIT = 79  # killed at the time limit (the warning was not acted on)
CANCELLED = 80  # cancelled: before it started, while starting or while running
PREEMPTED = 81  # preempted and not requeued
OUT_OF_MEMORY = 82  # the scheduler's out-of-memory state (cgroup limit)
PREFLIGHT_FAILED = 83  # a node failed its preflight (--preflight) and no restart was left
UNTRUSTED_DIR = 84  # the job directory, or the one it sits in, was not its user's alone: nothing in it was run

# Codes prelaunch.sh decides itself (rendered into it, one definition).
PRELAUNCH_CODES = {
    "BUDGET_SPENT": BUDGET_SPENT,
    "NO_PROGRESS": NO_PROGRESS,
    "HUNG": HUNG,
    "INCOMPLETE": INCONSISTENT,
    "PREFLIGHT": PREFLIGHT_FAILED,
}

MEANING = {
    FINISHED: "the work finished",
    LOST: "the scheduler lost track of the job before it finished",
    INCONSISTENT: "a success was reported that not every rank confirms: the work is not finished",
    BUDGET_SPENT: "stopped before finishing: the retry budget is spent",
    NO_PROGRESS: "stopped requeueing: two runs in a row ended without the checkpoint step advancing",
    HUNG: "a rank stopped making progress (hang) and the retry budget is spent",
    NODE_FAILED: "a node failed and the job was not requeued",
    TIME_LIMIT: "killed at the time limit",
    CANCELLED: "cancelled",
    PREEMPTED: "preempted and not requeued",
    OUT_OF_MEMORY: "out of memory",
    PREFLIGHT_FAILED: "a node failed its preflight check before the command started and no restart was left",
    UNTRUSTED_DIR: "the job directory, or the one it sits in, was not its user's alone: nothing in it was run",
}


@dataclass(frozen=True)
class Outcome:
    """The end of a job: the scheduler's final state, kit's exit code and what it means."""

    state: str
    exit_code: int
    meaning: str
    restarts: int = 0

    def describe(self) -> str:
        restarts = f" after {self.restarts} restart(s)" if self.restarts else ""
        return f"ended {self.state}{restarts}: {self.meaning} (exit code {self.exit_code})"


def command_failed(code: int) -> str:
    """The meaning of a failed job's code: one prelaunch decided, or the command's own."""
    if code in PRELAUNCH_CODES.values() or code == UNTRUSTED_DIR:
        return MEANING[code]
    return f"the command failed with exit code {code}"
