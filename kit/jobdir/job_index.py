"""The user's index of jobs (``$KIT_HOME/jobs.index``): every job directory kit submitted, for ``kit ps`` to find
wherever its output directory is."""

from __future__ import annotations

import json
from pathlib import Path

from kit import files
from kit.jobdir import JobDir
from kit.jobdir.records import submitted_at


def _index_path() -> Path:
    from kit.home import kit_home

    return kit_home() / "jobs.index"


def remember(job_dir: Path) -> None:
    """Add a submitted job's directory to the user's index of jobs (``kit ps``
    reads it): one JSON string per line, appended."""
    path = _index_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.append(path, json.dumps(str(Path(job_dir).resolve())) + "\n", 0o600)
    except OSError:
        pass  # kit ps still finds it with --output-dir


def known_job_dirs(output_dirs: list[Path]) -> list[Path]:
    """Submitted job directories, newest first: those in the index, and those
    under ``output_dirs``."""
    found: dict[Path, float] = {}

    def consider(d: Path) -> None:
        try:
            d = d.resolve()
        except (OSError, RuntimeError):
            return
        when = submitted_at(d)
        if when is not None:  # else gone, or never submitted
            found.setdefault(d, when)

    try:
        lines = files.read_text(_index_path(), 64 << 20).splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            name = files.loads(line)
        except ValueError:
            continue  # a torn line
        if isinstance(name, str) and "\0" not in name:
            consider(Path(name))
    for out in output_dirs:
        for p in Path(out).glob(f"*/{JobDir.JOB_ID}"):
            consider(p.parent)
    return sorted(found, key=lambda d: found[d], reverse=True)
