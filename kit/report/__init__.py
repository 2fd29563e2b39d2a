"""`kit report`: what a job used of what it held, as a PNG, a summary and notes.

Panels only for what was measured (GPU utilisation, memory and power when GPUs were seen; the job's CPU and memory
per node; loss, step time and throughput per rank), restarts marked on the time axis; notes in the manner of
Princeton's jobstats, each with its threshold, and every number they use in ``report.json``. Data comes from
Prometheus when it is reachable (the local cluster's, or ``--prometheus URL``), and from the per-node JSONL metrics
logs in the job directory otherwise (:mod:`~kit.report.series`), so a job can be analysed with no Prometheus at
all; :mod:`~kit.report.summary` its numbers and notes, :mod:`~kit.report.plot` its picture, :mod:`~kit.report.job`
the whole.
"""

from kit.report.job import TASK_HEADER, TaskSummary, TaskTable, report, report_job, report_tasks
from kit.report.plot import NoPicture, picture_suffix
from kit.report.series import Logs
from kit.report.summary import MIN_SECONDS, Summary

__all__ = [
    "Logs",
    "MIN_SECONDS",
    "NoPicture",
    "Summary",
    "TASK_HEADER",
    "TaskSummary",
    "TaskTable",
    "picture_suffix",
    "report",
    "report_job",
    "report_tasks",
]
