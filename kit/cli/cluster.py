"""`kit cluster`: the local Slurm cluster."""

from __future__ import annotations

import os
import shlex
import time

import click

from kit.cluster import LocalCluster, plugin


def _progress(msg: str) -> None:
    click.echo(f"kit: {msg}", err=True)


@click.group()
def cluster() -> None:
    """Run a multi-node Slurm cluster on this machine (the embedded default).

    State lives under $KIT_HOME/cluster (default ~/.local/state/kit/cluster).
    """


@cluster.command()
@click.option("--nodes", type=int, default=None, help="Number of slurmd nodes [default: as running, else 2].")
@click.option(
    "--cpus-per-node", type=int, default=None, help="CPUs each node offers [default: as running, else this machine's]."
)
@click.option(
    "--gpus-per-node", type=int, default=None, help="Count-only GPUs (GRES) per node [default: as running, else 0]."
)
@click.option("--prometheus", is_flag=True, help="Also run Prometheus on loopback, discovering job exporters.")
@click.option(
    "--isolated-network/--shared-network",
    default=None,
    help="Each node in a network namespace of its own, at its own address on a bridge kit makes "
    "(198.18.0.0/15, never routed off this machine; root) [default: as running, else shared].",
)
@click.option(
    "--accounting/--no-accounting",
    default=None,
    help="Run slurmdbd on a MariaDB of the cluster's own (socket only; its data kept across down/up), "
    "so sacct, sreport and sacct-based tools answer [default: as running, else when installed].",
)
@click.option(
    "--squashfuse/--create",
    "squashfuse",
    default=None,
    help="How container jobs hold their image, as pyxis's use_squashfuse: read through squashfuse, never "
    "unpacked (--squashfuse), or unpacked on each node first (--create); "
    "changes a running cluster from its next job step [default: as running, else --create].",
)
@click.option(
    "--container-scope",
    type=click.Choice(plugin.SCOPES),
    default=None,
    help="pyxis's container_scope: job makes named containers the job's, removed by the job epilog "
    "(kit then names create-mode containers, so that their removal is out of the job's steps) "
    "[default: as running, else global, pyxis's].",
)
def up(
    nodes: int | None,
    cpus_per_node: int | None,
    gpus_per_node: int | None,
    prometheus: bool,
    isolated_network: bool | None,
    accounting: bool | None,
    squashfuse: bool | None,
    container_scope: str | None,
) -> None:
    """Start slurmctld and NODES slurmd daemons.

    Idempotent. On a cluster where some daemons died, starts only those
    again: the controller keeps its jobs and job ids, running jobs go on.
    """
    c = LocalCluster()
    rows_before = c.state() is not None
    t0 = time.monotonic()
    st, started = c.up(
        nodes=nodes,
        cpus_per_node=cpus_per_node,
        gpus_per_node=gpus_per_node,
        progress=_progress,
        prometheus=prometheus,
        isolated_network=isolated_network,
        accounting=accounting,
        squashfuse=squashfuse,
        container_scope=container_scope,
    )
    what = ("started" if not rows_before else "repaired") if started else "already running"
    click.echo(
        f"local cluster {what}: {st.nodes} node(s) x {st.cpus_per_node} CPUs"
        + (f" x {st.gpus_per_node} GPUs" if st.gpus_per_node else "")
        + (f", each at its own address ({', '.join(st.network['addresses'].values())})" if st.network else "")
        + (", with accounting (sacct)" if st.dbd_port else "")
        + (f" in {time.monotonic() - t0:.1f} s" if started else "")
    )
    click.echo(f"export SLURM_CONF={shlex.quote(str(c.conf))}")
    if st.prometheus_port:
        click.echo(f"prometheus: http://127.0.0.1:{st.prometheus_port}")


@cluster.command()
def status() -> int:
    """Show the daemons and node states; exit 1 when the cluster is not running (and where root's local
    cluster of this machine is, when one runs: every local user's)."""
    from kit.cluster import public

    c = LocalCluster()
    rows = c.status()
    if not rows:
        click.echo(f"local cluster: not running (no state under {c.root})")
        for line in public.elsewhere(c.conf, os.environ.get("SLURM_CONF")):
            click.echo(line)
        return 1
    running = c.running()
    click.echo(f"local cluster: {'running' if running else 'degraded'} ({c.root})")
    click.echo(f"  containers: {c.containers_description()}")
    for d in rows:
        pid = str(d.pid) if d.pid else "-"
        state = d.state or ("up" if d.alive else "dead")
        click.echo(f"  {d.name:<10} pid {pid:<8} port {d.port:<6} {state}")
    return 0 if running else 1


@cluster.command()
@click.option("--id", "chosen", metavar="ID", help="The local cluster of this machine to use (kit cluster status).")
def env(chosen: str | None) -> None:
    """Print what a login shell needs to use the local cluster (SLURM_CONF; PATH where Slurm is elsewhere):
    yours, else root's on this machine, which serves every local user — the one your SLURM_CONF names, else the
    newest (said when several run)."""
    from kit.cluster import public

    c = LocalCluster()
    conf, note = public.serving(c.conf, c.state() is not None, os.environ.get("SLURM_CONF"), chosen)
    if note:
        click.echo(note, err=True)
    for line in public.login_lines(conf):
        click.echo(line)


@cluster.command()
@click.option("--force", is_flag=True, help="Cancel the jobs that are still pending or running.")
def down(force: bool) -> None:
    """Stop the cluster: its daemons and every process of its jobs.

    Refuses while jobs are active unless --force (they are then cancelled).
    Job ids go on where they stopped at the next `up`.
    """
    c = LocalCluster()
    if c.down(progress=_progress, force=force):
        click.echo("local cluster stopped")
    else:
        click.echo("local cluster: not running")
