"""The login node's side of the Python API over SSH (``kit.submit(fn, host=…)``; :mod:`kit.remote`): hidden
commands that speak JSON lines to the laptop's :class:`kit.remote.Session`. (Not ``kit/cli/remote.py``: a
submodule of that name would replace ``kit.remote`` in ``kit.cli``'s namespace once loaded.)"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import click

from kit import functions, remote
from kit.errors import KitError


def _say(value: dict) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


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
    if not isinstance(kwargs, dict) or [len(p) for p in payloads] != sizes or not sizes or (not array and len(sizes) > 1):
        raise KitError("the laptop's calls stopped short", field="remote-submit")
    remote.watch_input_end()
    out = kwargs.get("output_dir")
    kwargs["output_dir"] = str(Path.home() / (out if out is not None else "kit-jobs"))  # absolute stays absolute
    jobs = functions.map_payloads(payloads, kwargs) if array else [functions.submit_payload(payloads[0], kwargs)]
    _say({"jobs": [[job.id, str(job.dir)] for job in jobs]})


@click.command(name="remote-result", hidden=True)
@click.argument("job_dir")
@click.option("--job-id", required=True, help="The job's Slurm id.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait for its end.")
def remote_result(job_dir, job_id, timeout):
    """The login node's side of a hosted function job's result(): waits for its end here, then hands the
    ranks' pickled values to the laptop (nothing of the user's is unpickled here)."""
    job = functions.FunctionJob(job_dir, job_id=job_id)
    try:
        end = job.wait(timeout)
        data = functions.result_payloads(Path(job_dir), job_id, end)
    except functions.RemoteError as e:
        _say({"error": e.record})
    except KitError as e:
        _say({"kit_error": e.message, "hint": e.hint})
    else:
        _say({"results": [base64.b64encode(d).decode() for d in data]})


@click.command(name="remote-wait", hidden=True)
@click.argument("job_dir")
@click.option("--job-id", required=True, help="The job's Slurm id.")
def remote_wait(job_dir, job_id):
    """The login node's side of `kit --host LOGIN launch --wait` after a dropped connection: wait for the job
    again, as --wait does, and exit with its code."""
    from kit import api
    from kit.cli.launch import wait_and_report

    return wait_and_report(api.Job(job_dir, job_id=job_id).target, job_id, job_dir)
