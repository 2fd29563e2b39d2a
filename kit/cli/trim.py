"""`kit trim`: free the pinned images and code snapshots no job needs any more."""

from __future__ import annotations

from pathlib import Path

import click

from kit.cli.common import output_dirs


@click.command()
@output_dirs("Also look here for jobs, and for a code store beside them (repeatable).")
@click.option(
    "--keep",
    "keep",
    multiple=True,
    metavar="JOB",
    help="Keep this job directory's image and code too, for a later kit rerun (repeatable).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be freed; remove nothing.")
def trim(output_dirs, keep, dry_run):
    """Free the pinned --image copies and code snapshots no job needs any more.

    Kept: what a pending or running job uses, one that ended unfinished while Slurm still
    knows it (it may be requeued), any job Slurm cannot answer for, and each --keep JOB.
    What was written in the last 10 minutes stays (a launch may be writing it).
    """
    from kit.code.snapshot import mib
    from kit.job import trim as lib

    out = lib.trim([Path(d) for d in output_dirs], [Path(k) for k in keep], dry_run=dry_run)
    verb = "would free" if dry_run else "freed"
    click.echo(
        f"kit trim: {verb} {mib(out.freed)}: {len(out.images)} pinned image(s), {out.snapshots} code "
        f"snapshot(s), {out.objects} code file(s), {out.trees} code tree(s); kept what {len(out.kept_for)} "
        "job(s) still need"
    )
    for path in out.images:
        click.echo(f"  {'would remove' if dry_run else 'removed'} {path}")
    return 0
