"""The two sides of the hosted calls (:mod:`kit.job.hosting`) where one JSON value each way is not enough: what
the login node sends for a method that feeds callbacks, and what the laptop does around the call (a picture
written here, a wait ridden through a dropped connection, a log followed). The laptop's side uses the transport's
calls alone (``job.there``); what comes back is data — states, numbers, text, a picture's bytes — never anything
the laptop runs."""

from __future__ import annotations

import base64
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kit import files, slurm
from kit.core.outcome import Outcome
from kit.errors import KitError
from kit.jobdir import JobDir

# A state travels with its note (a held job's: how to release it).
STATE = {
    "encode": lambda state: [str(state), getattr(state, "note", "")],
    "decode": lambda job, value: slurm.State(*value),
}


def _call(job, name: str, **args: Any) -> Any:
    return job.there.call(name, job._address(), args)


def no_call(job, args: dict) -> Any:
    raise KitError("not a call: a stream, made by its own command", field="remote-call")


def wait_here(job, timeout: float | None = None, poll: float = 1.0, *, on_outage=None, **_callbacks: Any) -> Outcome:
    """The job's outcome once it ends, waited for there; a dropped connection is opened again (``on_outage``
    hears of it) and the wait goes on there, for what is left of ``timeout``."""
    end = None if timeout is None else time.monotonic() + timeout
    said = on_outage or (lambda message: print(f"kit: {message}", file=sys.stderr, flush=True))
    return job.there.riding(
        lambda: Outcome(
            **_call(job, "wait", timeout=None if end is None else max(0.0, end - time.monotonic()), poll=poll)
        ),
        note=lambda: said(f"job {job.id}: the connection to {job.there.name} dropped; waiting again"),
    )


def feed_logs_there(job, args: dict) -> dict:
    parts: list[bytes] = []
    notes: list[str] = []
    job.feed_logs(parts.append, say=notes.append, **{k: v for k, v in args.items() if k not in ("write", "say")})
    return {"notes": notes, "data": base64.b64encode(b"".join(parts)).decode()}


def feed_logs_here(job, write, *, say=lambda note: None, **selection: Any) -> None:
    got = _call(job, "feed_logs", **selection)
    for note in got["notes"]:
        say(note)
    write(base64.b64decode(got["data"]))


def follow_here(job, write, on_outage=lambda message: None) -> str:
    """`kit logs -f` there, its bytes to ``write`` as they come (riding through a dropped connection); how the
    job ended."""
    job.there.follow(str(job.dir), write)
    return str(job.state())


def made(job) -> dict:
    """A job made there (a rerun), as the laptop reopens it."""
    return {"id": job.id, "dir": str(job.dir)}


def rerun_here(job, *items: str, wait: bool = False, **edits: Any):
    got = _call(job, "rerun", items=list(items), wait=False, edits=edits)
    new = job._like(got["dir"], got["id"])
    if wait:
        new.wait()
    return new


@dataclass
class Reported:
    """`kit report` there, as the laptop has it: its lines, the numbers (report.json's), what could not be
    drawn, and where its picture is (here when it was brought, else there)."""

    shown: list[str]
    numbers: dict
    warnings: list[str] = field(default_factory=list)
    picture: str | None = None

    def lines(self) -> list[str]:
        return list(self.shown)


def summarize_there(job, args: dict) -> dict:
    """kit report there, and what the laptop needs of it: lines, warnings, numbers, the picture's bytes."""
    out = job.dir / (Path(JobDir.REPORT).stem + args.get("suffix", ".png"))
    missing: list[KitError] = []
    summary = job.summarize(args.get("prometheus"), out, args.get("min_seconds"), notice=missing.append)
    picture = out.read_bytes() if args.get("send") and out.is_file() and not missing else b""
    return {
        "lines": summary.lines(),
        "warnings": [e.message + (f"; {e.hint}" if e.hint else "") for e in missing],
        "numbers": asdict(summary),
        "picture": str(out),
        "picture_bytes": base64.b64encode(picture).decode(),
    }


def summarize_here(
    job,
    prometheus: str | None = None,
    output: str | Path | None = None,
    min_seconds: float | None = None,
    notice=lambda e: None,
    output_dir: str | None = None,
) -> Reported:
    """`kit report` there; ``output``: its picture written here (the numbers beside it, ``.json``);
    ``output_dir``: where the login node looks a job id up."""
    from kit.report import picture_suffix

    suffix = picture_suffix(output)
    args = {"prometheus": prometheus, "min_seconds": min_seconds, "suffix": suffix, "send": output is not None}
    got = job.there.call("summarize", {**job._address(), "output_dir": output_dir}, args)
    picture = base64.b64decode(got.pop("picture_bytes") or "")
    if output is not None:  # as the local report writes them: a new file renamed over the name, never through it
        out = Path(output)
        if picture:
            files.write_atomic(out, picture)
        files.write_atomic(out.with_suffix(".json"), json.dumps(got["numbers"], indent=1) + "\n")
        got["picture"] = str(out) if picture else None
    for warning in got["warnings"]:
        notice(KitError(warning, field="report"))
    return Reported(got["lines"], got["numbers"], got["warnings"], got["picture"])


def report_here(job, prometheus: str | None = None, **kwargs: Any) -> dict:
    """The numbers of `kit report` there (report.json's); with ``output``, its picture (and the numbers beside
    it, ``.json``) written here."""
    return summarize_here(job, prometheus, **kwargs).numbers
