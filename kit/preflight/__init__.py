"""Preflight: every node of a job checked before its first step (``kit launch --preflight``, ``kit check nodes``).

``health.py`` (the GPUs through NVML: lost, missing, ECC, row remapping, hardware slowdown, Xids), ``burn.py``
(matrix products on each GPU or the CPUs), ``verdict.py`` (a node's record, the verdict over all nodes);
``python -m kit.preflight node|judge`` is what the launcher runs on the nodes.
"""

from kit.preflight.health import FATAL_XIDS, Finding, check_gpus
from kit.preflight.verdict import check_node, decide, judge, records

__all__ = ["FATAL_XIDS", "Finding", "check_gpus", "check_node", "decide", "judge", "records"]
