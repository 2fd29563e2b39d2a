"""kit on the login node, for a laptop: the hidden commands only the laptop calls (:data:`kit.remote.wire.SERVER_COMMANDS`),
each the library call a local command or ``kit.Job`` makes, its answer in records (:mod:`kit.remote.wire`) to
the laptop's :class:`kit.remote.client.Session`: ``remote-launch`` (a launch with the code the laptop sent),
``remote-submit`` and ``remote-result`` (``kit.submit``/``kit.map``), ``remote-wait`` (``--wait`` again after a
dropped connection), ``remote-call`` (a :class:`kit.Job`'s methods, ``kit.jobs``)."""

from __future__ import annotations

import base64
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import click

from kit import submission as lib
from kit.cli.launch import RECEIVED, launched
from kit.core import jobfile
from kit.errors import KitError
from kit.job import functions
from kit.remote import transfer, wire


def _say(value: dict) -> None:
    wire.write(value)


@click.command(name="remote-submit", hidden=True)
def remote_submit():
    """The login node's side of kit.submit(fn, host=...) and kit.map(fn, items, host=...): its Python first
    (the laptop refuses another minor version before it sends anything), then the pickled calls and their
    keywords, submitted here (one job, or an array task per call)."""
    _say({"python": functions.PYTHON})
    try:
        header = json.loads(sys.stdin.buffer.readline(1 << 24))
        kwargs, sizes, array = header["kwargs"], [int(n) for n in header["sizes"]], bool(header["map"])
        payloads = [sys.stdin.buffer.read(n) for n in sizes]
    except (ValueError, KeyError, TypeError):
        raise KitError("the laptop sent no call", field="remote-submit") from None
    if (
        not isinstance(kwargs, dict)
        or [len(p) for p in payloads] != sizes
        or not sizes
        or (not array and len(sizes) > 1)
    ):
        raise KitError("the laptop's calls stopped short", field="remote-submit")
    wire.watch_input_end()
    out = kwargs.get("output_dir")
    kwargs["output_dir"] = str(Path.home() / (out if out is not None else "kit-jobs"))  # absolute stays absolute
    jobs = functions.map_payloads(payloads, kwargs) if array else [functions.submit_payload(payloads[0], kwargs)]
    _say({"jobs": [[job.id, str(job.dir)] for job in jobs]})


@click.command(name="remote-result", hidden=True)
@click.argument("job_dir")
@click.option("--job-id", required=True, help="The job's Slurm id.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait for its end.")
@click.option("--batch", is_flag=True, help="An array task: also the results of every task already ended.")
def remote_result(job_dir, job_id, timeout, batch):
    """The login node's side of a hosted function job's result(): waits here for every rank's value (or the
    job's end), then hands the ranks' pickled values to the laptop (nothing of the user's is unpickled here).
    ``--batch`` (kit.map's tasks): with them, by index, those of the array's other tasks that have ended too,
    their states asked for in one query, so that ``[j.result() for j in jobs]`` makes a call per batch, not per
    task."""
    from kit import slurm
    from kit.jobdir import JobDir, records

    job = functions.FunctionJob(job_dir, job_id=job_id)
    array_id, _, index = job_id.partition("_")
    array_dir = Path(job_dir).parent.parent
    states, indices = None, records.task_indices(array_dir) if batch and index.isdigit() else []
    if indices:
        states = slurm.ArrayStates(job.target, array_id, indices)
        job = functions.FunctionJob(job_dir, job_id=job_id, target=job.target, array_states=states)
    try:
        end = job.wait(timeout, until=lambda: functions.every_rank_returned(Path(job_dir)))
    except KitError as e:
        return _say({"kit_error": e.message, "hint": e.hint})
    record = _result_record(Path(job_dir), job_id, end)
    if states is None:
        return _say(record)
    pending = [i for i in states.indices if i not in states.done]
    if pending:
        states.status(pending[0], poll=0)  # one query for every task not yet seen ended
    tasks = {index: record}
    for i in sorted(states.done - {int(index)}):
        task = JobDir(array_dir).task(i).path
        tasks[str(i)] = _result_record(task, f"{array_id}_{i}", slurm.observe(states.known[i], task))
    _say({"tasks": tasks})


def _result_record(job_dir: Path, job_id: str, end) -> dict:
    try:
        data = functions.result_payloads(job_dir, job_id, end, limit=functions.HOSTED_RESULT_LIMIT)
    except functions.RemoteError as e:
        return {"error": e.record}
    except KitError as e:
        return {"kit_error": e.message, "hint": e.hint}
    return {"results": [base64.b64encode(d).decode() for d in data]}


@click.command(name="remote-wait", hidden=True)
@click.argument("job_dir")
@click.option("--job-id", required=True, help="The job's Slurm id.")
def remote_wait(job_dir, job_id):
    """The login node's side of `kit --host LOGIN launch --wait` after a dropped connection: wait for the job
    (every task of an array job) again, as --wait does, and exit with its code."""
    from kit.cli.launch import wait_and_report, wait_and_report_tasks
    from kit.job import api
    from kit.jobdir import records

    target = api.Job(job_dir, job_id=job_id).target
    if records.task_indices(Path(job_dir)):
        return wait_and_report_tasks(target, job_id, job_dir)
    return wait_and_report(target, job_id, job_dir)


