"""Which Slurm to talk to (the site's, or kit's local cluster through its ``SLURM_CONF``),
and the Slurm facts every room shares: its terminal states and its per-task variables."""

from __future__ import annotations

from dataclasses import dataclass

from kit.runner import run

# Slurm's per-task variables -> the names torch.distributed, torchrun-style
# scripts and Lightning read. The launcher exports each one from its source.
RANK_MAPPING: tuple[tuple[str, str], ...] = (
    ("RANK", "SLURM_PROCID"),
    ("LOCAL_RANK", "SLURM_LOCALID"),
    ("WORLD_SIZE", "SLURM_NTASKS"),
    ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"),
    ("NODE_RANK", "SLURM_NODEID"),
    ("GROUP_RANK", "SLURM_NODEID"),
)

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
# Slurm 22.05's other job states (squeue(1) JOB STATE CODES): a job between submission and its end.
LIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "RESV_DEL_HOLD",
        "REVOKED",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STAGE_OUT",
        "STOPPED",
    }
)


@dataclass(frozen=True)
class Target:
    """Which Slurm to use: ``conf`` is a slurm.conf path (None: the site default)."""

    conf: str | None = None
    name: str = "site"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.conf} if self.conf else {}

    def run(self, argv: list[str], **kw):
        return run(argv, env=self.env, **kw)
