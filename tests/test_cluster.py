"""`kit cluster` lifecycle on a second, throw-away cluster (its own KIT_HOME)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import kit, listening, require, wait_for

from kit.cluster import LocalCluster
from kit.cluster.processes import alive as _alive


@pytest.fixture
def home(tmp_path):
    require("slurmctld")
    home = tmp_path / "home"
    yield home
    LocalCluster(home).down(force=True)


def test_every_daemon_listens_on_its_own_address_alone(cluster):
    """Slurm's daemons bind every address of the machine unless told (CommunicationParameters):
    slurmctld and slurmdbd bind loopback alone, and so do the slurmds where the host's name resolves
    to loopback (a site's node name resolves to its own address; Slurm binds that one)."""
    from kit.cluster import config

    st = cluster.state()
    assert listening(st.pids["slurmctld"]) == {f"127.0.0.1:{st.ctld_port}"}
    assert listening(st.pids["slurmdbd"]) == {f"127.0.0.1:{st.dbd_port}"}
    assert st.nodes_bound == config.loopback_host(st.hostname)
    expected = "127.0.0.1" if st.nodes_bound else "0.0.0.0"
    assert [listening(st.pids[f"node{i}"]) for i in range(1, st.nodes + 1)] == [
        {f"{expected}:{port}"} for port in st.node_ports
    ]


def test_up_status_env_down(home, cluster):
    env = {"KIT_HOME": str(home)}
    public = LocalCluster(home).public  # root's cluster: what its clients read, where every user can
    assert public.parent == Path("/run/kit") and public.name.startswith("cluster-")
    conf = public / "slurm.conf"
    proc = kit("cluster", "status", env=env)
    assert proc.returncode == 1 and proc.stdout.startswith("local cluster: not running")

    proc = kit("cluster", "up", "--nodes", "2", "--cpus-per-node", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    assert re.match(
        r"local cluster started: 2 node\(s\) x 2 CPUs, with accounting \(sacct\) in [0-9.]+ s\n", proc.stdout
    )
    assert proc.stdout.splitlines()[1] == f"export SLURM_CONF={conf}"
    pids = json.loads((home / "cluster" / "cluster.json").read_text())["pids"]

    again = kit("cluster", "up", "--nodes", "2", "--cpus-per-node", "2", env=env)
    assert again.returncode == 0
    assert again.stdout.splitlines()[0] == "local cluster already running: 2 node(s) x 2 CPUs, with accounting (sacct)"
    assert json.loads((home / "cluster" / "cluster.json").read_text())["pids"] == pids

    other = kit("cluster", "up", "--nodes", "3", env=env)
    assert other.returncode == 2
    assert other.stderr.splitlines()[0] == (
        "kit: cluster: already running with 2 node(s), 2 CPUs and 0 GPUs per node, "
        "sharing this machine's network, with accounting"
    )

    status = kit("cluster", "status", env=env)
    assert status.returncode == 0
    lines = status.stdout.splitlines()
    assert lines[0] == f"local cluster: running ({home / 'cluster'})"
    # No pyxis and enroot here: the stand-in, and the status says so.
    assert (
        lines[1] == f"  containers: kit's pyxis stand-in {public / 'spank_kit_pyxis.so'} "
        "(no pyxis and enroot installed); create mode (each node unpacks the image before the step: "
        "enroot create)"
    )
    # munged: the cluster's own authentication; accounting: both installed by .ci/setup.
    assert [line.split()[0] for line in lines[2:]] == ["munged", "mariadbd", "slurmdbd", "slurmctld", "node1", "node2"]
    assert lines[6].split()[-1] == "idle"
    # What it runs is what the golden files pin (tests/test_cluster_config.py).
    from kit.cluster import config

    assert (public / "plugstack.conf").read_text() == config.plugstack_conf(
        "kit-pyxis", home / "cluster", str(public / "spank_kit_pyxis.so")
    )
    assert "KillWait" not in conf.read_text() and not (home / "cluster" / "enroot").exists()

    assert kit("cluster", "env", env=env).stdout == f"export SLURM_CONF={conf}\n"
    run = subprocess.run(
        ["srun", "-N2", "-l", "hostname"],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and len(run.stdout.splitlines()) == 2

    # A named container (kept on its node by --container-name) goes with the cluster.
    named = home / "cluster" / "enroot" / "node1" / "data" / "user-0" / "pyxis_kept"
    (named / "root").mkdir(parents=True)
    session_pids = dict(cluster.state().pids)
    down = kit("cluster", "down", env=env)
    assert down.returncode == 0 and down.stdout == "local cluster stopped\n"
    for name, pid in pids.items():
        assert not _alive(pid, _comm(name))
    assert not named.exists() and not public.exists()  # nothing of it left where every user reads
    # Exactly its own daemons: the session's cluster still runs.
    assert cluster.running() and cluster.state().pids == session_pids
    assert kit("cluster", "down", env=env).stdout == "local cluster: not running\n"


def test_up_repairs_stale_state(home, cluster):
    c = LocalCluster(home)
    st, started = c.up(nodes=2, cpus_per_node=2)
    assert started
    # A crash: every daemon killed hard, pid files, spool and state left behind.
    for pid in st.pids.values():
        os.kill(pid, signal.SIGKILL)
    # Every killed daemon gone (node2 still dying made `up` keep it, then find it dead).
    wait_for(lambda: not any(_alive(st.pids[n], c) for n, c, _ in c.daemons(st)), 10)
    assert not c.running()
    assert (home / "cluster" / "cluster.json").exists()
    st2, started = c.up(nodes=2, cpus_per_node=2)
    assert started and c.running()
    assert set(st2.pids.values()).isdisjoint(st.pids.values())

    # One slurmd dead: up starts only that one again; the controller keeps running.
    ctld = st2.pids["slurmctld"]
    os.kill(st2.pids["node2"], signal.SIGKILL)
    wait_for(lambda: not _alive(st2.pids["node2"], "slurmd"), 10)
    st3, started = c.up()
    assert started and c.running()
    assert st3.pids["slurmctld"] == ctld and _alive(ctld, "slurmctld")
    assert st3.pids["node2"] != st2.pids["node2"]
    assert cluster.running()


def test_up_restarts_a_daemon_that_dies_while_the_others_restart(home, cluster):
    """slurmctld and node1 killed, node2 killed a moment later (still
    alive when `up` looks): `up` restarts node2 too, saying so, instead of failing with
    "node2 exited while starting"."""
    c = LocalCluster(home)
    st, _ = c.up(nodes=2, cpus_per_node=2)
    for name in ("slurmctld", "node1"):
        os.kill(st.pids[name], signal.SIGKILL)
    wait_for(lambda: not _alive(st.pids["slurmctld"], "slurmctld") and not _alive(st.pids["node1"], "slurmd"), 10)
    said = []

    def progress(msg):
        said.append(msg)
        if msg.startswith("restarting"):
            os.kill(st.pids["node2"], signal.SIGKILL)  # dies while the others restart

    st2, started = c.up(progress=progress)
    assert started and c.running(), said
    assert st2.pids["node2"] != st.pids["node2"] and _alive(st2.pids["node2"], "slurmd")
    assert any("node2 exited while the others restarted" in m and "restarting it too" in m for m in said), said


def test_down_cancels_running_jobs(home, cluster, tmp_path):
    c = LocalCluster(home)
    c.up(nodes=1, cpus_per_node=1)
    env = {**os.environ, **c.target.env}
    job = subprocess.run(
        ["sbatch", "--parsable", "--wrap", "sleep 317", f"--output={tmp_path}/out"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    wait_for(
        lambda: (
            "R"
            in subprocess.run(["squeue", "-h", "-j", job, "-o", "%t"], env=env, capture_output=True, text=True).stdout
        ),
        20,
    )
    refused = kit("cluster", "down", env={"KIT_HOME": str(home)})
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == f"kit: cluster: 1 job(s) still active: {job}"
    assert c.running()
    assert c.down(force=True)
    left = subprocess.run(["pgrep", "-f", "sleep 317"], capture_output=True, text=True).stdout.split()
    assert left == []


@pytest.mark.cluster  # its daemons start until slurmctld's refusal
def test_a_failed_start_leaves_no_cluster_for_users_to_find(home, monkeypatch):
    """A start that fails midway (here: slurmctld refused) took its daemons down and its record away, but left its
    clients' directory under /run/kit (every user's kit looks there for the machine's clusters). Gone too."""
    from kit.errors import KitError

    real = LocalCluster._start_daemon

    def refused(self, st, name, **kw):
        if name == "slurmctld":
            raise KitError("slurmctld refused (the test)", field="cluster")
        return real(self, st, name, **kw)

    monkeypatch.setattr(LocalCluster, "_start_daemon", refused)
    c = LocalCluster(home)
    with pytest.raises(KitError, match="refused"):
        c.up(nodes=1, accounting=False)
    assert not c.public.exists() and c.state() is None and c.leftover_daemons() == {}


def test_an_unreadable_state_file_is_not_started_over(home):
    """A second cluster over a first one's state would orphan its daemons."""
    (home / "cluster").mkdir(parents=True)
    (home / "cluster" / "cluster.json").write_text("{not json")
    proc = kit("cluster", "up", env={"KIT_HOME": str(home)})
    assert proc.returncode == 1
    assert (
        proc.stderr.splitlines()[0]
        == f"kit: cluster: {home / 'cluster' / 'cluster.json'} is unreadable: not starting a second cluster over it"
    )
    assert not LocalCluster(home).conf.exists()


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_lost_state_file_neither_starts_a_second_cluster_nor_hides_the_first(home, cluster, damage):
    """With cluster.json damaged or gone, `up` refuses and
    names the daemons still running; `down` finds them by their directory."""
    c = LocalCluster(home)
    st, _ = c.up(nodes=2, cpus_per_node=1)
    state = home / "cluster" / "cluster.json"
    if damage == "corrupt":
        state.write_text('{"nodes": 2, "pi')
    else:
        state.unlink()
    env = {"KIT_HOME": str(home)}
    up = kit("cluster", "up", env=env)
    assert up.returncode == 1, up.stderr
    first = up.stderr.splitlines()[0]
    assert first.startswith(f"kit: cluster: {state} is {'unreadable' if damage == 'corrupt' else 'missing'} and ")
    assert f"slurmctld (pid {st.pids['slurmctld']})" in first and f"slurmd (pid {st.pids['node2']})" in first
    assert all(_alive(pid, _comm(n)) for n, pid in st.pids.items())
    down = kit("cluster", "down", env=env)
    assert down.returncode == 0 and down.stdout == "local cluster stopped\n", down.stderr
    assert not any(_alive(pid, _comm(n)) for n, pid in st.pids.items())
    assert c.leftover_daemons() == {}
    assert cluster.running()  # the session's cluster is not touched
    again = kit("cluster", "up", "--nodes", "1", "--cpus-per-node", "1", env=env)
    assert again.returncode == 0, again.stderr


def _comm(name: str) -> str:
    """The program of the cluster's daemon ``name`` (munged, slurmctld, nodeK)."""
    return name if name in ("slurmctld", "munged", "mariadbd", "slurmdbd") else "slurmd"


def test_status_names_the_plugin_the_cluster_was_started_with(home, monkeypatch):
    """The plugin is recorded at `up`, not looked up again in the
    caller's environment (`pyxis None` without KIT_PYXIS_PLUGIN)."""
    from dataclasses import asdict

    from kit.cluster.state import ClusterState

    monkeypatch.delenv("KIT_PYXIS_PLUGIN", raising=False)
    (home / "cluster").mkdir(parents=True)
    st = ClusterState(
        nodes=2,
        cpus_per_node=2,
        gpus_per_node=0,
        memory_mb=1000,
        hostname="h",
        ctld_port=1,
        node_ports=[2, 3],
        containers="pyxis",
        container_plugin="/opt/pyxis 0.24/spank_pyxis.so",
    )
    (home / "cluster" / "cluster.json").write_text(json.dumps(asdict(st)))
    assert LocalCluster(home).containers_description().startswith("pyxis /opt/pyxis 0.24/spank_pyxis.so, ")
