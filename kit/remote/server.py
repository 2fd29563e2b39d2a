"""kit on the login node, for a laptop: the library side of the hidden commands only a laptop calls
(:data:`kit.remote.wire.SERVER_COMMANDS`, parsed and printed by :mod:`kit.cli.serving`): a call by name
(:func:`answer`, looked up in the one registry of hosted calls, :mod:`kit.job.hosting`) and pickled calls
submitted (:func:`submit_received`). Each goes through the library as a local call does; a launch with the code
the laptop sent is ``kit launch``'s, the snapshot handed over as an argument (:mod:`kit.cli.serving`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kit.core import options
from kit.errors import KitError
from kit.job import functions, handle, hosting
from kit.remote import wire


def answer(request: str) -> dict:
    """``kit remote-call REQUEST`` (JSON: the call's name, its job's directory and id or none, its arguments):
    the record for the laptop, its value or the KitError it raised."""
    try:
        call = json.loads(request)
        name, job, args = call["call"], call["job"], call["args"]
        if name not in hosting.CALLS or not isinstance(args, dict) or not isinstance(job, (dict, type(None))):
            raise KeyError(name)
    except (ValueError, KeyError, TypeError):
        raise KitError(f"not a call kit knows: {request[:200]!r}", field="remote-call") from None
    try:
        value = hosting.serve(name, None if job is None else _job(job), args)
    except KitError as e:
        return {"kit_error": e.message, "hint": e.hint, "field": e.field, "exit_code": e.exit_code, "detail": e.detail}
    return {"value": value}


def _job(address: dict) -> handle.Job:
    from kit.jobdir import lookup

    given = str(address["dir"])  # a directory (relative: under the login home) or a job id
    job_dir = Path(under_home(given))
    if not job_dir.is_dir():
        job_dir = lookup.find_job_dir(given, under_home(address.get("output_dir")))
    return handle.Job(job_dir, job_id=address.get("id"))


def under_home(d: str | None) -> str:
    """A path the laptop named, as the login node has it: relative ones under the login home; none: the login
    home's ``kit-jobs`` (where a launch from the laptop goes)."""
    d = options.OUTPUT_DIR if d is None else d
    return d if Path(d).is_absolute() else str(Path.home() / d)


def _jobs(output_dirs: list[str], everything: bool = False) -> list:
    """``kit.jobs(host=)`` there: (directory, kit ps's row as JSON) of each job."""
    jobs = handle.jobs(output_dirs=[under_home(d) for d in output_dirs], everything=bool(everything))
    return [[str(j.dir), j.row.as_json()] for j in jobs]


hosting.register(hosting.Hosted("jobs", _jobs))


def submit_received() -> dict:
    """``kit remote-submit``: this Python told first (the laptop refuses another minor version before it sends
    anything), then the pickled calls and their keywords read, submitted here (one job, or an array task per
    call): the jobs' ids and directories."""
    wire.write({"python": functions.PYTHON})
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
    kwargs["output_dir"] = under_home(kwargs.get("output_dir"))
    jobs: list[Any] = (
        functions.map_payloads(payloads, kwargs) if array else [functions.submit_payload(payloads[0], kwargs)]
    )
    return {"jobs": [[job.id, str(job.dir)] for job in jobs]}