def _job(call: dict):
    from kit.job import api
    from kit.jobdir import records

    given = str(call["dir"])  # a directory (relative: under the login home) or a job id
    job_dir = Path(given) if Path(given).is_absolute() else Path.home() / given
    if not job_dir.is_dir():
        job_dir = records.find_job_dir(given, _under_home(call.get("output_dir") or "kit-jobs"))
    return api.Job(job_dir, job_id=call.get("id"))


def _under_home(d: str) -> str:
    return d if Path(d).is_absolute() else str(Path.home() / d)


def _report(job, a: dict) -> dict:
    """kit report there, and what the laptop needs of it: lines, warnings, numbers, the picture's bytes."""
    from kit.jobdir import JobDir

    out = job.dir / (Path(JobDir.REPORT).stem + a.get("suffix", ".png"))
    missing: list[KitError] = []
    summary = job.summarize(a.get("prometheus"), out, a.get("min_seconds"), notice=missing.append)
    picture = out.read_bytes() if a.get("send") and out.is_file() and not missing else b""
    return {
        "lines": summary.lines(),
        "warnings": [e.message + (f"; {e.hint}" if e.hint else "") for e in missing],
        "numbers": asdict(summary),
        "picture": str(out),
        "picture_bytes": base64.b64encode(picture).decode(),
    }


def _jobs(a: dict) -> list:
    from kit.job import api

    return [
        [str(j.dir), j.row.as_json()]
        for j in api.jobs(output_dirs=[_under_home(d) for d in a["output_dirs"]], everything=bool(a.get("everything")))
    ]


def _rerun(job, a: dict) -> dict:
    new = job.rerun(*a.get("items") or (), **a.get("edits") or {})
    return {"id": new.id, "dir": str(new.dir)}


def _feed_logs(job, a: dict) -> dict:
    parts: list[bytes] = []
    notes: list[str] = []
    job.feed_logs(
        parts.append,
        rank=a.get("rank"),
        run=a.get("run"),
        node=a.get("node"),
        sidecar=a.get("sidecar"),
        prefixed=a.get("prefixed"),
        batch_instead=bool(a.get("batch_instead", True)),
        say=notes.append,
    )
    return {"notes": notes, "data": base64.b64encode(b"".join(parts)).decode()}


def _state(job, a: dict) -> list:
    state = job.state()
    return [str(state), getattr(state, "note", "")]


# What the laptop's kit.Job(…, host=) may ask: each a function of the job (or none) and the call's arguments.
CALLS = {
    "target": lambda job, a: asdict(job.target),
    "state": _state,
    "progress": lambda job, a: asdict(job.progress()),
    "events": lambda job, a: [e.as_json() for e in job.events()],
    "goodput": lambda job, a: (lambda g: None if g is None else g.as_json())(job.goodput()),
    "wait": lambda job, a: asdict(job.wait(a.get("timeout"))),
    "cancel": lambda job, a: job.cancel(a.get("reason")),
    "logs": lambda job, a: job.logs(
        a.get("rank"), a.get("run"), bool(a.get("errors")), node=a.get("node"), sidecar=a.get("sidecar")
    ),
    "feed_logs": _feed_logs,
    "errors": lambda job, a: job.errors(a.get("runs")),
    "rerun": _rerun,
    "report": _report,
}


@click.command(name="remote-call", hidden=True)
@click.argument("request")
def remote_call(request):
    """The login node's side of kit.Job(..., host=) and kit.jobs(host=): one call (JSON: its name, the job's
    directory and id, its arguments), its value as one JSON line (or the KitError it raised)."""
    try:
        call = json.loads(request)
        name, args = call["call"], call
        if name != "jobs" and name not in CALLS:
            raise KeyError(name)
    except (ValueError, KeyError, TypeError):
        raise KitError(f"not a call kit knows: {request[:200]!r}", field="remote-call") from None
    try:
        value = _jobs(args) if name == "jobs" else CALLS[name](_job(call), args)
    except KitError as e:
        _say({"kit_error": e.message, "hint": e.hint, "field": e.field, "exit_code": e.exit_code, "detail": e.detail})
    else:
        _say({"value": value})


@click.command(name="remote-launch", hidden=True)
@click.option("--tree", help="The laptop's tree, by name (under $KIT_HOME/trees); its code comes on standard input.")
@click.option("--cwd", "where", default=".", help="The laptop's directory, relative to its tree.")
@click.option("--job", "request", required=True, help="The launch (kit.core.jobfile.Request, JSON).")
def remote_launch(tree, where, request):
    """The login node's side of `kit --host LOGIN launch` and `kit.launch(host=)` (:mod:`kit.remote.transfer`):
    the code received (with ``--tree``), then the launch made as a local one is."""
    request = jobfile.Request.from_json(request)
    if tree is None:
        wire.watch_input_end()
        return launched(transfer.on_the_login_node(request))
    snap, here, image = transfer.receive(tree, where)
    wire.watch_input_end()
    here.mkdir(parents=True, exist_ok=True)  # the laptop's directory held no file of the snapshot
    os.chdir(here)
    RECEIVED.set(lib.Rerun(snapshot=snap))  # the job runs the snapshot the laptop sent, as it was taken there
    return launched(transfer.on_the_login_node(request, image))
