"""`kit report`: a finished (or running) job's metrics as a PNG and a summary."""

from __future__ import annotations

from pathlib import Path

import click

from kit.cli.common import OUTPUT_DIR_LOOKUP
from kit.errors import KitError


@click.command()
@click.argument("job")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="PNG to write [default: JOB_DIR/report.png]; a .json summary goes next to it.",
)
@click.option(
    "--prometheus",
    "prometheus",
    default=None,
    metavar="URL",
    help="Read from this Prometheus [default: the local cluster's, else the job's metrics logs].",
)
@click.option(
    "--min-seconds",
    type=click.FloatRange(0),
    default=300.0,
    show_default=True,
    help="Utilisation notes need this many seconds of samples (shorter jobs say too little).",
)
@OUTPUT_DIR_LOOKUP
def report(job, output, prometheus, min_seconds, output_dir):
    """What JOB (an id or a job directory) used of what it held: panels, a summary and notes.

    Panels for what was measured (GPU utilisation, memory and power; the job's
    CPU and memory per node; loss, step time and samples/s per rank), restarts
    marked; notes flag idle or unused GPUs, unused cores and memory, time lost
    to restarts and a slow node, each with its threshold.
    """
    from kit import api
    from kit.jobdir import JobDir, lookup
    from kit.report import picture_suffix

    if output:
        picture_suffix(output)
    job = api.Job.from_dir(lookup.find_job_dir(job, output_dir))
    _show(job, output or job.dir / JobDir.REPORT, prometheus=prometheus, min_seconds=min_seconds)
    from kit.job import settle

    settle.settle(job.dir)  # --notify: an ended job's untold events, handed on


def _show(job, out, **asked) -> None:
    """The report's lines, what could not be drawn, and where its picture is (over --host without -o: there)."""
    from kit.cli.common import SERVING

    missing: list[KitError] = []
    summary = job.summarize(output=out, notice=missing.append, **asked)
    for line in summary.lines():
        click.echo(line)
    for e in missing:  # one line, the hint naming the extra; the numbers above stand
        click.echo(f"kit: warning: {e.message}" + (f"; {e.hint}" if e.hint else ""), err=True)
    out = out or getattr(summary, "picture", None)
    where = ""
    if SERVING["login node"]:  # kit --host LOGIN report JOB without -o: the files are the login node's
        where = f" (on the login node {SERVING['login node']}; -o FILE writes the picture on your machine)"
    click.echo(f"report: {Path(out).with_suffix('.json') if missing and out else out}{where}")


def report_here(host, args: list[str]) -> int:
    """``kit --host LOGIN report JOB -o FILE``: the report made there, its picture (and numbers) written here."""
    from kit import api

    with report.make_context("kit report", list(args)) as ctx:
        p = ctx.params
    job = api.Job(p["job"], host=host)
    _show(job, p["output"], prometheus=p["prometheus"], min_seconds=p["min_seconds"], output_dir=p["output_dir"])
    return 0
