"""The hidden commands only a laptop calls (``kit --host``, ``host=``; :data:`kit.remote.wire.SERVER_COMMANDS`):
each parses, makes one library call on the login node (:mod:`kit.remote.server`, ``kit launch``'s own) and
answers in records (:mod:`kit.remote.wire`)."""

from __future__ import annotations

import os

import click

from kit import submission as lib
from kit.core import jobfile
from kit.remote import server, wire


@click.command(name="remote-call", hidden=True)
@click.argument("request")
def remote_call(request):
    """The login node's side of kit.Job(..., host=) and kit.jobs(host=): one call (JSON: its name, its job's
    directory and id, its arguments), its value as one record (or the KitError it raised)."""
    wire.write(server.answer(request))


@click.command(name="remote-submit", hidden=True)
def remote_submit():
    """The login node's side of kit.submit(fn, host=...) and kit.map(fn, items, host=...)."""
    wire.write(server.submit_received())


@click.command(name="remote-wait", hidden=True)
@click.argument("job_dir")
@click.option("--job-id", required=True, help="The job's Slurm id.")
def remote_wait(job_dir, job_id):
    """The login node's side of `kit --host LOGIN launch --wait` after a dropped connection: wait for the job
    (every task of an array job) again, as --wait does, and exit with its code."""
    from pathlib import Path

    from kit import api
    from kit.cli.launch import wait_and_report, wait_and_report_tasks
    from kit.jobdir import records

    target = api.Job(job_dir, job_id=job_id).target
    if records.task_indices(Path(job_dir)):
        return wait_and_report_tasks(target, job_id, job_dir)
    return wait_and_report(target, job_id, job_dir)


@click.command(name="remote-launch", hidden=True)
@click.option("--tree", help="The laptop's tree, by name (under $KIT_HOME/trees); its code comes on standard input.")
@click.option("--cwd", "where", default=".", help="The laptop's directory, relative to its tree.")
@click.option("--job", "request", required=True, help="The launch (kit.core.jobfile.Request, JSON).")
def remote_launch(tree, where, request):
    """The login node's side of `kit --host LOGIN launch` and `kit.launch(host=)` (:mod:`kit.remote.transfer`):
    the code received (with ``--tree``), then the launch made as a local one is, running that snapshot."""
    from kit.cli.launch import launched
    from kit.remote import transfer

    request = jobfile.Request.from_json(request)
    if tree is None:
        wire.watch_input_end()
        return launched(transfer.on_the_login_node(request))
    snap, here, image = transfer.receive(tree, where)
    wire.watch_input_end()
    here.mkdir(parents=True, exist_ok=True)  # the laptop's directory held no file of the snapshot
    os.chdir(here)
    # the job runs the snapshot the laptop sent, as it was taken there
    return launched(transfer.on_the_login_node(request, image), received=lib.Rerun(snapshot=snap))
