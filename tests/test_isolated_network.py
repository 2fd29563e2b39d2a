"""Nodes with their own network: `kit cluster up --isolated-network`
runs each slurmd in a network namespace of its own, at its own address on a bridge; jobs
rendezvous across it, the exporters are scraped at their nodes' addresses by the real
Prometheus, and `down` leaves no namespace, link or process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers import ALL_REDUCE, kit, launch_and_wait, listening, read_logs, require

from kit.cluster import LocalCluster, network
from kit.errors import KitError

pytestmark = pytest.mark.cluster  # every test here starts a cluster of its own (or fails to)


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    require("slurmctld")
    require("prometheus")
    home = tmp_path_factory.mktemp("kit-home-isolated")
    c = LocalCluster(home)
    c.up(nodes=2, cpus_per_node=2, prometheus=True, isolated_network=True)
    yield c
    c.down(force=True)  # when a test stopped before the last one did


def launch(c: LocalCluster, tmp_path: Path, *args: str, command: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    return launch_and_wait(tmp_path, *args, command=command, env={"KIT_HOME": str(c.home)})


def query(c: LocalCluster, promql: str) -> list:
    url = c.prometheus_url() + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]


def test_each_node_has_its_own_address(isolated):
    net = network.from_dict(isolated.state().network)
    addresses = sorted(net.addresses.values())
    assert all(a.startswith("198.1") for a in addresses) and len(set(addresses)) == 2
    conf = isolated.conf.read_text()
    assert f"({net.host})" in conf and all(f"NodeAddr={a} " in conf for a in addresses)
    for node, ns in net.namespaces.items():
        seen = subprocess.run(
            ["ip", "-n", ns, "-o", "-4", "addr", "show", "dev", "eth0"], capture_output=True, text=True
        ).stdout
        assert f" {net.addresses[node]}/24 " in seen


def test_the_host_daemons_listen_on_the_bridge_address_alone(isolated):
    """slurmctld and slurmdbd bind the host's end of the bridge, never every address of the machine
    (Slurm's default, reachable from any other cluster's namespace); each slurmd listens in its own
    namespace, which holds its address and loopback alone."""
    st = isolated.state()
    net = network.from_dict(st.network)
    assert listening(st.pids["slurmctld"]) == {f"{net.host}:{st.ctld_port}"}
    assert listening(st.pids["slurmdbd"]) == {f"{net.host}:{st.dbd_port}"}
    for i, port in enumerate(st.node_ports, 1):
        pid = st.pids[f"node{i}"]
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert listening(pid) == {f"0.0.0.0:{port}"}


def test_a_two_node_trainer_job_rendezvouses_across_the_bridge_and_is_scraped_there(isolated, tmp_path):
    net = network.from_dict(isolated.state().network)
    probe = (
        'echo "master=$MASTER_ADDR me=$(hostname -I | tr -d " ") gloo=$GLOO_SOCKET_IFNAME"; '
        "exec python3 -m kit.train --max-steps 60 --step-delay 0.1 --log-every 20"
    )
    proc, job_dir = launch(isolated, tmp_path, "--nodes", "2", command=["bash", "-c", probe])
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    logs = read_logs(job_dir)
    seen = dict(re.findall(r"^(\d): master=(\S+) me=", logs, re.M))
    assert seen == {"0": net.addresses["node1"], "1": net.addresses["node1"]}, logs  # node1's, not a loopback
    me = set(re.findall(r"me=(\S+)", logs))
    assert me == set(net.addresses.values()), logs
    assert "done at step=60" in logs and len(re.findall(r"gloo=eth0", logs)) == 2
    # The exporters advertised their nodes' addresses, and Prometheus scraped them there (over the job's time: the
    # job has ended, and a target gone from its file leaves a stale series, which an instant query does not show).
    job_id = (job_dir / "job_id").read_text().strip()
    rows = query(isolated, f'max_over_time(up{{slurm_job_id="{job_id}"}}[10m])')
    assert {r["metric"]["instance"].rsplit(":", 1)[0] for r in rows} == set(net.addresses.values()), rows
    steps = query(isolated, f'max_over_time(training_step{{slurm_job_id="{job_id}"}}[10m])')
    assert {r["metric"]["node"] for r in steps} == {"node1", "node2"}, steps


def test_master_interface_and_torchrun_across_the_bridge(isolated, tmp_path):
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun is not on PATH (it comes with torch)"
    (tmp_path / "ddp.py").write_text(ALL_REDUCE)
    proc, job_dir = launch(
        isolated,
        tmp_path,
        "--nodes",
        "2",
        "--ntasks-per-node",
        "1",
        "--no-exporter",
        "--master-interface",
        "eth0",
        command=[
            "bash",
            "-c",
            'echo "master=$MASTER_ADDR"; exec "$@"',
            "run",
            torchrun,
            "--nproc-per-node",
            "2",
            str(tmp_path / "ddp.py"),
        ],
    )
    assert proc.returncode == 0, proc.stderr + read_logs(job_dir)
    logs = read_logs(job_dir)
    node1 = network.from_dict(isolated.state().network).addresses["node1"]
    assert set(re.findall(r"master=(\S+)", logs)) == {node1}
    lines = re.findall(r"rank=(\d) world=(\d+) sum=([0-9.]+)", logs)
    assert sorted(r for r, _, _ in lines) == ["0", "1", "2", "3"] and {(w, s) for _, w, s in lines} == {("4", "6.0")}
    bad = kit(
        "launch",
        "--local",
        "--wait",
        "--no-exporter",
        "--master-interface",
        "eth9",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--",
        "true",
        env={"KIT_HOME": str(isolated.home)},
        cwd=tmp_path,
        timeout=120,
    )
    assert bad.returncode != 0


@pytest.fixture
def loopback_hostname():
    """/etc/hosts maps this host's name to 127.0.1.1 first, as Debian and Ubuntu install it:
    gloo, left to itself, then binds a loopback address the other nodes cannot reach."""
    hosts = Path("/etc/hosts")
    before = hosts.read_text()
    name = socket.gethostname()
    kept = [line for line in before.splitlines() if name not in line.split("#")[0].split()[1:]]
    hosts.write_text("\n".join([f"127.0.1.1\t{name}", *kept]) + "\n")  # in place: /etc/hosts may be a mount
    try:
        assert socket.gethostbyname(name) == "127.0.1.1"
        yield name
    finally:
        hosts.write_text(before)


PROBE = (
    'echo "gloo=${GLOO_SOCKET_IFNAME-} ip=$(command -v ip || echo none)"; '
    "exec python3 -m kit.train --max-steps 20 --log-every 10"
)


@pytest.mark.machine_wide  # /etc/hosts: run alone (tests/conftest.py)
def test_a_ddp_job_in_kits_image_forms_one_world_where_the_host_name_is_loopback(
    isolated, cpu_image, tmp_path, loopback_hostname
):
    """kit's own image has no `ip`; the launcher still finds
    the interface that reaches the master (/proc/net/route), so the two nodes form one world
    on their addresses, with a bridge, a second address and an interface after eth0 on
    each node (a node with eth0 alone: every other job of this module)."""

    def run(label: str) -> None:
        (tmp_path / label).mkdir()
        proc, job_dir = launch(
            isolated,
            tmp_path / label,
            "--nodes",
            "2",
            "--no-exporter",
            "--image",
            str(cpu_image),
            command=["bash", "-c", PROBE],
        )
        logs = read_logs(job_dir)
        assert proc.returncode == 0, proc.stderr + logs
        assert len(re.findall(r"^\d: gloo=eth0 ip=none$", logs, re.M)) == 2, logs
        assert "done at step=20" in logs, logs

    net = network.from_dict(isolated.state().network)
    for i, ns in enumerate(sorted(net.namespaces.values()), 1):
        script = [
            "ip link add docker0 index 7000 type bridge",
            "ip addr add 172.17.0.1/16 dev docker0",
            "ip link set docker0 up",
            "ip link add ib0 index 7001 type veth peer name ib0p index 7002",
            f"ip addr add 192.168.77.{i}/24 dev ib0",
            "ip link set ib0 up",
            "ip link set ib0p up",
            f"ip addr add 10.77.{i}.1/24 dev eth0",
        ]
        subprocess.run(["ip", "netns", "exec", ns, "bash", "-ec", "\n".join(script)], check=True)
    run("busy")


def test_down_leaves_no_namespace_link_or_process(isolated):
    net = network.from_dict(isolated.state().network)
    assert network.leftovers(net)  # there now
    isolated.down(force=True)
    assert network.leftovers(net) == [] and network.found(isolated.home / "cluster") is None
    assert isolated.leftover_daemons() == {}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert net.bridge not in links
    assert not any(
        ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for ns in net.namespaces.values()
    )


def test_up_after_a_crash_that_lost_the_cluster_directory(tmp_path):
    """The daemons killed and the cluster's directory lost, its network stays
    behind; the next `up --isolated-network` removes it and starts at once (not "File exists",
    no half-written record to repair from)."""
    c = LocalCluster(tmp_path / "home")
    c.up(nodes=1, cpus_per_node=1, isolated_network=True)
    try:
        net = network.from_dict(c.state().network)
        pids = list(c.state().pids.values())
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(c.root)
        assert network.leftovers(net)  # the crash left the network
        said = []
        st, started = c.up(nodes=1, cpus_per_node=1, isolated_network=True, progress=said.append)
        assert started and c.running() and st.network["bridge"] == net.bridge
        assert any(m.startswith("removing the network an earlier cluster here left: " + net.bridge) for m in said), said
    finally:
        c.down(force=True)
    assert network.leftovers(net) == [] and not c.state_file.exists()


def test_a_failed_start_leaves_no_record_to_repair_from(tmp_path, monkeypatch):
    """A start that fails (here: the bridge cannot be made) removes what
    it made and its record, so the next `up` starts afresh."""
    c = LocalCluster(tmp_path / "home")

    def refuse(net):
        raise KitError("ip link add: refused", field="--isolated-network", exit_code=1)

    monkeypatch.setattr(network, "create", refuse)
    with pytest.raises(KitError, match="refused"):
        c.up(nodes=1, cpus_per_node=1, isolated_network=True)
    assert not c.state_file.exists() and network.found(c.root) is None
