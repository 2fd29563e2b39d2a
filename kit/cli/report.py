"""`kit report`: a finished (or running) job's metrics as a PNG and a summary."""

from __future__ import annotations

from pathlib import Path

import click

from kit.errors import KitError


@click.command()
@click.argument("job")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="PNG to write [default: JOB_DIR/report.png]; a .json summary goes next to it.")
@click.option("--prometheus", "prometheus", default=None, metavar="URL",
              help="Read from this Prometheus [default: the local cluster's, else the job's metrics logs].")
@click.option("--output-dir", default="kit-jobs", show_default=True, help="Where to look up a job id.")
def report(job, output, prometheus, output_dir):
    """Plot GPU utilization, memory, power and training throughput of JOB (an id or a job directory)."""
    from kit.cluster import LocalCluster
    from kit.monitor.report import report as make_report

    job_dir = Path(job)
    if not job_dir.is_dir():
        matches = [p.parent for p in Path(output_dir).glob("*/job_id") if p.read_text().strip() == job]
        if not matches:
            raise KitError(f"no job directory for job {job} under {output_dir}", field="JOB",
                           hint="give the job directory itself, or --output-dir where it lives")
        if len(matches) > 1:
            raise KitError(f"job id {job} names {len(matches)} job directories under {output_dir}", field="JOB",
                           detail="\n".join(str(m) for m in sorted(matches)),
                           hint="give the job directory itself")
        job_dir = matches[0]
    job_id = (job_dir / "job_id").read_text().strip() if (job_dir / "job_id").exists() else job_dir.name
    prometheus = prometheus or LocalCluster().prometheus_url()
    out = Path(output) if output else job_dir / "report.png"
    if (job_dir / "tasks").is_dir():  # an array job or sweep: a table of its tasks
        from kit.monitor.report import TASK_HEADER, report_tasks

        click.echo(f"job {job_id}: {len(list((job_dir / 'tasks').iterdir()))} task(s)")
        click.echo(TASK_HEADER)
        for row in report_tasks(job_dir, job_id, out):
            click.echo(row.line())
        click.echo(f"report: {out}")
        return
    summary = make_report(job_dir, job_id, out, prometheus)
    for line in summary.lines():
        click.echo(line)
    click.echo(f"report: {out}")
