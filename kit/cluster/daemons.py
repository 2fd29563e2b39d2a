"""The local cluster's daemons as :class:`~kit.cluster.local.LocalCluster` runs them: one started (its pid read
back, its log's tail when it fails), several restarted in Slurm's order, the nodes resumed, the cluster waited for
until its nodes are idle."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kit.cluster import accounting as accounting_
from kit.cluster import config, network, processes
from kit.cluster.prometheus import start as start_prometheus
from kit.cluster.state import ClusterState
from kit.errors import KitError
from kit.runner import run


class Daemons:
    """What starts and waits for the daemons (a base of :class:`~kit.cluster.local.LocalCluster`)."""

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
            run(config.munged_argv(self.root, self.public), what="munged", hint=f"see {self.root}/log/munged.log")
            st.pids[name] = self._read_pid(self.root / "run" / "munged.pid", name)
            self.save(st)
            return
        if name == "mariadbd":
            st.pids[name] = accounting_.start_mariadbd(self.root, processes.user(), 60)
            self.save(st)
            return
        if name == "slurmctld":
            argv, pidfile, log = ["slurmctld", *(["-c"] if clear else [])], "slurmctld.pid", "slurmctld.log"
        elif name == "slurmdbd":
            argv, pidfile, log = ["slurmdbd"], "slurmdbd.pid", "slurmdbd.log"
        else:
            argv, pidfile, log = ["slurmd", "-N", name], f"slurmd-{name}.pid", f"slurmd-{name}.log"
        (self.root / "run" / pidfile).unlink(missing_ok=True)
        env = config.daemon_env(self.root, self.conf, name, st.containers, os.environ.get("PATH", os.defpath))
        if name != "slurmdbd":  # slurmdbd has no -f: it reads slurmdbd.conf beside SLURM_CONF
            argv = network.enter(network.from_dict(st.network), name, [*argv, "-f", str(self.conf)])
        if name in ("slurmctld", "slurmdbd"):
            argv = config.bound_to(network.host_address(st), argv)
        run(argv, env=env, what=name if name.startswith("node") else argv[0], hint=f"see {self.root}/log/{log}")
        st.pids[name] = self._read_pid(self.root / "run" / pidfile, name)
        self.save(st)
        if name == "slurmdbd":  # slurmctld registers with it at its start
            accounting_.wait_for(lambda: accounting_.dbd_answers(st), None, name, self.root, 60)

    def _restart(self, st: ClusterState, names: list[str], timeout: float, progress) -> None:
        """Start the daemons ``names`` of ``st`` again, with the same config and saved state."""
        alive = [n for n, c, _ in self.daemons(st) if n not in names]
        progress(f"restarting {', '.join(names)}" + (f" ({', '.join(alive)} kept running)" if alive else ""))
        restart_prometheus = "prometheus" in names
        names = [n for n in names if n != "prometheus"]
        kept = set(alive) - {"prometheus"}
        while names:
            for name in sorted(names, key=self._start_order):
                # No -c: slurmctld recovers its jobs and job ids from StateSaveLocation.
                self._start_daemon(st, name)
            # One that was running when up began may be dying too (killed with the
            # others a moment ago): it is restarted as well, and said so.
            died = self._wait_idle(st, timeout, busy_ok=True, kept=kept)
            if died:
                progress(
                    f"{died} exited while the others restarted (it was running when `up` began): restarting it too"
                )
                kept.discard(died)
            names = [died] if died else []
        if restart_prometheus:
            start_prometheus(self, st, timeout, progress)
            self.save(st)

    @staticmethod
    def _start_order(name: str) -> int:
        """munged, the database, slurmdbd, slurmctld, then the nodes."""
        order = ("munged", "mariadbd", "slurmdbd", "slurmctld")
        return order.index(name) if name in order else len(order)

    def _read_pid(self, path: Path, name: str, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return int(path.read_text().strip())
            except (OSError, ValueError):
                time.sleep(0.02)
        raise KitError(
            f"{name} did not start (no pid file {path})", field="cluster", exit_code=1, detail=self._log_tail(name)
        )

    def _log_tail(self, name: str) -> str:
        log = self.root / "log" / ("slurmctld.log" if name == "slurmctld" else f"slurmd-{name}.log")
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""

    def _wait_idle(
        self, st: ClusterState, timeout: float, busy_ok: bool = False, kept: set[str] = frozenset()
    ) -> str | None:
        """Wait until every node is idle (or busy, ``busy_ok``). A daemon of ``kept`` (running
        before, not started now) found dead is returned for the caller to restart; one just
        started that dies is an error."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            for name, comm, _ in self.daemons(st):
                if name != "prometheus" and not processes.alive(st.pids.get(name), comm):  # prometheus: after the nodes
                    if name in kept:
                        return name
                    raise KitError(
                        f"{name} exited while starting", field="cluster", exit_code=1, detail=self._log_tail(name)
                    )
            proc = self.target.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], check=False)
            out = proc.stdout
            states = [line.split()[-1] for line in out.splitlines() if line.strip()]
            ready = ("idle", "allocated", "mixed", "completing") if busy_ok else ("idle",)
            if len(states) == st.nodes and all(s in ready for s in states):
                return None
            time.sleep(0.1)
        raise KitError(
            f"nodes not idle after {timeout:g} s",
            field="cluster",
            exit_code=1,
            detail=out + "\n" + self._log_tail("slurmctld"),
        )
