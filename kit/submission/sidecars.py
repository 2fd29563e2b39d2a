"""The node's sidecars: what local rank 0 starts beside the training.

One table. Each entry is a name, a program that must be on PATH for it to
start (None: always), and the bash command that runs it; the command sees
``KIT_NODE_LOG_PREFIX`` (``<job>/logs/<node>.r<restart>``) and the job's
variables. The launcher starts each in its own process group and stops it
when the task ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.core.sidecar import sidecar_name
from kit.jobdir import JobDir


@dataclass(frozen=True)
class Sidecar:
    name: str
    command: str
    requires: str | None = None


# The Prometheus exporter: GPU, node and training metrics, a file_sd target
# file when $KIT_PROMETHEUS_TARGETS is set, and a JSONL log next to the others.
# It runs at nice 19: it watches the training and must yield to it, yet keep
# answering on a node whose cores the job keeps busy. (SCHED_IDLE was tried: on
# 2 cores kept busy by 2 processes it did not serve one scrape in 40 s; at nice 19
# it served from 14 s on, p50 117 ms; at nice 0 from 1 s, p50 5 ms.) Its session's
# scheduling group gets nice 10 before Python starts (kit::yield_cpu: a nice weighs
# only inside its group). Measured on 2 cores kept busy by one group of 2
# processes, a scrape a second for 25 s: group nice 10 served its first scrape
# 1.0 s after its start, p50 5 ms (0: 1.0 s, 4 ms; 19: 3.0 s, 27 ms). bench_scale,
# 8 -> 64 nodes sharing 2 cores: kit's own start growth +15.7 ms per node (without
# the exporter +11.1); with the group left at nice 0 (Python's own check of its
# session missed the sidecar shell's, which leads it) +31.6.
EXPORTER = Sidecar(
    "exporter",
    'kit::yield_cpu 10; exec nice -n 19 "${KIT_PYTHON:-python3}" -m kit.monitor --port "${KIT_EXPORTER_PORTS}" '
    f'--log "${{KIT_NODE_LOG_PREFIX}}{JobDir.METRICS_SUFFIX}" --exit-with-parent',
)
BUILTIN: tuple[Sidecar, ...] = (
    # GPU utilisation log, the role of the seeds' `nvidia-smi dmon` .gutil files.
    Sidecar(
        "gpu-dmon",
        "exec nvidia-smi dmon --delay 15 --select pumt --options DT "
        f'--filename "${{KIT_NODE_LOG_PREFIX}}{JobDir.GPU_DMON_LOG.removeprefix(JobDir.NODE_LOG)}"',
        requires="nvidia-smi",
    ),
)


def for_job(user_hooks: list[str], exporter: bool = True) -> list[Sidecar]:
    """The built-in sidecars (and the exporter) plus the job's own ``--sidecar`` commands."""
    return (
        list(BUILTIN)
        + ([EXPORTER] if exporter else [])
        + [Sidecar(*sidecar_name(cmd, i)) for i, cmd in enumerate(user_hooks, 1)]
    )


def as_words(sidecars: list[Sidecar]) -> list[str]:
    """Three words per sidecar, as the launcher's KIT_SIDECARS array holds them."""
    words: list[str] = []
    for s in sidecars:
        words += [s.name, s.requires or "", s.command]
    return words
