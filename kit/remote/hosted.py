"""A :class:`kit.Job` on a login node, from a laptop: what its methods do when the job has a ``host``.

``kit.launch(..., host=)``, ``kit.jobs(host=)``, ``kit.Job(job_dir, host=)`` and ``kit.submit/map(..., host=)``
return the very :class:`kit.Job` / :class:`kit.FunctionJob` a local call returns; a method of one whose ``host`` is
set runs the function of its name here instead: one call of ``kit remote-call`` over one SSH connection
(:mod:`kit.remote.client`: the user's ssh configuration, kit's shared master), where kit makes the same library
call on that job as a local method makes. What comes back is data — states, numbers, text, the report's picture —
never anything the laptop runs. ``wait`` rides through a dropped connection as ``kit launch --wait`` does.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit import files, slurm
from kit.core import keywords
from kit.core.outcome import Outcome
from kit.errors import KitError
from kit.jobdir import records
from kit.remote import client, ssh, transfer

PICTURES = (".png", ".svg", ".pdf")


def host_of(host: "str | ssh.Host") -> ssh.Host:
    return host if isinstance(host, ssh.Host) else ssh.Host.of(host)


def call(host: ssh.Host, name: str, **args: Any) -> Any:
    """``name`` with ``args`` on the login node (``kit remote-call``); its value, or its KitError here."""
    with client.Session(host, ["remote-call", json.dumps({"call": name, **args})]) as session:
        answer = session.read_json()
    if "kit_error" in answer:
        raise KitError(
            answer["kit_error"],
            field=answer.get("field") or "host",
            hint=answer.get("hint"),
            exit_code=answer.get("exit_code") or 1,
            detail=answer.get("detail"),
        )
    return answer.get("value")


def launch(host: ssh.Host, command, kwargs: dict, cwd: Path | None = None) -> tuple[str | None, str, list[str]]:
    """``kit.launch(command, host=, **kwargs)``: checked here as a local launch is, then ``kit launch`` there
    with this directory's code (or ``code=``) sent first: (the job's id (None: a dry run), its directory there,
    what the launch said)."""
    request = keywords.request(command, kwargs)
    made, messages = transfer.launch_call(host, request, cwd or Path.cwd())
    return None if kwargs.get("dry_run") else str(made["job_id"]), str(made["job_dir"]), messages


def jobs(host: ssh.Host, output_dirs=("kit-jobs",), everything: bool = False) -> list[tuple[str, dict]]:
    """``kit.jobs(host=)``: (directory, kit ps's row as JSON) of each job `kit ps` lists there (output
    directories relative to the login home)."""
    return [
        (unit, row)
        for unit, row in call(host, "jobs", output_dirs=[str(d) for d in output_dirs], everything=everything)
    ]


def _call(job, name: str, **args: Any) -> Any:
    return call(job.host, name, dir=str(job.dir), id=job.id, **args)


def target(job) -> slurm.Target:
    """The Slurm the job went to there (its ``conf`` a path on the login node)."""
    return slurm.Target(**_call(job, "target"))


def state(job) -> str:
    state_, note = _call(job, "state")
    return slurm.State(state_, note)


def progress(job) -> records.Progress:
    return records.Progress(**_call(job, "progress"))


def events(job):
    from kit.jobdir.events import Event

    return [Event(**e) for e in _call(job, "events")]


def goodput(job):
    from kit.jobdir.goodput import Goodput

    got = _call(job, "goodput")
    return None if got is None else Goodput(**got)


def wait(
    job, timeout: float | None = None, poll: float = 1.0, *, on_state=None, on_outage=None, on_poll=None
) -> Outcome:
    """The job's outcome once it ends, waited for there; a dropped connection is opened again (for up to
    :data:`kit.client.RIDE_THROUGH` seconds; ``on_outage`` hears of it) and the wait goes on there."""
    end = None if timeout is None else time.monotonic() + timeout
    said = on_outage or (lambda message: print(f"kit: {message}", file=sys.stderr, flush=True))
    return client.riding_through(
        lambda: Outcome(**_call(job, "wait", timeout=None if end is None else max(0.0, end - time.monotonic()))),
        note=lambda: said(f"job {job.id}: the connection to {job.host.name} dropped; waiting again"),
    )


def cancel(job, reason: str | None = None) -> dict:
    return _call(job, "cancel", reason=reason)


def logs(
    job,
    rank: int | None = None,
    run: int | None = None,
    errors: bool = False,
    *,
    node: str | None = None,
    sidecar: str | None = None,
) -> str:
    return _call(job, "logs", rank=rank, run=run, errors=errors, node=node, sidecar=sidecar)


def feed_logs(
    job,
    write,
    *,
    rank: int | None = None,
    run: int | None = None,
    node: str | None = None,
    sidecar: str | None = None,
    prefixed: bool | None = None,
    batch_instead: bool = True,
    say=lambda note: None,
) -> None:
    got = _call(
        job, "feed_logs", rank=rank, run=run, node=node, sidecar=sidecar, prefixed=prefixed, batch_instead=batch_instead
    )
    for note in got["notes"]:
        say(note)
    write(base64.b64decode(got["data"]))


def errors(job, runs: list[int] | None = None) -> list[str]:
    return _call(job, "errors", runs=runs)


def follow(job, write, on_outage=lambda message: None) -> str:
    """`kit logs -f` there, its bytes to ``write`` as they come (riding through a dropped connection); how the
    job ended."""
    client.run(job.host, ["logs", "-f", str(job.dir)], follow=True, write=write)
    return str(state(job))


def rerun(job, *items: str, wait: bool = False, **edits: Any):
    made = _call(job, "rerun", items=list(items), edits=edits)
    new = type(job)(made["dir"], host=job.host, job_id=made["id"])
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


def summarize(
    job,
    prometheus: str | None = None,
    output: str | Path | None = None,
    min_seconds: float | None = None,
    notice=lambda e: None,
    output_dir: str | None = None,
) -> Reported:
    """`kit report` there; ``output``: its picture written here (the numbers beside it, ``.json``)."""
    suffix = Path(output).suffix.lower() if output else ".png"
    if suffix not in PICTURES:
        raise KitError(
            f"{output}: the report is a picture: name it .png, .svg or .pdf",
            field="--output",
            hint="a .json summary is written next to it",
        )
    got = _call(
        job,
        "report",
        prometheus=prometheus,
        min_seconds=min_seconds,
        suffix=suffix,
        send=output is not None,
        output_dir=output_dir,
    )
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


def report(job, prometheus: str | None = None, **kwargs: Any) -> dict:
    """The numbers of `kit report` there (report.json's); with ``output``, its picture (and the numbers beside
    it, ``.json``) written here."""
    return summarize(job, prometheus, **kwargs).numbers
