"""What the job itself uses on this node: CPU time and memory of its processes,
next to what Slurm allocated (for ``kit report``'s efficiency notes).

Without cgroup accounting (the local cluster's nodes share one host) the job's
processes are found the way Slurm tags them: every task's environment carries
``SLURM_JOB_ID`` and ``SLURMD_NODENAME``. Only the user's own processes are
readable, which are the job's.
"""

from __future__ import annotations

import os
import time

from kit.monitor.families import Sample, SourceResult, Spec
from kit.monitor.node import PsutilSource

CPU = Spec("kit_job_cpu_seconds_total", "counter",
           "CPU time (user and system, with reaped children) of the job's processes on this node.")
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
    return (float(cpus) if cpus.isdigit() else None,
            float(mem) * 1024 * 1024 if mem.isdigit() and int(mem) > 0 else None)


class JobSource(PsutilSource):
    name = "job"

    def __init__(self, job_id: str, node: str | None, env: dict | None = None, psutil=None):
        super().__init__(psutil)
        self.job_id = job_id
        self.node = node
        self.cpus, self.memory = allocation(dict(os.environ if env is None else env))

    def _is_mine(self, proc) -> bool:
        env = proc.environ()
        return env.get("SLURM_JOB_ID") == self.job_id and (self.node is None or env.get("SLURMD_NODENAME") == self.node)

    def poll(self) -> SourceResult:
        t0 = time.perf_counter()
        ps = self.psutil
        cpu = rss = 0.0
        count = 0
        try:
            for proc in ps.process_iter():
                try:
                    if not self._is_mine(proc):
                        continue
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
