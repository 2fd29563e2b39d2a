"""The job directory's files that the training side writes and kit's readers read.

(The first piece of the one owner of the job directory's layout; see the
README's "The job directory".) Light on purpose: the reference trainer, a
plain script's ``kit.train.progress`` calls and the exporter all import it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kit import files


RANK_METRICS_GLOB = "rank-*.json"


def rank_of_metrics_file(name: str) -> int | None:
    """The rank whose metrics file is named ``name`` (None: not one)."""
    m = re.fullmatch(r"rank-(\d+)\.json", name)
    return int(m.group(1)) if m else None


def rank_metrics_path(directory: str | Path, rank: int) -> Path:
    """One rank's training metrics file in ``$KIT_METRICS_DIR`` (``metrics/<node>/``)."""
    return Path(directory) / f"rank-{rank}.json"


def write_rank_metrics(directory: str | Path, rank: int, values: dict) -> None:
    """Atomically (re)write one rank's training metrics (the exporter and kit ps read them)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    files.write_atomic(rank_metrics_path(directory, rank), json.dumps({"rank": rank, **values}))
