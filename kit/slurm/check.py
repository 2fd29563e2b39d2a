"""``kit check nodes``: the preflight's checks (kit.preflight) on nodes no job holds, one srun task each."""

from __future__ import annotations

import json
import re
import sys

from kit.errors import KitError
from kit.preflight import verdict
from kit.slurm.target import Target

_LABELLED = re.compile(r"^\s*(\d+): (\{.*\})\s*$")


def idle_nodes(target: Target, partition: str | None = None) -> list[str]:
    """The partition's (or every) idle nodes, by name."""
    argv = ["sinfo", "--noheader", "--states=idle", "--format=%N"]
    if partition:
        argv.append(f"--partition={partition}")
    lists = [line.strip() for line in target.run(argv, what="slurm").stdout.splitlines() if line.strip()]
    if not lists:
        return []
    names = target.run(["scontrol", "show", "hostnames", ",".join(lists)], what="slurm").stdout.split()
    return sorted(set(names))


def check_nodes(
    target: Target,
    nodes: str | None = None,
    partition: str | None = None,
    gpus_per_node: int | None = None,
    burn_seconds: float = 2.0,
    timeout: float = 600,
) -> tuple[dict[str, dict], dict]:
    """Each node's preflight record and the verdict over them: ``nodes`` (Slurm's node list; default: the idle
    ones), one task each, the whole node (``--exclusive``) and, with ``gpus_per_node``, its GPUs."""
    if nodes:
        nodes = target.run(["scontrol", "show", "hostnames", nodes], what="slurm", hint="a node list: node[1-4]").stdout
    names = nodes.split() if nodes else idle_nodes(target, partition)
    if not names:
        raise KitError("no idle node to check", field="--nodes", hint="name nodes with --nodes, or wait for idle ones")
    argv = ["srun", f"--nodes={len(names)}", "--ntasks-per-node=1", "--exclusive", "--label", "--job-name=kit-check"]
    argv += [f"--nodelist={','.join(names)}"] + ([f"--partition={partition}"] if partition else [])
    argv += [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    argv += [sys.executable, "-m", "kit.preflight", "node", "--out", "-", "--burn-seconds", str(burn_seconds)]
    proc = target.run(argv, check=False, timeout=timeout, what="srun")
    found = {}
    for line in proc.stdout.splitlines():
        m = _LABELLED.match(line)
        if m:
            try:
                record = json.loads(m.group(2))
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("node"), str):
                found[record["node"]] = record
    if not found and proc.returncode != 0:
        raise KitError(f"srun could not check the nodes: {proc.stderr.strip()[-400:]}", field="--nodes")
    return found, verdict.decide(found, len(names))
