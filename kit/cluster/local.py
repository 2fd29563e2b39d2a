"""The local cluster's face (:class:`LocalCluster`): ``up`` (idempotent: it repairs a cluster whose daemons died),
``status``, ``down`` (exactly the daemons ``up`` started, by pid), its Slurm as a :class:`~kit.slurm.Target`; the
daemons themselves start and are waited for in :mod:`~kit.cluster.daemons`."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from kit import files
from kit.cluster import accounting as accounting_
from kit.cluster import config, layout, network, plugin, processes, public, teardown
from kit.cluster.daemons import Daemons
from kit.cluster.prometheus import start as start_prometheus
from kit.cluster.state import ClusterState, DaemonStatus
from kit.errors import KitError
from kit.home import kit_home
from kit.slurm import Target

REQUIRED = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
INSTALL_HINT = "install Debian's Slurm: apt-get install -y slurm-wlm"


class LocalCluster(Daemons):
    def __init__(self, home: Path | None = None):
        self.home = home or kit_home()
        self.root = self.home / "cluster"
        self.public = public.of(self.root)  # what its clients read (kit.cluster.public)
        self.conf = self.public / "slurm.conf"
        self.state_file = self.root / "cluster.json"

    # ------------------------------------------------------------ state
    @property
    def target(self) -> Target:
        return Target(conf=str(self.conf), name="local")

    def state(self) -> ClusterState | None:
        try:
            return ClusterState(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def daemons(self, st: ClusterState) -> list[tuple[str, str, int]]:
        """(name, comm, port) of every daemon of ``st``."""
        prom = [("prometheus", "prometheus", st.prometheus_port)] if st.prometheus_port else []
        munge = [("munged", "munged", 0)] if st.auth == "munge" else []
        dbd = [("mariadbd", "mariadbd", 0), ("slurmdbd", "slurmdbd", st.dbd_port)] if st.dbd_port else []
        return (
            munge
            + dbd
            + [("slurmctld", "slurmctld", st.ctld_port)]
            + [(f"node{i}", "slurmd", port) for i, port in enumerate(st.node_ports, 1)]
            + prom
        )

    @property
    def prometheus_targets(self) -> Path:
        """Prometheus's file_sd directory (root's, 0755, where every user reaches it): a directory per user in
        it (``<name>/``, theirs, made by the Prolog), each target labelled ``owner`` by it."""
        return self.public / config.TARGETS

    def prometheus_url(self) -> str | None:
        st = self.state()
        return f"http://127.0.0.1:{st.prometheus_port}" if st and st.prometheus_port else None

    def running(self) -> bool:
        st = self.state()
        return bool(st) and all(processes.alive(st.pids.get(n), c) for n, c, _ in self.daemons(st))

    def controller_alive(self) -> bool:
        """Its slurmctld runs (Slurm commands answer, even with a node down)."""
        st = self.state()
        return bool(st) and processes.alive(st.pids.get("slurmctld"), "slurmctld")

    def status(self) -> list[DaemonStatus]:
        st = self.state()
        if st is None:
            return []
        node_states = {}
        if self.running():
            out = self.target.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], check=False).stdout
            node_states = dict(line.split(None, 1) for line in out.splitlines() if " " in line)
        return [
            DaemonStatus(
                name,
                st.pids.get(name),
                port,
                processes.alive(st.pids.get(name), comm),
                node_states.get(name, "").strip(),
            )
            for name, comm, port in self.daemons(st)
        ]

    @contextmanager
    def _lock(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    # ------------------------------------------------------------ up
    def up(
        self,
        nodes: int | None = None,
        cpus_per_node: int | None = None,
        gpus_per_node: int | None = None,
        timeout: float = 30.0,
        progress=lambda msg: None,
        prometheus: bool = False,
        isolated_network: bool | None = None,
        accounting: bool | None = None,
        squashfuse: bool | None = None,
        container_scope: str | None = None,
    ) -> tuple[ClusterState, bool]:
        """Start the cluster, or bring back the daemons of one that died. Returns (state, started_now).

        A cluster whose state is here keeps it: only dead daemons are started again (slurmctld recovers
        its jobs and job ids from its saved state), so jobs that survived on the other daemons run on.
        Shape arguments left out (None) mean "as it is" (or 2 nodes, this machine's CPUs, no GPUs;
        accounting when slurmdbd and MariaDB are installed; create mode; pyxis's global container
        scope). Container mode and scope change on a running cluster too: each new step reads them.
        """
        _require_tools(prometheus)
        with self._lock():
            st = self.state()
            if st is None:
                self._refuse_over_leftovers()
            shape = (
                nodes if nodes is not None else (st.nodes if st else 2),
                cpus_per_node or (st.cpus_per_node if st else os.cpu_count() or 1),
                gpus_per_node if gpus_per_node is not None else (st.gpus_per_node if st else 0),
            )
            isolated = isolated_network if isolated_network is not None else bool(st and st.network)
            mode = plugin.choose_mode(squashfuse, container_scope, st)
            counted = _accounting(accounting, st, progress)
            if isolated and (why := network.available()):
                raise KitError(f"cannot isolate the nodes' network: {why}", field="--isolated-network", exit_code=1)
            for label, value, low in (
                ("--nodes", shape[0], 1),
                ("--cpus-per-node", shape[1], 1),
                ("--gpus-per-node", shape[2], 0),
            ):
                if value < low:
                    raise KitError(f"must be at least {low}, got {value}", field=label)
            if st:
                dead = [(n, c) for n, c, _ in self.daemons(st) if not processes.alive(st.pids.get(n), c)]
                same = (st.nodes, st.cpus_per_node, st.gpus_per_node, bool(st.network), bool(st.dbd_port)) == (
                    *shape,
                    isolated,
                    counted,
                )
                if not same and len(dead) < len(self.daemons(st)):
                    raise _already_running(st)
                if same and (self.conf.exists() or len(dead) < len(self.daemons(st))):  # after a reboot: /run's gone
                    return st, self._repair(st, dead, mode, prometheus, timeout, progress)
                progress("every daemon of the earlier cluster is gone: starting a new one")
                teardown.end_job_processes(self.conf, progress)
            network.clear_leftover(self.root, progress)
            layout.clean(self.root, self.state_file)
            st = self._start(*shape, timeout, progress, isolated, counted, mode)
            if prometheus:
                try:
                    start_prometheus(self, st, timeout, progress)
                except BaseException:
                    teardown.stop(self, st)
                    raise
                self.save(st)
            return st, True

    def _refuse_over_leftovers(self) -> None:
        """No record of a cluster here: refuse to start one over an unreadable record or daemons still running."""
        leftover = self.leftover_daemons()
        if self.state_file.exists() or leftover:
            what = "is unreadable" if self.state_file.exists() else "is missing"
            running = f" and {processes.describe(leftover)} of it still run" if leftover else ""
            raise KitError(
                f"{self.state_file} {what}{running}: not starting a second cluster over it",
                field="cluster",
                exit_code=1,
                hint="`kit cluster down` stops what is left of it (daemons and job processes, "
                "found by its directory), then `kit cluster up` starts afresh",
            )

    def _repair(
        self, st: ClusterState, dead, mode: tuple[bool, str], prometheus: bool, timeout: float, progress
    ) -> bool:
        """`up` on a running cluster of the same shape: switch the container mode and scope (the
        next step's slurmstepd reads them), start the dead daemons, resume held nodes, add
        Prometheus. Returns whether anything was started or resumed."""
        if (st.squashfuse, st.container_scope) != mode:
            plugin.check_scope(st.containers, mode[1])
            st.squashfuse, st.container_scope = mode
            layout.write_plugstack(self.root, st)
            self.save(st)
            progress(f"containers from the next job step on: {plugin.mode_description(*mode)}")
        if dead:
            self._restart(st, [n for n, _ in dead], timeout, progress)
        resumed = self._resume_nodes(progress)
        if prometheus and not st.prometheus_port:
            start_prometheus(self, st, timeout, progress)
            self.save(st)
        return bool(dead or resumed)

    def _start(
        self,
        nodes: int,
        cpus: int,
        gpus: int,
        timeout: float,
        progress,
        isolated: bool = False,
        counted: bool = False,
        mode: tuple[bool, str] = (False, "global"),
    ) -> ClusterState:
        ports = processes.free_ports(nodes + 2)
        st = ClusterState(
            nodes=nodes,
            cpus_per_node=cpus,
            gpus_per_node=gpus,
            memory_mb=processes.memory_mb(),
            hostname=socket.gethostname().split(".")[0],
            ctld_port=ports[0],
            node_ports=ports[1:-1],
            dbd_port=ports[-1] if counted else None,
            squashfuse=mode[0],
            container_scope=mode[1],
        )
        # The record first (`down` finds what to remove); a failed start removes it too (no half-made cluster).
        try:
            if isolated:
                with network.choosing():
                    net = network.plan(self.root, nodes)
                    st.network = net.as_dict()
                    self.save(st)
                    progress(
                        f"isolated network: bridge {net.bridge} at {net.host}, "
                        + ", ".join(f"{n} {a}" for n, a in net.addresses.items())
                    )
                    network.create(net)
            st.containers = plugin.prepare(self.root, progress)
            plugin.check_scope(st.containers, st.container_scope)
            if st.containers:
                st.container_plugin = plugin.plugin_of(self.root, st)
            config.choose_auth(st, shutil.which("munged") is not None, progress)
            layout.write(self.root, self.conf, st)
            self.save(st)
            if st.auth == "munge":
                progress("starting munged (the cluster's own key and socket)")
                self._start_daemon(st, "munged")
            if st.dbd_port:
                progress(
                    f"starting accounting: mariadbd (socket only, data kept in {accounting_.directory(self.root)}), "
                    f"slurmdbd on port {st.dbd_port}"
                )
                self._start_daemon(st, "mariadbd")
                self._start_daemon(st, "slurmdbd")
            progress(f"starting slurmctld on port {st.ctld_port}")
            self._start_daemon(st, "slurmctld", clear=True)
            for i in range(1, nodes + 1):
                progress(f"starting slurmd node{i} on port {st.node_ports[i - 1]}")
                self._start_daemon(st, f"node{i}")
            self._wait_idle(st, timeout)
        except BaseException:
            teardown.stop(self, st)
            teardown.remove_network(self.root, lambda msg: None)
            layout.clean(self.root, self.state_file)  # its clients' directory too: no half-made cluster for users
            raise
        return st

    def containers_description(self) -> str:
        """Which plugin runs container jobs (``kit cluster status``)."""
        return plugin.description(self.root, self.state())

    def save(self, st: ClusterState) -> None:
        files.write_atomic(self.state_file, json.dumps(asdict(st), indent=2) + "\n")

    # ------------------------------------------------------------ down
    def down(self, progress=lambda msg: None, force: bool = False) -> bool:
        """Stop the cluster: its jobs (only with ``force`` while any is active), its
        daemons, and every process of its jobs, even those slurmctld no longer
        knows about. False if there was no cluster."""
        with self._lock():
            st = self.state()
            if st is None:
                # No record (lost or damaged): whatever still runs from this
                # directory is found by it, and stopped.
                leftover = self.leftover_daemons()
                if not leftover and not self.state_file.exists():
                    return False
                if leftover:
                    progress(
                        f"{self.state_file} is missing or unreadable: stopping {processes.describe(leftover)} "
                        "found running from it"
                    )
                teardown.end_job_processes(self.conf, progress)
                processes.stop_pids({p: c for p, c in leftover.items() if c == "slurmd"})
                processes.stop_pids(leftover)
                teardown.remove_network(self.root, progress)
                layout.clean(self.root, self.state_file)
                return True
            if not force and processes.alive(st.pids.get("slurmctld"), "slurmctld"):
                active = teardown.active_jobs(self.target)
                if active:
                    raise KitError(
                        f"{len(active)} job(s) still active: {', '.join(active)}",
                        field="cluster",
                        exit_code=1,
                        hint="wait for them, or `kit cluster down --force` to cancel them",
                    )
            teardown.stop(self, st, progress)
            teardown.end_job_processes(self.conf, progress)
            teardown.remove_network(self.root, progress)
            layout.clean(self.root, self.state_file)
            return True

    def leftover_daemons(self) -> dict[int, str]:
        """pid -> program of this cluster's daemons found by their command lines
        (each names a file under this cluster's directory), record or not."""
        return processes.daemons_under(
            (self.root, self.public), ("slurmctld", "slurmd", "prometheus", "munged", "mariadbd", "slurmdbd")
        )


def _require_tools(prometheus: bool) -> None:
    for tool in REQUIRED:
        if shutil.which(tool) is None:
            raise KitError(f"{tool} not found", field="cluster", hint=INSTALL_HINT, exit_code=1)
    if prometheus and shutil.which("prometheus") is None:
        raise KitError(
            "prometheus not found",
            field="--prometheus",
            exit_code=1,
            hint="install Debian's Prometheus: apt-get install -y prometheus",
        )


def _accounting(asked: bool | None, st: ClusterState | None, progress) -> bool:
    """Whether the cluster keeps accounting: as asked, else as it is, else when slurmdbd and MariaDB are here."""
    lacking = accounting_.missing()
    counted = asked if asked is not None else (bool(st.dbd_port) if st else not lacking)
    if asked and lacking:
        raise KitError(
            f"{', '.join(lacking)} not found", field="--accounting", exit_code=1, hint=accounting_.INSTALL_HINT
        )
    if not st and asked is None and not counted:
        progress(
            f"no accounting ({', '.join(lacking)} not installed): sacct and seff will not "
            f"answer; {accounting_.INSTALL_HINT}"
        )
    return counted


def _already_running(st: ClusterState) -> KitError:
    return KitError(
        f"already running with {st.nodes} node(s), {st.cpus_per_node} CPUs and "
        f"{st.gpus_per_node} GPUs per node"
        + (", each in a network of its own" if st.network else ", sharing this machine's network")
        + (", with accounting" if st.dbd_port else ", without accounting"),
        field="cluster",
        hint="run `kit cluster down` first to change its shape",
    )
