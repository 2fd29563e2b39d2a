"""``notify/sent.jsonl``: one line per event and target, once sent or given up on (``ok`` false, with why)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from kit import files
from kit.core.notify import Recipient
from kit.jobdir import JobDir


def read(job_dir: Path) -> list[dict]:
    """The lines of ``notify/sent.jsonl`` (a torn last line skipped)."""
    path = Path(job_dir) / JobDir.NOTIFY / JobDir.NOTIFY_SENT
    out = []
    for line in files.lines(path) if path.exists() else ():
        try:
            rec = json.loads(line) if line else None
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("key"), str) and isinstance(rec.get("target"), int):
            out.append(rec)
    return out


def undelivered(job_dir: Path) -> list[dict]:
    """The ledger's given-up sends: ``{key, target (shown), error}`` each."""
    return [r for r in read(job_dir) if r.get("ok") is False]


def record(job_dir: Path, key: str, i: int, target: Recipient, error: str | None) -> None:
    line = {"key": key, "target": i, "ok": error is None, "time": time.time()}
    if error is not None:
        line.update(shown=target.shown(), error=error[:300])
    files.append(Path(job_dir) / JobDir.NOTIFY / JobDir.NOTIFY_SENT, json.dumps(line) + "\n", mode=0o600)
