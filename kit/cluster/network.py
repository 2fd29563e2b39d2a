"""``kit cluster up --isolated-network``: every slurmd in a network namespace of its own,
with its own address on a bridge kit creates (and ``down`` removes), as the nodes of a
real cluster are separate hosts.

Addresses come from 198.18.0.0/15 (RFC 2544: for benchmarking, never routed off a
machine): one /24 per cluster, ``198.18.K.1`` the host's end of the bridge (slurmctld,
Prometheus and every client command reach the nodes there) and ``198.18.K.(10+i)``
node ``i``'s ``eth0``. A node reaches the host and the other nodes over the bridge and
nothing else (no route beyond it). Names carry the cluster's id (a hash of its
directory), so two clusters on one machine never share a bridge or a namespace; two started at
once choose their /24 one after the other (:func:`choosing`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit.errors import KitError

RANGE = ipaddress.ip_network("198.18.0.0/15")
FIRST_NODE = 10
LOCK = Path("/run/kit-isolated-network.lock")  # /run: only root makes files there, and only root makes networks


@contextlib.contextmanager
def choosing():
    """Held from :func:`plan` to the end of :func:`create`: a /24 seen free is still free when its bridge is made
    (two clusters coming up at once, as two test sessions' do, took the same one)."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass
class Network:
    bridge: str
    host: str  # the bridge's address on the host (slurmctld, Prometheus)
    prefix: int
    namespaces: dict[str, str] = field(default_factory=dict)  # node -> namespace name
    addresses: dict[str, str] = field(default_factory=dict)  # node -> its address

    def as_dict(self) -> dict:
        return asdict(self)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise KitError(
            f"ip {' '.join(args)}: {proc.stderr.strip()}",
            field="--isolated-network",
            exit_code=1,
            hint="it needs root (CAP_NET_ADMIN) and iproute2",
        )
    return proc


def _used_subnets() -> set[int]:
    """The third octets of 198.18.K.0/24 already on this machine's interfaces."""
    out = _ip("-j", "-4", "addr", "show", check=False).stdout or "[]"
    used = set()
    for link in json.loads(out):
        for a in link.get("addr_info", []):
            addr = ipaddress.ip_address(a.get("local", "0.0.0.0"))
            if addr in RANGE:
                used.add(int(str(addr).split(".")[2]) + (256 if str(addr).startswith("198.19.") else 0))
    return used


def _tag(root: Path) -> str:
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:6]


def found(root: Path) -> Network | None:
    """What exists on this machine of the network of the cluster at ``root``, record or not."""
    tag = _tag(root)
    names = [n for n in _ip("netns", "list", check=False).stdout.split() if n.startswith(f"kit-{tag}-node")]
    bridge = f"kitbr-{tag}"
    has_bridge = _ip("link", "show", bridge, check=False).returncode == 0
    if not names and not has_bridge:
        return None
    return Network(bridge=bridge, host="", prefix=24, namespaces={n.rsplit("-", 1)[1]: n for n in names})


def plan(root: Path, nodes: int) -> Network:
    """Names and addresses for ``nodes`` nodes of the cluster at ``root`` (nothing created)."""
    tag = _tag(root)
    used = _used_subnets()
    k = next((k for k in range(512) if k not in used), None)
    if k is None:
        raise KitError("every /24 of 198.18.0.0/15 is in use on this machine", field="--isolated-network", exit_code=1)
    base = f"198.{18 + k // 256}.{k % 256}"
    net = Network(bridge=f"kitbr-{tag}", host=f"{base}.1", prefix=24)
    for i in range(1, nodes + 1):
        net.namespaces[f"node{i}"] = f"kit-{tag}-node{i}"
        net.addresses[f"node{i}"] = f"{base}.{FIRST_NODE + i}"
    return net


def _veth(net: Network, node: str) -> str:
    return f"kv{net.bridge[6:]}{node[4:]}"[:15]


def create(net: Network) -> None:
    """The bridge, then per node a namespace with ``lo`` and ``eth0`` (a veth whose other end
    is on the bridge) and a route to the host; on failure whatever was made is removed."""
    try:
        _ip("link", "add", net.bridge, "type", "bridge")
        _ip("addr", "add", f"{net.host}/{net.prefix}", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        for node, ns in net.namespaces.items():
            _ip("netns", "add", ns)
            veth = _veth(net, node)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", net.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{net.addresses[node]}/{net.prefix}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", net.host)
    except BaseException:
        remove(net)
        raise


def clear_leftover(root: Path, progress) -> None:
    """A network of the cluster at ``root`` left by one whose directory was lost (a crash, a wiped
    state directory): removed before a new one is made, unless a process still runs in it."""
    from kit.cluster import processes

    left = found(root)
    if left is None:
        return
    inside = [pid for pid in pids_inside(left) if processes.alive(pid, processes.comm(pid))]
    if inside:
        raise KitError(
            f"a network of this cluster ({left.bridge}) is left from an earlier one and "
            f"{len(inside)} process(es) still run in it: not starting a new cluster over it",
            field="cluster",
            exit_code=1,
            hint="`kit cluster down --force` stops them and removes it, then `kit cluster up`",
        )
    progress(
        f"removing the network an earlier cluster here left: {', '.join([left.bridge, *left.namespaces.values()])}"
    )
    remove(left)


def pids_inside(net: Network) -> list[int]:
    """Every process still in one of the cluster's namespaces."""
    out = []
    for ns in net.namespaces.values():
        out += [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
    return out


def remove(net: Network) -> None:
    """The veths (both ends at once: a namespace's are otherwise freed later, by the kernel's
    own work queue), the namespaces and the bridge; what is already gone is fine."""
    for node, ns in net.namespaces.items():
        _ip("link", "del", _veth(net, node), check=False)
        _ip("netns", "del", ns, check=False)
    _ip("link", "del", net.bridge, check=False)


def leftovers(net: Network) -> list[str]:
    """What of the network still exists (for tests and `down`'s check)."""
    names = set(_ip("netns", "list", check=False).stdout.split())
    left = [ns for ns in net.namespaces.values() if ns in names]
    links = _ip("-o", "link", "show", check=False).stdout
    left += [
        name
        for name in (net.bridge, *(_veth(net, n) for n in net.namespaces))
        if f" {name}:" in links or f" {name}@" in links
    ]
    return left


def enter(net: Network | None, node: str, argv: list[str]) -> list[str]:
    """``argv`` run inside ``node``'s namespace (as is without an isolated network)."""
    if net is None or node not in net.namespaces:
        return argv
    return ["nsenter", f"--net=/run/netns/{net.namespaces[node]}", "--", *argv]


def from_dict(data: dict | None) -> Network | None:
    return Network(**data) if isinstance(data, dict) else None


def host_address(st) -> str:
    """The host's one address in the cluster (``st``: a ClusterState): the isolated network's host end,
    else loopback. slurmctld and slurmdbd bind it alone; the nodes and every client reach them there."""
    net = getattr(st, "network", None)
    return net["host"] if net else "127.0.0.1"


def available() -> str | None:
    """Why an isolated network cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "it needs root (network namespaces and a bridge)"
    for tool in ("ip", "nsenter"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} not found (apt-get install -y iproute2 util-linux)"
    if shutil.which("munged") is None:  # auth/none is loopback's alone: off it, any peer could claim root
        return "munged not found: without it Slurm trusts the uid every client claims (apt-get install -y munge)"
    return None
