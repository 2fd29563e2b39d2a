"""Taking the local cluster down: its jobs cancelled (their accounting records delivered
first), its daemons stopped in order, every process of its jobs ended, its network removed."""

from __future__ import annotations

import time

from kit.cluster import accounting, network, processes


def active_jobs(target) -> list[str]:
    out = target.run(
        ["squeue", "--noheader", "--format=%i", "--states=RUNNING,COMPLETING,PENDING,CONFIGURING,REQUEUED,SUSPENDED"],
        check=False,
    ).stdout
    return out.split()


def end_job_processes(conf, progress) -> None:
    """TERM, then KILL, every process of this cluster's jobs (slurmstepd and tasks)."""
    procs = processes.job_processes(str(conf))
    if not procs:
        return
    jobs = sorted({j for _, _, j in procs if j}, key=int)
    progress(f"ending {len(procs)} leftover process(es) of job(s) {', '.join(jobs) or '?'}")
    tasks = {pid: comm for pid, comm, _ in procs if comm != "slurmstepd"}
    processes.stop_pids(tasks, timeout=10)
    processes.stop_pids({pid: comm for pid, comm, _ in procs}, timeout=2)


def stop(cluster, st, progress=lambda msg: None) -> None:
    """Cancel the jobs, let slurmctld hand slurmdbd what it still holds, then stop the
    daemons: slurmd first (so slurmctld does not mark nodes down mid-way), the database last
    but munged (every daemon authenticates through it)."""
    ctld_alive = processes.alive(st.pids.get("slurmctld"), "slurmctld")
    if ctld_alive:
        jobs = active_jobs(cluster.target)
        if jobs:
            progress(f"cancelling {len(jobs)} job(s): {', '.join(jobs)}")
            cluster.target.run(["scancel", *jobs], check=False)
            # KillWait (30 s) plus the jobs' own cleanup.
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline and active_jobs(cluster.target):
                time.sleep(0.2)
        if st.dbd_port and processes.alive(st.pids.get("slurmdbd"), "slurmdbd"):
            accounting.drain(cluster.target, progress)
    daemons = {st.pids[n]: c for n, c, _ in cluster.daemons(st) if st.pids.get(n)}
    if daemons:
        progress("stopping " + ", ".join(n for n, _, _ in cluster.daemons(st) if st.pids.get(n)))
    for comm in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "prometheus", "munged"):
        processes.stop_pids({p: c for p, c in daemons.items() if c == comm}, timeout=30 if comm == "mariadbd" else 10)


def remove_network(root, progress) -> None:
    """--isolated-network: whatever still runs in the nodes' namespaces, then the namespaces
    and the bridge (found by the cluster's directory, record or not)."""
    net = network.found(root)
    if net is None:
        return
    left = network.pids_inside(net)
    if left:
        progress(f"ending {len(left)} process(es) left in the nodes' network namespaces")
        processes.stop_pids({pid: processes.comm(pid) for pid in left}, timeout=5)
    progress(f"removing the isolated network ({net.bridge} and {len(net.namespaces)} namespace(s))")
    network.remove(net)
