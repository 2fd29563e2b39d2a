"""kit's local Slurm cluster: one slurmctld and N slurmd daemons on this machine.

Debian's slurm-wlm runs several slurmd on one host with ``slurmd -N NAME``:
each NodeName (node1, node2, ...) gets NodeHostname = this host and a port of
its own. GPUs are count-only GRES, so ``--gpus-per-node`` requests schedule.
Everything lives under ``$KIT_HOME/cluster``; ``up`` is idempotent and
repairs stale state, ``down`` stops exactly the daemons ``up`` started (by pid).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit import files
from kit.cluster import config
from kit.errors import KitError
from kit.home import kit_home  # noqa: F401  (kit.cluster.kit_home, as before)
from kit.monitor.naming import relabel_yaml
from kit.runner import run
from kit.slurm import Target

REQUIRED = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
INSTALL_HINT = "install Debian's Slurm: apt-get install -y slurm-wlm"


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


@dataclass
class DaemonStatus:
    name: str
    pid: int | None
    port: int
    alive: bool
    state: str = ""


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports that bind right now (the kernel picks them)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _alive(pid: int | None, comm: str) -> bool:
    """True if ``pid`` runs and is the program ``comm`` (not a recycled pid)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    name = stat[stat.index("(") + 1: stat.rindex(")")]
    state = stat[stat.rindex(")") + 2:][:1]
    return name == comm and state != "Z"


