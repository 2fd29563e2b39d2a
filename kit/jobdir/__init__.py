"""The job directory: its one owner (docs/job-directory.md).

:class:`JobDir` names every file (``layout.py``); the training side's files (``metrics.py``), the task starts
(``starts.py``), whose files are and what is loaded only from its owner (``trust.py``), the runs' trackers and hangs
(``runs.py``); :mod:`kit.jobdir.records` reads a submitted job back and writes the records the commands keep. Light
on purpose: the reference trainer, a plain script's ``kit.train.progress`` calls and the exporter all import this
package, and it imports only the bottom layer.
"""

from kit.jobdir.layout import JobDir
from kit.jobdir.metrics import (
    RANK_METRICS_GLOB,
    last_polls,
    rank_metrics_path,
    rank_of_metrics_file,
    read_rank_metrics,
    write_rank_metrics,
)
from kit.jobdir.runs import hangs, tracker_runs
from kit.jobdir.starts import MODES, all_task_starts, read_task_record, task_starts
from kit.jobdir.trust import function_payloads, own, owner, owner_name, read_own

__all__ = [
    "JobDir",
    "MODES",
    "RANK_METRICS_GLOB",
    "all_task_starts",
    "function_payloads",
    "hangs",
    "last_polls",
    "own",
    "owner",
    "owner_name",
    "rank_metrics_path",
    "rank_of_metrics_file",
    "read_own",
    "read_rank_metrics",
    "read_task_record",
    "task_starts",
    "tracker_runs",
    "write_rank_metrics",
]
