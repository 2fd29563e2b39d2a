"""50 scancels at random moments of runs, with Slurm's default KillWait (30 s):
no launcher (or anything else of a job) outlives its job, and none spins
(the lifecycle issue, done-means 7)."""

from __future__ import annotations

import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import job_processes, read_logs, scancel, submit, wait_no_processes

from kit import slurm
from kit.core import outcome

HOLD = 'trap "exit 0" TERM; echo ready; sleep 300 & wait'
COMMANDS = [
    ["bash", "-c", HOLD],  # exits 0 on TERM, like Lightning
    ["sleep", "300"],  # dies on TERM
    ["bash", "-c", "echo ready; sleep 300"],  # a shell whose child outlives it
    [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(300)"],
]


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / 100
    except (OSError, IndexError, ValueError):
        return 0.0


def test_fifty_random_scancels_leave_no_launcher_behind(cluster, tmp_path):
    rng = random.Random(20261121)
    plans = [(i, rng.choice(COMMANDS), rng.uniform(0.0, 3.0), rng.random() < 0.5) for i in range(50)]

    def one(plan):
        i, command, delay, exporter = plan
        extra = [] if exporter else ["--no-exporter"]
        (tmp_path / f"j{i}").mkdir()
        job = submit(tmp_path / f"j{i}", "--heartbeat", "0", *extra, command=command)
        time.sleep(delay)
        scancel(cluster, job["job_id"])
        end = slurm.wait(cluster.target, job["job_id"], poll=0.2, timeout=90)
        left = wait_no_processes(job["job_dir"], 20)
        spinning = [(pid, cmd, cpu_seconds(pid)) for pid, cmd in left if "launcher.sh" in cmd]
        return job, end, left, spinning, delay

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, plans))
    bad = []
    for job, end, left, spinning, delay in results:
        result = slurm.job_outcome(end, Path(job["job_dir"]))
        if (
            end.state != "CANCELLED"
            or result.exit_code != outcome.CANCELLED
            or left
            or (Path(job["job_dir"]) / "FINISHED").exists()
        ):
            bad.append(
                (
                    job["job_id"],
                    f"after {delay:.2f} s",
                    end.state,
                    result.exit_code,
                    left,
                    spinning,
                    read_logs(job["job_dir"])[-2000:],
                )
            )
    assert bad == [], bad
    # Nothing of any of these jobs runs any more, launcher or otherwise.
    assert [p for job, *_ in results for p in job_processes(job["job_dir"])] == []
