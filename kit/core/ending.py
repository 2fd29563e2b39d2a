"""How a run of a job ended: the one rule, as a table.

The batch script (prelaunch.sh) must act on a run's end where it happens — requeue the job, write
FINISHED, exit with the job's code — and it runs where kit's Python may not be (a container job's
batch step runs on the node's own system). So the rule is data: :data:`ENDINGS`, rows in order,
the first whose facts all hold decides. kit renders the rows into prelaunch.sh (:func:`as_bash`);
bash gathers the run's facts (kit::_run_facts) and applies the first row that matches
(kit::conclude); :func:`conclude` here reads the same rows for the same facts (a test holds the
two to one answer for every combination of facts).

What the job as a whole ended as — Slurm's final state with the run's record — is
:func:`kit.slurm.ends.job_outcome`, which reads what this table made prelaunch write
(``runs.jsonl``'s ``end``, the FINISHED marker, the exit code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# The facts of a run's end, each 0 or 1, as kit::_run_facts prints them.
FLAGS = ("preflight", "hang", "declared", "straggler", "warned", "stopping", "function", "all_done", "restart_failed")
FACT_MEANING = {
    "preflight": "the preflight verdict failed a node before any command started (--preflight)",
    "hang": "the hang watchdog stopped the step (its report is there)",
    "declared": "the work was declared finished (FINISHED, or every rank through kit.train.progress.finished())",
    "straggler": "prelaunch warned the command to stop for a straggler (--on-straggler requeue)",
    "warned": "the time-limit warning came during the run",
    "stopping": "a stop signal came (cancel, requeue, preemption, the time limit)",
    "function": "a function job (kit.submit, kit.map): finished only when every rank returned",
    "all_done": "every rank's command ended by itself with 0",
    "restart_failed": "the job restarts a failed command (--on-failure restart) while restarts are left",
}
# The step's exit code (the first failing rank's): 0, a command's own (1-128), or a signal's (> 128).
RC = ("zero", "own", "signal")


@dataclass(frozen=True)
class Ending:
    """One row: when ``when``'s facts all hold, the run ended as ``end`` (runs.jsonl's word).

    ``code`` is the job's exit code, the first of its words that gives one: ``rc`` (the step's),
    a number, a name of :data:`kit.core.outcome.PRELAUNCH_CODES`, ``refusal`` (the code a refused
    requeue gave: NO_PROGRESS), ``first_failure`` (the first rank that failed by itself). With
    ``requeue`` (its reason) the job is requeued when the budget allows, and ``code`` is its exit
    code otherwise. ``mark``: write FINISHED; ``teardown``: record the step's code as a failure
    after the work was finished (the run's own code is then 0); ``suspect``: leave the node the hang
    report names, the nodes the preflight failed, or the straggler's) out of the next run. ``says``: the batch log's
    line ({rc}, {hang_dir}, {preflight} — the verdict's why —, {straggler} — the straggler verdict — filled)."""

    when: tuple[tuple[str, str], ...]
    end: str
    code: str
    says: str = ""
    requeue: str = ""
    mark: bool = False
    teardown: bool = False
    suspect: bool = False

    def row(self) -> str:
        """The row as prelaunch.sh reads it: ``when|end|code|flags|requeue|says``."""
        flags = " ".join(f for f in ("mark", "teardown", "suspect") if getattr(self, f))
        fields = (" ".join(f"{k}={v}" for k, v in self.when), self.end, self.code, flags, self.requeue, self.says)
        assert not any("|" in f or "\n" in f for f in fields), self
        return "|".join(fields)


def _when(**facts: object) -> tuple[tuple[str, str], ...]:
    return tuple((k, str(v)) for k, v in facts.items())


FINISHED_SAYS = "step ended with exit 0; the work is finished"

ENDINGS: tuple[Ending, ...] = (
    # No command ran: the nodes the verdict failed are left out of the next run.
    Ending(
        _when(preflight=1),
        "preflight",
        "refusal PREFLIGHT",
        suspect=True,
        says="no command started: the preflight failed {preflight}",
        requeue="a node failed its preflight",
    ),
    Ending(
        _when(hang=1),
        "hang",
        "refusal HUNG",
        suspect=True,
        says="the step ended after a hang: every rank's stacks are in {hang_dir}",
        requeue="the step was stopped because a rank made no progress",
    ),
    # The command said its work is done. A rank that then died of a signal (torch's teardown
    # aborts now and then: 134) is told, but the work stays finished and the job ends COMPLETED,
    # so that what waits for it (--after) runs; a code of the command's own (a wrapper's next
    # stage failed) still fails the job.
    Ending(_when(declared=1, rc="zero"), "finished", "0", FINISHED_SAYS, mark=True),
    Ending(
        _when(declared=1, rc="signal"),
        "finished",
        "0",
        mark=True,
        teardown=True,
        says="step ended with exit {rc} (a signal) after its work was declared finished: a failure in "
        "teardown; the work is finished: exiting 0",
    ),
    Ending(
        _when(declared=1),
        "failed",
        "rc",
        "step ended with exit {rc} after the work was declared finished: a command failed after it",
    ),
    # --on-straggler requeue: prelaunch warned the command (a restart was left) for a rank named a straggler; the
    # work is not done, whatever the command then exited with, and the straggler's node sits out the next run.
    Ending(
        _when(straggler=1),
        "straggler",
        "refusal first_failure BUDGET_SPENT",
        suspect=True,
        says="the step was stopped: {straggler}",
        requeue="a rank was named a straggler",
    ),
    # Warned, but no command was given the signal or stopped: it ended its work by itself (a function
    # job's rank only by returning: declared above).
    Ending(
        _when(warned=1, rc="zero", all_done=1, function=0),
        "finished",
        "0",
        mark=True,
        says="step ended with exit 0 after the warning, every command by itself; the work is finished",
    ),
    # After the warning: requeued if it may be; else stopped before the work was done: never report
    # success, and blame no command for the signal kit or Slurm stopped it with.
    Ending(
        _when(warned=1),
        "warned",
        "refusal first_failure BUDGET_SPENT",
        requeue="step ended with exit {rc} after the warning",
    ),
    Ending(
        _when(stopping=1, rc="zero"),
        "stopped",
        "143",
        "step ended with exit {rc} after a stop signal; the work is not finished",
    ),
    Ending(
        _when(stopping=1), "stopped", "rc", "step ended with exit {rc} after a stop signal; the work is not finished"
    ),
    Ending(
        _when(function=1, rc="zero"),
        "incomplete",
        "INCOMPLETE",
        "srun exited 0, but not every rank returned from the function (a rank exited without returning): "
        "the work is not finished",
    ),
    Ending(_when(rc="zero", all_done=1), "finished", "0", FINISHED_SAYS, mark=True),
    Ending(
        _when(rc="zero"),
        "incomplete",
        "INCOMPLETE",
        "srun exited 0, but not every rank's command ended with 0 by itself (a node failed, or a task was "
        "killed): the work is not finished",
    ),
    # --on-failure restart: a command failed by itself; the next run starts from the last checkpoint (in the
    # allocation, the first failed rank's node left out where a spare takes its place) while restarts are left.
    Ending(
        _when(restart_failed=1),
        "failed",
        "rc",
        "step ended with exit {rc}",
        requeue="a command failed (exit {rc})",
        suspect=True,
    ),
    Ending((), "failed", "rc", "step ended with exit {rc}"),
)


def rc_class(rc: int) -> str:
    """The step's exit code as the table reads it."""
    return "zero" if rc == 0 else "signal" if rc > 128 else "own"


def conclude(facts: Mapping[str, str]) -> Ending:
    """The row that decides a run with these facts (``{"hang": "0", …, "rc": "zero"}``)."""
    for ending in ENDINGS:
        if all(facts.get(k) == v for k, v in ending.when):
            return ending
    raise AssertionError("the last row of ENDINGS matches every run")


def as_bash() -> list[str]:
    """The rows, one string each, for prelaunch.sh's KIT_ENDINGS array."""
    return [e.row() for e in ENDINGS]
