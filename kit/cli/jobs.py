"""`kit logs` and `kit cancel`: follow a submitted job without raw Slurm commands."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from kit.errors import KitError

_OUTPUT_DIR = click.option("--output-dir", default="kit-jobs", show_default=True,
                           help="Where to look up a job id.")


def _job(job: str, output_dir: str) -> tuple[Path, str]:
    from kit.launch import jobs

    job_dir = jobs.find_job_dir(job, output_dir)
    job_id = jobs.job_id_of(job_dir)
    if job_id is None:
        raise KitError(f"{job_dir} was never submitted (no job_id in it)", field="JOB",
                       hint="a --dry-run writes the directory only")
    return job_dir, job_id


@click.command()
@click.argument("job")
@click.option("--reason", default=None, metavar="TEXT", help="Why: recorded in the job directory.")
@_OUTPUT_DIR
def cancel(job, reason, output_dir):
    """Cancel JOB (an id or a job directory), recording who and why in its directory.

    The job ends CANCELLED and is never marked finished; an array job's every task is cancelled.
    """
    from kit import launch as lib
    from kit import slurm
    from kit.launch import jobs

    job_dir, job_id = _job(job, output_dir)
    target = lib.target_of(job_dir)
    st = slurm.job_status(target, job_id)
    if st.state in slurm.TERMINAL_STATES or st.state == "GONE":
        raise KitError(f"job {job_id} already ended ({st.state}): nothing to cancel", field="JOB", exit_code=1)
    rec = jobs.record_cancel(job_dir, reason)
    slurm.cancel(target, job_id)
    why = f" ({rec['reason']})" if rec["reason"] else ""
    click.echo(f"cancelled job {job_id}{why}; recorded in {job_dir / jobs.CANCEL_RECORD}")


@click.command()
@click.argument("job")
@click.option("--rank", type=int, default=None, help="Only this rank's own log.")
@click.option("--node", default=None, metavar="NAME", help="Only the ranks that ran on this node.")
@click.option("--restart", type=int, default=None, metavar="K", help="Run K (0 is the first) [default: the latest].")
@click.option("--sidecar", default=None, metavar="NAME", help="A sidecar's log (e.g. exporter) instead of the ranks'.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what is written, across requeues, until the job ends.")
@click.option("--errors", is_flag=True, help="Per run, the first rank that failed by itself: node, code, its last lines.")
@_OUTPUT_DIR
def logs(job, rank, node, restart, sidecar, follow, errors, output_dir):
    """Show JOB's log (an id or a job directory): every rank's output, rank-prefixed."""
    from kit.launch import jobs

    job_dir, job_id = _job(job, output_dir)
    done = jobs.runs(job_dir)
    if errors:
        return _errors(job_dir, done if restart is None else [restart])
    if follow:
        if rank is not None or node is not None or sidecar is not None or restart is not None:
            raise KitError("-f follows the whole job's log (every run, every rank)", field="--follow",
                           hint="leave out --rank/--node/--sidecar/--restart, or drop -f")
        return _follow(job_dir, job_id)
    run = restart if restart is not None else (done[-1] if done else 0)
    if sidecar is not None:
        paths = sorted((job_dir / "logs").glob(f"{node or '*'}.r{run}.{sidecar}.log"))
        if not paths:
            raise KitError(f"no {sidecar!r} sidecar log of run {run}", field="--sidecar")
        for p in paths:
            _print_prefixed(p.read_text(errors="replace"), p.name.split(".")[0] + ": " if len(paths) > 1 else "")
        return 0
    chosen = jobs.ranks(job_dir, run)
    if rank is not None:
        chosen = [r for r in chosen if r == rank]
    if node is not None:
        chosen = [r for r in chosen if jobs.node_of(job_dir, run, r) == node]
    if not chosen:
        raise KitError(f"no rank log of run {run} matches", field="JOB",
                       hint=f"runs with logs: {', '.join(map(str, done)) or 'none yet'}")
    for r in chosen:
        text = (job_dir / "logs" / f"rank-{r}.r{run}.log").read_text(errors="replace")
        _print_prefixed(text, f"{r}: " if len(chosen) > 1 else "")
    return 0


def _print_prefixed(text: str, prefix: str) -> None:
    for line in text.splitlines():
        click.echo(prefix + line)


def _errors(job_dir: Path, run_numbers: list[int]) -> int:
    from kit.launch import jobs

    found = False
    for run in run_numbers:
        e = jobs.first_failure(job_dir, run)
        if e is None:
            continue
        found = True
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(e.time))
        click.echo(f"run {run}: rank {e.rank} on {e.node} failed first, exit code {e.exit_code}, at {when}")
        try:
            text = (job_dir / "logs" / f"rank-{e.rank}.r{run}.log").read_text(errors="replace")
        except OSError:
            text = "(its log is gone)"
        _print_prefixed(jobs.last_lines(text), "  ")
    if not found:
        click.echo("no rank failed by itself" + (f" in run {run_numbers[0]}" if len(run_numbers) == 1 else ""))
    return 0


def _follow(job_dir: Path, job_id: str) -> int:
    """Print the batch log(s) as they grow (srun's rank-prefixed lines, every run:
    Slurm appends a requeued run to the same file) until the job has ended."""
    from kit import launch as lib
    from kit import slurm

    target = lib.target_of(job_dir)
    offsets: dict[Path, int] = {}
    ended_at = None
    while True:
        grew = False
        for path in sorted((job_dir / "logs").glob("slurm-*.out")):
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1  # whole lines only
            if cut:
                sys.stdout.write(data[:cut].decode(errors="replace"))
                sys.stdout.flush()
                offsets[path] = offsets.get(path, 0) + cut
                grew = True
        if grew:
            ended_at = None
        st = slurm.job_status(target, job_id)
        if st.state in slurm.TERMINAL_STATES or st.state == "GONE":
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > 1.0:  # the last lines are in
                click.echo(f"kit: job {job_id} ended {st.state}", err=True)
                return 0
        time.sleep(0.5)
