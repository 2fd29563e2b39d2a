"""What the job itself uses on this node: CPU time and memory of its processes,
next to what Slurm allocated (for ``kit report``'s efficiency notes).

Without cgroup accounting (the local cluster's nodes share one host) the job's
processes are found the way Slurm tags them: every task's environment carries
``SLURM_JOB_ID`` and ``SLURMD_NODENAME``. Only the user's own processes are
readable, which are the job's.

The cost follows the job, not the node: reading every process's environment
(thousands on a busy node) happens once every ``RESCAN`` seconds (a new job
step, a daemon that left the job's process trees); in between, a poll walks
down from the processes it knows (each thread's ``/proc/PID/task/TID/children``:
a child of the job's process is the job's, whatever its environment) and
checks that each known pid is still the same process (its start time).
"""

from __future__ import annotations

import os
import time

from kit.monitor.families import Sample, SourceResult, Spec
from kit.monitor.node import PsutilSource

CPU = Spec(
    "kit_job_cpu_seconds_total",
    "counter",
    "CPU time (user and system, with reaped children) of the job's processes on this node.",
)
RSS = Spec("kit_job_memory_rss_bytes", "gauge", "Resident memory of the job's processes on this node.")
PROCESSES = Spec("kit_job_processes", "gauge", "The job's processes on this node.")
CPUS = Spec("kit_job_cpus", "gauge", "CPUs Slurm allocated to the job on this node (SLURM_CPUS_ON_NODE).")
MEMORY = Spec("kit_job_memory_limit_bytes", "gauge", "Memory Slurm allocated to the job on this node.")


def allocation(env: dict) -> tuple[float | None, float | None]:
    """(CPUs, memory bytes) Slurm allocated on this node, from the task environment."""
    cpus = env.get("SLURM_CPUS_ON_NODE", "")
    mem = env.get("SLURM_MEM_PER_NODE", "")
    if not mem and env.get("SLURM_MEM_PER_CPU", "").isdigit() and cpus.isdigit():
        mem = str(int(env["SLURM_MEM_PER_CPU"]) * int(cpus))
    return (
        float(cpus) if cpus.isdigit() else None,
        float(mem) * 1024 * 1024 if mem.isdigit() and int(mem) > 0 else None,
    )


RESCAN = 30.0  # seconds between two reads of every process's environment


def children(pid: int) -> list[int]:
    """``pid``'s child processes, from each of its threads' ``children`` file (no scan of /proc)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(word) for word in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def raw_environ(pid: int) -> bytes:
    """``pid``'s environment as the kernel keeps it (b"" when it cannot be read: gone, or another user's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


class JobSource(PsutilSource):
    name = "job"

    def __init__(self, job_id: str, node: str | None, env: dict | None = None, psutil=None, rescan: float = RESCAN):
        super().__init__(psutil)
        self.job_id = job_id
        self.node = node
        self.cpus, self.memory = allocation(dict(os.environ if env is None else env))
        self.rescan = rescan
        self._known: dict[int, float] = {}  # pid -> its start time (a reused pid is another process)
        self._scanned: float | None = None

    def _tagged(self) -> list[int]:
        """The processes of the machine whose environment names the job: a substring of each raw environment,
        read straight from /proc. Parsing every process's into a dict, or even building a psutil process for
        each (its stat file read), was most of the scan's cost, paid on every node; and a one-machine
        cluster's every exporter reads every node's processes as the job starts."""
        key = f"SLURM_JOB_ID={self.job_id}".encode()
        return [int(name) for name in os.listdir("/proc") if name.isdigit() and key in raw_environ(int(name))]

    def _is_mine(self, proc) -> bool:
        env = proc.environ()
        return env.get("SLURM_JOB_ID") == self.job_id and (self.node is None or env.get("SLURMD_NODENAME") == self.node)

    def _processes(self) -> list:
        """The job's processes on this node, as psutil processes."""
        ps = self.psutil
        now = time.monotonic()
        found = {}
        if self._scanned is None or now - self._scanned >= self.rescan:
            self._scanned = now
            for pid in self._tagged():
                try:
                    proc = ps.Process(pid)
                    if self._is_mine(proc):
                        found[pid] = proc
                except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
                    continue
        queue = [*self._known, *(pid for proc in found.values() for pid in children(proc.pid))]
        while queue:
            pid = queue.pop()
            if pid in found:
                continue
            try:
                proc = ps.Process(pid)
                if self._known.get(pid, proc.create_time()) != proc.create_time():
                    continue  # the pid now names another process
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
                continue
            found[pid] = proc
            queue.extend(children(pid))
        known = {}
        for pid, proc in found.items():
            try:
                known[pid] = proc.create_time()
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
                continue
        self._known = known
        return [found[pid] for pid in known]

    def pids(self) -> list[int]:
        """The job's processes on this node as the last poll found them."""
        return list(self._known)

    def poll(self) -> SourceResult:
        t0 = time.perf_counter()
        ps = self.psutil
        cpu = rss = 0.0
        count = 0
        try:
            for proc in self._processes():
                try:
                    with proc.oneshot():
                        t = proc.cpu_times()
                        cpu += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
                        rss += proc.memory_info().rss
                    count += 1
                except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
                    continue  # gone, or not ours
        except Exception as e:
            return SourceResult([], False, time.perf_counter() - t0, f"{type(e).__name__}: {e}")
        out = [Sample(CPU, {}, cpu), Sample(RSS, {}, rss), Sample(PROCESSES, {}, count)]
        if self.cpus is not None:
            out.append(Sample(CPUS, {}, self.cpus))
        if self.memory is not None:
            out.append(Sample(MEMORY, {}, self.memory))
        return SourceResult(out, True, time.perf_counter() - t0)
