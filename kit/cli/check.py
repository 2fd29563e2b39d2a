"""`kit check nodes`: the preflight's checks on idle nodes."""

from __future__ import annotations

import json

import click


@click.group()
def check() -> None:
    """Check nodes before jobs run on them."""


@check.command()
@click.option("--nodes", "nodes", default=None, metavar="LIST", help="Nodes to check [default: every idle node].")
@click.option("--partition", "-p", default=None, help="The partition [default: Slurm's default].")
@click.option("--gpus-per-node", type=click.IntRange(1), default=None, help="Ask each node for this many GPUs.")
@click.option(
    "--burn-seconds",
    type=click.FloatRange(0.1, 600),
    default=2.0,
    show_default=True,
    help="How long each node's matmul burn-in runs.",
)
@click.option("--local", "where", flag_value="local", default=None, help="kit's local cluster.")
@click.option("--site", "where", flag_value="site", help="The site's Slurm.")
@click.option("--json", "as_json", is_flag=True, help="Every node's record and the verdict, as JSON.")
def nodes(nodes, partition, gpus_per_node, burn_seconds, where, as_json):
    """What `kit launch --preflight` checks, on nodes no job holds: each node's GPUs through NVML (lost, missing,
    double-bit ECC, row remapping, hardware slowdown, Xids) and a matmul burn-in against the others. Exits 1
    when a node fails."""
    from kit import targets
    from kit.preflight import Finding
    from kit.preflight.verdict import node_score
    from kit.slurm.check import check_nodes

    target, _ = targets.select_target(where)
    found, verdict = check_nodes(target, nodes, partition, gpus_per_node, burn_seconds)
    if as_json:
        click.echo(json.dumps({"nodes": found, **verdict}, indent=1))
        raise SystemExit(0 if verdict["verdict"] == "ok" else 1)
    for node, record in sorted(found.items()):
        score = node_score(record)
        state = "FAILED" if node in verdict["nodes"] else "ok"
        click.echo(f"{node:<16} {state:<7} " + (f"burn-in {score:.3g} TFLOP/s" if score is not None else "-"))
        for f in record.get("findings", []):
            click.echo(f"  {Finding(**f).line()}")
    click.echo(f"verdict: {verdict['verdict']}" + (f": {verdict['why']}" if verdict["why"] else ""))
    raise SystemExit(0 if verdict["verdict"] == "ok" else 1)
