"""The training side's files: each rank's metrics line (its file, written atomically, read back by the exporter and kit ps)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from kit import files
from kit.jobdir.layout import JobDir

RANK_METRICS_GLOB = JobDir.RANK_METRICS.format(rank="*")


def rank_of_metrics_file(name: str) -> int | None:
    """The rank whose metrics file is named ``name`` (None: not one)."""
    m = re.fullmatch(re.escape(JobDir.RANK_METRICS).replace(r"\{rank\}", r"(\d+)"), name)
    return int(m.group(1)) if m else None


def rank_metrics_path(directory: str | Path, rank: int) -> Path:
    """One rank's training metrics file in ``$KIT_METRICS_DIR`` (``metrics/<node>/``)."""
    return Path(directory) / JobDir.RANK_METRICS.format(rank=rank)


def read_rank_metrics(text: str) -> dict[str, float | str] | None:
    """A rank's metrics file (``rank-<R>.json``): its numbers as floats (NaN and infinities
    kept: a diverged loss is news; booleans and numbers beyond a float dropped) and its
    ``rank`` as written (a string, "?" when missing); None when it is not a JSON object.
    The one parser: the exporter and ``kit ps`` both read through it."""
    try:
        data = files.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    out: dict[str, float | str] = {}
    for key, value in data.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                out[key] = float(value)
            except OverflowError:  # an integer beyond a float's range
                continue
    out["rank"] = str(data.get("rank", "?"))[:64]
    return out


def write_rank_metrics(directory: str | Path, rank: int, values: dict) -> None:
    """Atomically (re)write one rank's training metrics (the exporter and kit ps read them)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    files.write_atomic(rank_metrics_path(directory, rank), json.dumps({"rank": rank, **values}))


def newest_rank_metrics(job_dir: str | Path) -> dict[int, tuple[str, dict[str, float]]]:
    """Each rank's node and finite numbers from its newest metrics file (``metrics/<node>/rank-<R>.json``; a rank
    that moved node in a requeue left an older one behind); ``last_step_timestamp_seconds`` 0 where it has none."""
    newest: dict[int, tuple[str, dict[str, float]]] = {}
    for path in JobDir(job_dir).metrics_files():
        rank = rank_of_metrics_file(path.name)
        try:
            data = read_rank_metrics(files.read_text(path, 1 << 20))
        except OSError:
            continue
        if rank is None or data is None:
            continue
        values = {k: v for k, v in data.items() if isinstance(v, float) and math.isfinite(v)}
        values.setdefault("last_step_timestamp_seconds", 0.0)
        if rank not in newest or values["last_step_timestamp_seconds"] > newest[rank][1]["last_step_timestamp_seconds"]:
            newest[rank] = (path.parent.name, values)
    return newest


def last_polls(job_dir: str | Path) -> dict[tuple[int, str], dict]:
    """Each run's and node's last logged poll (its exporter's log, ``logs/<node>.r<run>.metrics.jsonl``, read from
    its end: a huge log costs a line), by (run, node); a log whose last line is not a poll is left out."""
    out: dict[tuple[int, str], dict] = {}
    for run, path in JobDir(job_dir).metrics_logs():
        try:
            poll = _last_line(path)
        except (OSError, ValueError):
            continue
        if isinstance(poll, dict) and isinstance(poll.get("node"), str) and isinstance(poll.get("samples"), list):
            out[(run, poll["node"])] = poll
    return out


def _last_line(path: Path, first: int = 1 << 13, longest: int = 1 << 20):
    """The JSON of the file's last line, or of the one before where the last is torn (None: neither is JSON): its
    last ``first`` bytes, more where a line is longer (a poll of many GPUs), up to ``longest``."""
    size = first
    while True:
        chunk = files.tail(path, size)
        lines = chunk.splitlines()
        if len(lines) > 2 or len(chunk) < size or size >= longest:  # two whole last lines, or the whole file
            for line in reversed(lines[-2:]):  # a torn last line (the exporter killed mid-write): the one before
                try:
                    return files.loads(line)
                except ValueError:
                    continue
            return None
        size *= 8
