"""Two spellings of the same metrics: clean Prometheus names on the wire, the
drop-in names of node_exporter and dcgm-exporter in Prometheus's storage.

node_exporter names memory fields after /proc/meminfo
(``node_memory_MemAvailable_bytes``) and dcgm-exporter labels GPUs with
``modelName``; ``promtool check metrics`` flags both as camelCase. kit's
sources use the drop-in spelling (so does the per-node JSONL log). The exporter
serves, by default, the snake_case spelling, which promtool passes, and
:func:`relabel_configs` gives the ``metric_relabel_configs`` that turn it back
into the drop-in spelling at ingestion, so DCGM and node_exporter dashboards and
alert rules work unchanged. ``--naming compat`` serves the drop-in spelling
itself, for a Prometheus whose scrape config kit does not write.
"""

from __future__ import annotations

import json

# drop-in spelling -> what the exporter serves by default
METRICS: dict[str, str] = {
    "node_memory_MemTotal_bytes": "node_memory_mem_total_bytes",
    "node_memory_MemAvailable_bytes": "node_memory_mem_available_bytes",
}
LABELS: dict[str, str] = {"modelName": "model_name"}
NAMINGS = ("prometheus", "compat")


class Naming:
    """What the exporter renames on the way out (nothing, for ``compat``)."""

    def __init__(self, naming: str = "prometheus"):
        if naming not in NAMINGS:
            raise ValueError(f"naming must be one of {', '.join(NAMINGS)}, not {naming!r}")
        self.metrics = METRICS if naming == "prometheus" else {}
        self.labels = LABELS if naming == "prometheus" else {}


def relabel_configs() -> list[dict]:
    """Prometheus ``metric_relabel_configs`` that store the drop-in spelling."""
    rules: list[dict] = []
    for dropin, served in LABELS.items():
        rules.append({"source_labels": [served], "regex": "(.+)", "target_label": dropin})
        rules.append({"regex": served, "action": "labeldrop"})
    for dropin, served in METRICS.items():
        rules.append(
            {"source_labels": ["__name__"], "regex": served, "target_label": "__name__", "replacement": dropin}
        )
    return rules


def relabel_yaml(indent: int) -> str:
    """:func:`relabel_configs` as YAML lines (JSON flow style), ``indent`` spaces in."""
    return "".join(f"{' ' * indent}- {json.dumps(rule)}\n" for rule in relabel_configs())