def stop_pids(pids: dict[int, str], timeout: float = 10.0) -> None:
    """TERM each live pid, wait up to ``timeout`` seconds, then KILL what is left."""
    live = {p: c for p, c in pids.items() if _alive(p, c)}
    for pid in live:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        live = {p: c for p, c in live.items() if _alive(p, c)}
        time.sleep(0.05)
    for pid in live:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class LocalCluster:
    def __init__(self, home: Path | None = None):
        self.home = home or kit_home()
        self.root = self.home / "cluster"
        self.conf = self.root / "slurm.conf"
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

    def _daemons(self, st: ClusterState) -> list[tuple[str, str, int]]:
        """(name, comm, port) of every daemon of ``st``."""
        prom = [("prometheus", "prometheus", st.prometheus_port)] if st.prometheus_port else []
        munge = [("munged", "munged", 0)] if st.auth == "munge" else []
        return munge + [("slurmctld", "slurmctld", st.ctld_port)] + [
            (f"node{i}", "slurmd", port) for i, port in enumerate(st.node_ports, 1)] + prom

    @property
    def prometheus_targets(self) -> Path:
        return self.root / "prometheus" / "targets"

    def prometheus_url(self) -> str | None:
        st = self.state()
        return f"http://127.0.0.1:{st.prometheus_port}" if st and st.prometheus_port else None

    def running(self) -> bool:
        st = self.state()
        return bool(st) and all(_alive(st.pids.get(n), c) for n, c, _ in self._daemons(st))

    def controller_alive(self) -> bool:
        """Its slurmctld runs (Slurm commands answer, even with a node down)."""
        st = self.state()
        return bool(st) and _alive(st.pids.get("slurmctld"), "slurmctld")

    def status(self) -> list[DaemonStatus]:
        st = self.state()
        if st is None:
            return []
        node_states = {}
        if self.running():
            out = self.target.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], check=False).stdout
            node_states = dict(line.split(None, 1) for line in out.splitlines() if " " in line)
        return [DaemonStatus(name, st.pids.get(name), port, _alive(st.pids.get(name), comm),
                             node_states.get(name, "").strip())
                for name, comm, port in self._daemons(st)]

    @contextmanager
    def _lock(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    # ------------------------------------------------------------ up
    def up(self, nodes: int | None = None, cpus_per_node: int | None = None, gpus_per_node: int | None = None,
           timeout: float = 30.0, progress=lambda msg: None, prometheus: bool = False) -> tuple[ClusterState, bool]:
        """Start the cluster, or bring back the daemons of one that died. Returns (state, started_now).

        A cluster whose state is here keeps it: only dead daemons are started
        again (slurmctld recovers its jobs and job ids from its saved state),
        so jobs that survived on the other daemons run on. Shape arguments
        left out (None) mean "as it is" (or 2 nodes, this machine's CPUs, no GPUs).
        """
        for tool in REQUIRED:
            if shutil.which(tool) is None:
                raise KitError(f"{tool} not found", field="cluster", hint=INSTALL_HINT, exit_code=1)
        with self._lock():
            if prometheus and shutil.which("prometheus") is None:
                raise KitError("prometheus not found", field="--prometheus", exit_code=1,
                               hint="install Debian's Prometheus: apt-get install -y prometheus")
            st = self.state()
            if st is None:
                leftover = self.leftover_daemons()
                if self.state_file.exists() or leftover:
                    what = "is unreadable" if self.state_file.exists() else "is missing"
                    running = f" and {_describe(leftover)} of it still run" if leftover else ""
                    raise KitError(f"{self.state_file} {what}{running}: not starting a second cluster over it",
                                   field="cluster", exit_code=1,
                                   hint="`kit cluster down` stops what is left of it (daemons and job processes, "
                                        "found by its directory), then `kit cluster up` starts afresh")
            shape = (nodes if nodes is not None else (st.nodes if st else 2),
                     cpus_per_node or (st.cpus_per_node if st else os.cpu_count() or 1),
                     gpus_per_node if gpus_per_node is not None else (st.gpus_per_node if st else 0))
            for label, value, low in (("--nodes", shape[0], 1), ("--cpus-per-node", shape[1], 1),
                                      ("--gpus-per-node", shape[2], 0)):
                if value < low:
                    raise KitError(f"must be at least {low}, got {value}", field=label)
            if st:
                dead = [(n, c) for n, c, _ in self._daemons(st) if not _alive(st.pids.get(n), c)]
                same = (st.nodes, st.cpus_per_node, st.gpus_per_node) == shape
                if not same and len(dead) < len(self._daemons(st)):
                    raise KitError(
                        f"already running with {st.nodes} node(s), {st.cpus_per_node} CPUs and "
                        f"{st.gpus_per_node} GPUs per node", field="cluster",
                        hint="run `kit cluster down` first to change its shape")
                if same:
                    if dead:
                        self._restart(st, [n for n, _ in dead], timeout, progress)
                    resumed = self._resume_nodes(progress)
                    if prometheus and not st.prometheus_port:
                        self._start_prometheus(st, timeout, progress)
                        self._save(st)
                    return st, bool(dead or resumed)
                progress("every daemon of the earlier cluster is gone: starting a new one")
                self._end_job_processes(progress)
            self._clean()
            st = self._start(*shape, timeout, progress)
            if prometheus:
                try:
                    self._start_prometheus(st, timeout, progress)
                except BaseException:
                    self._stop(st)
                    raise
                self._save(st)
            return st, True

    def _resume_nodes(self, progress) -> list[str]:
        """Resume the nodes Slurm has drained or marked down (a daemon that died and came
        back, a kill that outlived UnkillableStepTimeout): `up` repairs, and a node Slurm
        holds back would keep every job that needs it pending."""
        out = self.target.run(["sinfo", "--noheader", "--Node", "--format=%N|%t|%E"], check=False).stdout
        held = {}
        for line in out.splitlines():
            name, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            if any(word in state for word in ("drain", "drng", "down", "fail")):
                held[name.strip()] = (state.strip(), reason.strip())
        for name, (state, reason) in sorted(held.items()):
            progress(f"resuming {name} (Slurm had it {state}: {reason or 'no reason given'})")
            self.target.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], check=False)
        return sorted(held)

    def _start_daemon(self, st: ClusterState, name: str, clear: bool = False) -> None:
        """Start slurmctld (``clear``: without its saved state) or slurmd ``name``; record its pid."""
        if name == "munged":
            (self.root / "run" / "munged.pid").unlink(missing_ok=True)
            run(config.munged_argv(self.root), what="munged", hint=f"see {self.root}/log/munged.log")
            st.pids[name] = self._read_pid(self.root / "run" / "munged.pid", name)
            self._save(st)
            return
        if name == "slurmctld":
            argv, pidfile, log = ["slurmctld", *(["-c"] if clear else [])], "slurmctld.pid", "slurmctld.log"
        else:
            argv, pidfile, log = ["slurmd", "-N", name], f"slurmd-{name}.pid", f"slurmd-{name}.log"
        (self.root / "run" / pidfile).unlink(missing_ok=True)
        env = config.daemon_env(self.root, self.conf, name, st.containers, os.environ.get("PATH", os.defpath))
        run([*argv, "-f", str(self.conf)], env=env, what=argv[0], hint=f"see {self.root}/log/{log}")
        st.pids[name] = self._read_pid(self.root / "run" / pidfile, name)
        self._save(st)

    def _restart(self, st: ClusterState, names: list[str], timeout: float, progress) -> None:
        """Start the daemons ``names`` of ``st`` again, with the same config and saved state."""
        alive = [n for n, c, _ in self._daemons(st) if n not in names]
        progress(f"restarting {', '.join(names)}" + (f" ({', '.join(alive)} kept running)" if alive else ""))
        restart_prometheus = "prometheus" in names
        names = [n for n in names if n != "prometheus"]
        kept = set(alive) - {"prometheus"}
        while names:
            for name in sorted(names, key=lambda n: (n != "munged", n != "slurmctld")):
                # No -c: slurmctld recovers its jobs and job ids from StateSaveLocation.
                self._start_daemon(st, name)
            # One that was running when up began may be dying too (killed with the
            # others a moment ago): it is restarted as well, and said so.
            died = self._wait_idle(st, timeout, busy_ok=True, kept=kept)
            if died:
                progress(f"{died} exited while the others restarted (it was running when `up` began): restarting it too")
                kept.discard(died)
            names = [died] if died else []
        if restart_prometheus:
            self._start_prometheus(st, timeout, progress)
            self._save(st)

    def _clean(self) -> None:
        """Remove the cluster's runtime state; the next job id is kept (ids are never reused)."""
        next_id = max(_saved_job_id_sequence(self.root / "state" / "job_state"), self._next_job_id())
        if next_id > 1:
            (self.root / "next_job_id").write_text(f"{next_id}\n")
        for sub in ("state", "spool", "run", "dev", "prometheus", "enroot", "munge"):  # enroot: named containers too
            shutil.rmtree(self.root / sub, ignore_errors=True)
        for path in (self.state_file,):
            path.unlink(missing_ok=True)

    def _write_config(self, st: ClusterState) -> None:
        r = self.root
        os.chmod(r, 0o700)  # the cluster's config, state and logs are its owner's alone
        for sub in ("log", "run", "state", *(f"spool/node{i}" for i in range(1, st.nodes + 1))):
            (r / sub).mkdir(parents=True, exist_ok=True)
        if st.auth == "munge":
            (r / "munge").mkdir(mode=0o700, exist_ok=True)
            key = r / "munge" / "munge.key"
            if not key.exists():  # a new key per cluster, readable by its owner alone
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
                with os.fdopen(fd, "wb") as f:
                    f.write(os.urandom(1024))
        plugin = self._container_plugin(st) if st.containers else None
        (r / "plugstack.conf").write_text(config.plugstack_conf(st.containers, r, plugin))
        if st.containers == config.PYXIS:
            enroot = shutil.which("enroot")
            config.pyxis_runtime(r).mkdir(parents=True, exist_ok=True)
            for i in range(1, st.nodes + 1):
                wrapper = config.enroot_bin(r, f"node{i}") / "enroot"
                wrapper.parent.mkdir(parents=True, exist_ok=True)
                wrapper.write_text(config.enroot_wrapper(r, f"node{i}", enroot))
                wrapper.chmod(0o755)
                for path in config.enroot_paths(r, f"node{i}").values():
                    path.mkdir(parents=True, exist_ok=True)
        for gpu in config.gpu_files(st, r):
            gpu.parent.mkdir(parents=True, exist_ok=True)
            gpu.touch()
        (r / "gres.conf").write_text(config.gres_conf(st, r))
        files.write_atomic(self.conf, config.slurm_conf(st, r, _user(), self._next_job_id()))

    def _start(self, nodes: int, cpus: int, gpus: int, timeout: float, progress) -> ClusterState:
        ports = _free_ports(nodes + 1)
        st = ClusterState(nodes=nodes, cpus_per_node=cpus, gpus_per_node=gpus,
                          memory_mb=_memory_mb(), hostname=socket.gethostname().split(".")[0],
                          ctld_port=ports[0], node_ports=ports[1:])
        st.containers = self._prepare_containers(progress)
        if st.containers:
            st.container_plugin = self._container_plugin(st)
        st.auth = "munge" if shutil.which("munged") else "none"
        if st.auth == "none":
            progress("munged not found: the cluster trusts the uid every local client claims "
                     "(install munge to let only real uids through)")
        self._write_config(st)
        # Record the state before starting anything, so `down` can always find it.
        self._save(st)
        try:
            if st.auth == "munge":
                progress("starting munged (the cluster's own key and socket)")
                self._start_daemon(st, "munged")
            progress(f"starting slurmctld on port {st.ctld_port}")
            self._start_daemon(st, "slurmctld", clear=True)
            for i in range(1, nodes + 1):
                progress(f"starting slurmd node{i} on port {st.node_ports[i - 1]}")
                self._start_daemon(st, f"node{i}")
            self._wait_idle(st, timeout)
        except BaseException:
            self._stop(st)
            raise
        return st

    # ------------------------------------------------------------ prometheus
    def _start_prometheus(self, st: ClusterState, timeout: float, progress) -> None:
        """A real Prometheus on loopback that discovers job exporters through file_sd."""
        import subprocess
        import urllib.request

        d = self.root / "prometheus"
        self.prometheus_targets.mkdir(parents=True, exist_ok=True)
        (d / "data").mkdir(parents=True, exist_ok=True)
        (d / "prometheus.yml").write_text(
            "# Written by `kit cluster up --prometheus` (the site template is monitoring/prometheus.yml).\n"
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: kit\n    file_sd_configs:\n"
            f"      - files: ['{self.prometheus_targets}/*.json']\n        refresh_interval: 5s\n"
            "    metric_relabel_configs:\n" + relabel_yaml(6))
        port = _free_ports(1)[0]
        progress(f"starting prometheus on 127.0.0.1:{port}")
        with open(self.root / "log" / "prometheus.log", "ab") as logf:
            proc = subprocess.Popen(
                # nice 19: on a real site Prometheus runs elsewhere; here it shares the jobs' cores.
                ["nice", "-n", "19", "prometheus", f"--config.file={d / 'prometheus.yml'}",
                 f"--storage.tsdb.path={d / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=7d"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        st.pids["prometheus"] = proc.pid
        st.prometheus_port = port
        self._save(st)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise KitError("prometheus exited while starting", field="--prometheus", exit_code=1,
                               detail=(self.root / "log" / "prometheus.log").read_text(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise KitError(f"prometheus not ready after {timeout:g} s", field="--prometheus", exit_code=1)

    # ------------------------------------------------------------ containers
    def _prepare_containers(self, progress) -> str | None:
        """Real pyxis when it and enroot are installed, else kit's stand-in, built now."""
        cc = shutil.which("gcc") or shutil.which("cc")
        choice = config.choose_containers(pyxis_plugin(), shutil.which("enroot"),
                                          cc is not None and Path("/usr/include/slurm/spank.h").exists())
        if choice == config.PYXIS:
            progress(f"container jobs: pyxis ({pyxis_plugin()}), enroot ({shutil.which('enroot')}), "
                     f"each node with its own enroot paths under {self.root / 'enroot'}")
            return choice
        if choice is None:
            progress("container jobs disabled: building kit's pyxis stand-in needs gcc and "
                     "libslurm-dev (apt-get install -y gcc libslurm-dev)")
            return None
        out = self.root / "spank_kit_pyxis.so"
        src = Path(__file__).parent / "spank" / "kit_pyxis.c"
        run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(src)], what="cluster",
            hint="the stand-in SPANK plugin did not compile")
        progress("container jobs: kit's pyxis stand-in (no pyxis/enroot here)")
        return "kit-pyxis"

    def containers_description(self) -> str:
        """Which plugin runs container jobs (``kit cluster status``)."""
        st = self.state()
        if st is None or not st.containers:
            return "none (kit's stand-in needs gcc and libslurm-dev; real pyxis needs enroot too)"
        if st.containers == config.PYXIS:
            return f"pyxis {self._container_plugin(st)}, each node with its own enroot paths under {self.root / 'enroot'}"
        return f"kit's pyxis stand-in {self._container_plugin(st)} (no pyxis and enroot installed)"

    def _container_plugin(self, st: ClusterState) -> str | None:
        """The plugin ``st`` was started with (a state from before it was recorded: found again)."""
        if st.container_plugin:
            return st.container_plugin
        return pyxis_plugin() if st.containers == config.PYXIS else str(self.root / "spank_kit_pyxis.so")

    def _save(self, st: ClusterState) -> None:
        files.write_atomic(self.state_file, json.dumps(asdict(st), indent=2) + "\n")

    def _read_pid(self, path: Path, name: str, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return int(path.read_text().strip())
            except (OSError, ValueError):
                time.sleep(0.02)
        raise KitError(f"{name} did not start (no pid file {path})", field="cluster", exit_code=1,
                       detail=self._log_tail(name))

    def _log_tail(self, name: str) -> str:
        log = self.root / "log" / ("slurmctld.log" if name == "slurmctld" else f"slurmd-{name}.log")
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""

    def _wait_idle(self, st: ClusterState, timeout: float, busy_ok: bool = False,
                   kept: set[str] = frozenset()) -> str | None:
        """Wait until every node is idle (or busy, ``busy_ok``). A daemon of ``kept`` (running
        before, not started now) found dead is returned for the caller to restart; one just
        started that dies is an error."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            for name, comm, _ in self._daemons(st):
                if name != "prometheus" and not _alive(st.pids.get(name), comm):  # prometheus: after the nodes
                    if name in kept:
                        return name
                    raise KitError(f"{name} exited while starting", field="cluster", exit_code=1,
                                   detail=self._log_tail(name))
            proc = self.target.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], check=False)
            out = proc.stdout
            states = [line.split()[-1] for line in out.splitlines() if line.strip()]
            ready = ("idle", "allocated", "mixed", "completing") if busy_ok else ("idle",)
            if len(states) == st.nodes and all(s in ready for s in states):
                return None
            time.sleep(0.1)
        raise KitError(f"nodes not idle after {timeout:g} s", field="cluster", exit_code=1,
                       detail=out + "\n" + self._log_tail("slurmctld"))

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
                    progress(f"{self.state_file} is missing or unreadable: stopping {_describe(leftover)} "
                             "found running from it")
                self._end_job_processes(progress)
                stop_pids({p: c for p, c in leftover.items() if c == "slurmd"})
                stop_pids(leftover)
                self._clean()
                return True
            if not force and _alive(st.pids.get("slurmctld"), "slurmctld"):
                active = self._active_jobs()
                if active:
                    raise KitError(f"{len(active)} job(s) still active: {', '.join(active)}", field="cluster",
                                   exit_code=1, hint="wait for them, or `kit cluster down --force` to cancel them")
            self._stop(st, progress)
            self._end_job_processes(progress)
            self._clean()
            return True

    def leftover_daemons(self) -> dict[int, str]:
        """pid -> program of this cluster's daemons found by their command lines
        (each names a file under this cluster's directory), record or not."""
        root = f"{self.root}/"
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
                with open(f"/proc/{entry}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm in ("slurmctld", "slurmd", "prometheus", "munged") and any(root in a for a in argv) \
                    and _alive(int(entry), comm):
                found[int(entry)] = comm
        return found

    def _active_jobs(self) -> list[str]:
        out = self.target.run(["squeue", "--noheader", "--format=%i",
                               "--states=RUNNING,COMPLETING,PENDING,CONFIGURING,REQUEUED,SUSPENDED"],
                              check=False).stdout
        return out.split()

    def _next_job_id(self) -> int:
        try:
            return max(int((self.root / "next_job_id").read_text().strip()), 1)
        except (OSError, ValueError):
            return 1

    def _end_job_processes(self, progress) -> None:
        """TERM, then KILL, every process of this cluster's jobs (slurmstepd and tasks)."""
        procs = job_processes(str(self.conf))
        if not procs:
            return
        jobs = sorted({j for _, _, j in procs if j}, key=int)
        progress(f"ending {len(procs)} leftover process(es) of job(s) {', '.join(jobs) or '?'}")
        tasks = {pid: comm for pid, comm, _ in procs if comm != "slurmstepd"}
        stop_pids(tasks, timeout=10)
        stop_pids({pid: comm for pid, comm, _ in procs}, timeout=2)

    def _stop(self, st: ClusterState, progress=lambda msg: None) -> None:
        ctld_alive = _alive(st.pids.get("slurmctld"), "slurmctld")
        if ctld_alive:
            jobs = self._active_jobs()
            if jobs:
                progress(f"cancelling {len(jobs)} job(s): {', '.join(jobs)}")
                self.target.run(["scancel", *jobs], check=False)
                # KillWait (30 s) plus the jobs' own cleanup.
                deadline = time.monotonic() + 45
                while time.monotonic() < deadline and self._active_jobs():
                    time.sleep(0.2)
        daemons = {st.pids[n]: c for n, c, _ in self._daemons(st) if st.pids.get(n)}
        if daemons:
            progress("stopping " + ", ".join(n for n, _, _ in self._daemons(st) if st.pids.get(n)))
        # slurmd first, so slurmctld does not mark nodes down mid-way.
        stop_pids({p: c for p, c in daemons.items() if c == "slurmd"})
        stop_pids({p: c for p, c in daemons.items() if c == "slurmctld"})
        stop_pids({p: c for p, c in daemons.items() if c == "prometheus"})
        stop_pids({p: c for p, c in daemons.items() if c == "munged"})


def _describe(pids: dict[int, str]) -> str:
    return ", ".join(f"{comm} (pid {pid})" for pid, comm in sorted(pids.items()))


def _saved_job_id_sequence(path: Path) -> int:
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
    if len(head) < 4 + len(tag) + 14 or int.from_bytes(head[:4], "big") != len(tag) or head[4:4 + len(tag)] != tag:
        return 0
    at = 4 + len(tag) + 2 + 8
    return int.from_bytes(head[at:at + 4], "big")


def job_processes(conf: str) -> list[tuple[int, str, str]]:
    """(pid, comm, job id) of every process of the jobs of the Slurm whose config is ``conf``:
    slurmstepd and the tasks both carry SLURM_CONF in their environment, and every process
    below one of them is theirs too, whatever its environment (a daemon started with
    ``env -i``); the daemons, this process and its ancestors are left out."""
    needle = f"SLURM_CONF={conf}".encode()
    keep = {0}
    pid = os.getpid()
    while pid > 1:
        keep.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if needle not in environ or comm in ("slurmd", "slurmctld"):
            continue
        job = next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"SLURM_JOB_ID=")), "")
        if job or comm == "slurmstepd":
            found.append((int(entry), comm, job))
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    seen = {pid for pid, _, _ in found}
    queue = [(pid, job) for pid, _, job in found]
    while queue:
        pid, job = queue.pop()
        for child in children.get(pid, []):
            if child in seen or child in keep:
                continue
            seen.add(child)
            try:
                with open(f"/proc/{child}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm not in ("slurmd", "slurmctld"):
                found.append((child, comm, job))
                queue.append((child, job))
    return found


PYXIS_PATHS = ("/usr/local/lib/slurm/spank_pyxis.so", "/usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so",
               "/usr/lib64/slurm/spank_pyxis.so", "/usr/lib/slurm/spank_pyxis.so")


def pyxis_plugin() -> str | None:
    """Path of an installed pyxis (KIT_PYXIS_PLUGIN, or the usual places)."""
    for path in (os.environ.get("KIT_PYXIS_PLUGIN"), *PYXIS_PATHS):
        if path and os.path.exists(path):
            return path
    return None


def _user() -> str:
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name


def _memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return max(int(line.split()[1]) // 1024, 1)
    except OSError:
        pass
    return 1024
