"""What the local cluster records about itself (``cluster.json``), and what slurmctld saved."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ClusterState:
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    memory_mb: int
    hostname: str
    ctld_port: int
    node_ports: list[int]
    pids: dict[str, int] = field(default_factory=dict)
    containers: str | None = None  # "pyxis", "kit-pyxis" (the stand-in), or None
    container_plugin: str | None = None  # the SPANK plugin the cluster was started with
    prometheus_port: int | None = None
    auth: str = "none"  # "munge" (the cluster's own munged) or "none" (no munged installed)
    nodes_bound: bool = False  # the slurmds and clients bind the host name's loopback address (NoInAddrAny)
    network: dict | None = None  # --isolated-network: kit.cluster.network.Network as a dict
    dbd_port: int | None = None  # accounting: slurmdbd's port (None: no accounting)
    squashfuse: bool = False  # containers started from the squashfs through FUSE (pyxis use_squashfuse=1)
    container_scope: str = "global"  # pyxis's container_scope: "job" removes named containers in the job epilog


@dataclass
class DaemonStatus:
    name: str
    pid: int | None
    port: int
    alive: bool
    state: str = ""


def saved_job_id_sequence(path: Path) -> int:
    """The next job id slurmctld saved in its job_state file (0 when unreadable).

    The file starts with a packed string "PROTOCOL_VERSION" (4-byte length,
    NUL-terminated), a 16-bit protocol version, an 8-byte time, then the
    32-bit job id sequence, all big-endian (Slurm's pack.c).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return 0
    tag = b"PROTOCOL_VERSION\0"
    if len(head) < 4 + len(tag) + 14 or int.from_bytes(head[:4], "big") != len(tag) or head[4 : 4 + len(tag)] != tag:
        return 0
    at = 4 + len(tag) + 2 + 8
    return int.from_bytes(head[at : at + 4], "big")


def next_job_id(root: Path) -> int:
    """The job id the cluster goes on from (kept across down/up: an id is never reused)."""
    try:
        return max(int((root / "next_job_id").read_text().strip()), 1)
    except (OSError, ValueError):
        return 1
