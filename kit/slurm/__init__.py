"""Everything kit knows about Slurm: option composition, submission, job state.

:class:`Target` names which Slurm to talk to (the site's, or kit's local
cluster through its ``SLURM_CONF``); every Slurm command goes through
:func:`kit.runner.run` with that target's environment. The package's face;
behind it ``target.py`` (Target, terminal states, the per-task variables),
``commands.py`` (sbatch and srun options, the checks before submitting,
submit and cancel), ``status.py`` (a job's state, waiting), ``ends.py`` (what an end means),
``pyxis.py`` (pyxis's flags) and ``convert.py`` (`kit convert`).
"""

from __future__ import annotations

from kit.slurm.commands import (
    cancel,
    check_after,
    check_fits,
    check_mpi,
    check_partition,
    check_stop_grace,
    kill_wait,
    mpi_types,
    partitions,
    pyxis_settings,
    sbatch_argv,
    slurm_config,
    srun_args,
    submit,
)
from kit.slurm.ends import job_outcome
from kit.slurm.status import (
    BUSY_PATIENCE,
    SETTLING_STATES,
    ArrayStates,
    ControllerUnreachable,
    JobStatus,
    State,
    array_status,
    follow,
    job_status,
    statuses,
    wait,
    wait_array,
)
from kit.slurm.target import LIVE_STATES, RANK_MAPPING, TERMINAL_STATES, Target

# fmt: off
__all__ = [
    "ArrayStates", "BUSY_PATIENCE", "LIVE_STATES", "RANK_MAPPING", "SETTLING_STATES", "TERMINAL_STATES",
    "ControllerUnreachable", "JobStatus", "State", "Target", "array_status", "cancel", "check_after", "check_fits",
    "check_mpi", "check_partition", "check_stop_grace", "follow", "job_outcome", "job_status", "kill_wait",
    "mpi_types", "partitions", "pyxis_settings", "sbatch_argv", "slurm_config", "srun_args", "statuses", "submit",
    "wait", "wait_array",
]
# fmt: on
