"""kit's Python API on a login node, from a laptop: ``kit.launch(..., host=)``, ``kit.jobs(host=)``,
``kit.Job(job_dir, host=)``.

A :class:`HostedJob` is a job on the login node as a :class:`kit.Job` is here: its id and its directory
there, and the same methods (``state``, ``progress``, ``wait``, ``cancel``, ``logs``, ``errors``,
``rerun``, ``report``), each one call of ``kit remote-call`` over one SSH connection (:mod:`kit.remote`:
the user's ssh configuration, kit's shared master). What comes back is data — states, numbers, text, the
report's picture — never anything the laptop runs. ``wait`` rides through a dropped connection as ``kit
launch --wait`` does.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

from kit import files, remote, remote_launch, slurm
from kit.core import keywords
from kit.core.outcome import Outcome
from kit.errors import KitError
from kit.jobdir import records

PICTURES = (".png", ".svg", ".pdf")


def host_of(host: "str | remote.Host") -> remote.Host:
    return host if isinstance(host, remote.Host) else remote.Host.of(host)


def call(host: remote.Host, name: str, **args: Any) -> Any:
    """``name`` with ``args`` on the login node (``kit remote-call``); its value, or its KitError here."""
    with remote.Session(host, ["remote-call", json.dumps({"call": name, **args})]) as session:
        answer = session.read_json()
    if "kit_error" in answer:
        raise KitError(answer["kit_error"], field=answer.get("field") or "host", hint=answer.get("hint"),
                       exit_code=answer.get("exit_code") or 1)
    return answer.get("value")


def launch(host: "str | remote.Host", command, kwargs: dict, cwd: Path | None = None) -> "HostedJob":
    """``kit.launch(command, host=, **kwargs)``: checked here as a local launch is, then ``kit launch`` there
    with this directory's code (or ``code=``) sent first; ``wait=True`` waits there (riding through a dropped
    connection)."""
    host = host_of(host)
    wait = kwargs.get("wait")
    argv = keywords.as_argv(command, {k: v for k, v in kwargs.items() if k not in ("wait", "as_json", "parsable")})
    made, messages = remote_launch.launch_call(host, argv, cwd or Path.cwd())
    job = HostedJob(host, made["job_dir"], job_id=None if kwargs.get("dry_run") else str(made["job_id"]),
                    messages=messages)
    if wait and not kwargs.get("dry_run"):
        job.wait()
    return job


def jobs(host: "str | remote.Host", output_dirs=("kit-jobs",), everything: bool = False) -> "list[HostedJob]":
    """``kit.jobs(host=)``: the jobs `kit ps` lists there (output directories relative to the login home)."""
    host = host_of(host)
    rows = call(host, "jobs", output_dirs=[str(d) for d in output_dirs], everything=everything)
    return [HostedJob(host, unit, job_id=row["id"], row=row) for unit, row in rows]


class HostedJob:
    """A kit job on a login node (``kit.Job(job_dir, host=…)``): ``dir`` is its directory there. Each method
    is one call there; ``row``: what ``kit.jobs(host=)`` saw of it (kit ps's row, a dict)."""

    def __init__(self, host: "str | remote.Host", job_dir: str | Path, *, job_id: str | None = None,
                 row: dict | None = None, messages=()):
        self.host, self.dir, self.id, self.row = host_of(host), str(job_dir), job_id, row
        self.messages = list(messages)

    def __repr__(self) -> str:
        return f"kit.Job({self.id or 'not submitted'}, {self.dir!r}, host={self.host.name!r})"

    def _call(self, name: str, **args: Any) -> Any:
        return call(self.host, name, dir=self.dir, id=self.id, **args)

    def state(self) -> str:
        state, note = self._call("state")
        return slurm.State(state, note)

    def done(self) -> bool:
        return self.state() in slurm.TERMINAL_STATES | {"ENDED"}

    def progress(self) -> records.Progress:
        return records.Progress(**self._call("progress"))

    def wait(self, timeout: float | None = None) -> Outcome:
        """The job's outcome once it ends; a dropped connection is opened again (for up to
        :data:`kit.remote.RIDE_THROUGH` seconds) and the wait goes on there."""
        end = None if timeout is None else time.monotonic() + timeout
        return remote.riding_through(
            lambda: Outcome(**self._call("wait", timeout=None if end is None else max(0.0, end - time.monotonic()))),
            note=lambda: print(f"kit: job {self.id}: the connection to {self.host.name} dropped; waiting again",
                               file=sys.stderr, flush=True))

    def cancel(self, reason: str | None = None) -> dict:
        return self._call("cancel", reason=reason)

    def logs(self, rank: int | None = None, run: int | None = None, errors: bool = False, *,
             node: str | None = None, sidecar: str | None = None) -> str:
        return self._call("logs", rank=rank, run=run, errors=errors, node=node, sidecar=sidecar)

    def errors(self, runs: list[int] | None = None) -> list[str]:
        return self._call("errors", runs=runs)

    def rerun(self, *items: str, wait: bool = False, **edits: Any) -> "HostedJob":
        made = self._call("rerun", items=list(items), edits=edits)
        job = type(self)(self.host, made["dir"], job_id=made["id"])
        if wait:
            job.wait()
        return job

    def report(self, prometheus: str | None = None, output: str | Path | None = None,
               min_seconds: float | None = None) -> dict:
        """The numbers of `kit report` there (report.json's); with ``output``, its picture (and the numbers
        beside it, ``.json``) written here."""
        return self.fetch_report(prometheus, output, min_seconds)["numbers"]

    def fetch_report(self, prometheus: str | None = None, output: str | Path | None = None,
                     min_seconds: float | None = None, output_dir: str | None = None) -> dict:
        """`kit report` there: {lines, warnings, numbers, picture (there)}; ``output``: the picture here."""
        suffix = Path(output).suffix.lower() if output else ".png"
        if suffix not in PICTURES:
            raise KitError(f"{output}: the report is a picture: name it .png, .svg or .pdf", field="--output",
                           hint="a .json summary is written next to it")
        got = self._call("report", prometheus=prometheus, min_seconds=min_seconds, suffix=suffix,
                         send=output is not None, output_dir=output_dir)
        picture = base64.b64decode(got.pop("picture_bytes") or "")
        if output is not None:  # as the local report writes them: a new file renamed over the name, never through it
            out = Path(output)
            if picture:
                files.write_atomic(out, picture)
            files.write_atomic(out.with_suffix(".json"), json.dumps(got["numbers"], indent=1) + "\n")
            got["picture"] = str(out) if picture else None
        return got

    def result(self, timeout: float | None = None) -> Any:
        raise KitError(f"{self.dir}: a kit.Job has no return value; open a function job (kit.submit, kit.map) as "
                       "kit.FunctionJob", field="JOB")

    results = result
