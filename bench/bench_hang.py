"""Hang detection benchmark: prints what it measures against its targets in one run.

    python bench/bench_hang.py [--runs 3] [--hang-timeout 10] [--quick]

--quick: one run with a 3 s hang timeout (the test suite's run: the bench keeps working).

On a throw-away 3-node local cluster, a 2-node reference-trainer job runs with
--hang-timeout T; one rank's trainer is SIGSTOPped. Measured per run:

1. from that rank's last progress (its progress file's time) to the hang being
   declared, and to the job step being stopped (every process of the run gone
   and the job requeued). Target: stopped within T + 10 s.
2. the stack dump's cost per rank: wall time of `py-spy dump --nonblocking` of
   a live trainer (what each launcher runs), median of 5.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import wait_for

from kit import slurm
from kit.cluster import LocalCluster

TRAIN = [
    sys.executable,
    "-m",
    "kit.train",
    "--step-delay",
    "0.02",
    "--log-every",
    "10",
    "--checkpoint-every",
    "50",
    "--max-steps",
    "1000000",
]


def job_alive(job_dir: Path) -> bool:
    needle = f"KIT_JOB_DIR={job_dir}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    if stat.rsplit(")", 1)[1].split()[0] != "Z" and "launcher.sh" in Path(
                        f"/proc/{entry}/cmdline"
                    ).read_text(errors="replace"):
                        return True
            except OSError:
                pass
    return False


def one_run(cluster: LocalCluster, out: Path, hang_timeout: int, env: dict) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kit",
            "launch",
            "--local",
            "--json",
            "--nodes",
            "2",
            "--heartbeat",
            "0",
            "--hang-timeout",
            str(hang_timeout),
            "--output-dir",
            str(out),
            "--",
            *TRAIN,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job = json.loads(proc.stdout)
    job_dir, job_id = Path(job["job_dir"]), job["job_id"]
    progress = job_dir / "progress" / "r0"
    wait_for(
        lambda: (
            (progress / "task-1").exists()
            and (progress / "rank-1").exists()
            and "step=100 " in (job_dir / "logs" / "rank-0.r0.log").read_text()
        ),
        180,
    )
    pid = int((progress / "task-1").read_text().split()[1])
    trainer0 = int((progress / "task-0").read_text().split()[1])
    dumps, failed = [], []
    while len(dumps) < 5 and len(failed) < 5:
        # --nonblocking reads a running interpreter's memory as it changes: now and then a
        # read fails (kit's hang dump says so and goes on); counted, not fatal.
        t0 = time.perf_counter()
        dump = subprocess.run(
            ["py-spy", "dump", "--nonblocking", "--pid", str(trainer0)], capture_output=True, text=True
        )
        if dump.returncode == 0:
            dumps.append(time.perf_counter() - t0)
        else:
            failed.append((dump.stdout + dump.stderr).strip().splitlines()[:1])
    if not dumps:
        raise RuntimeError(f"py-spy dump failed {len(failed)} times on the trainer (pid {trainer0}): {failed}")
    os.kill(pid, signal.SIGSTOP)
    last_progress = (progress / "rank-1").stat().st_mtime
    report = job_dir / "hang" / "r0" / "report"
    wait_for(report.exists, hang_timeout + 60)
    declared = (job_dir / "hang" / "r0" / "request").stat().st_mtime
    wait_for(
        lambda: not job_alive(job_dir) and slurm.job_status(cluster.target, job_id).restarts == 1, hang_timeout + 60
    )
    stopped = time.time()
    subprocess.run(["scancel", job_id], env={**os.environ, **cluster.target.env}, check=True)
    return {
        "declared": declared - last_progress,
        "stopped": stopped - last_progress,
        "dump": statistics.median(dumps),
        "dump_failures": failed,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hang-timeout", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="one run, a 3 s hang timeout (the test suite's run)")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.hang_timeout = 1, 3
    with tempfile.TemporaryDirectory() as d:
        home = Path(d) / "home"
        cluster = LocalCluster(home)
        cluster.up(nodes=3, cpus_per_node=2)
        env = {**os.environ, "KIT_HOME": str(home)}
        try:
            results = [one_run(cluster, Path(d) / f"jobs{i}", args.hang_timeout, env) for i in range(args.runs)]
        finally:
            cluster.down(force=True)
    t = args.hang_timeout
    declared = [r["declared"] for r in results]
    stopped = [r["stopped"] for r in results]
    dumps = [r["dump"] for r in results]
    print(f"runs: {args.runs}, hang timeout {t} s, 2-node reference trainer, rank 1 SIGSTOPped")
    print(f"{'measurement':<52}{'median':>9}{'max':>9}{'target':>10}")
    print(f"{'last progress -> hang declared':<52}{statistics.median(declared):>8.2f}s{max(declared):>8.2f}s{'':>10}")
    print(
        f"{'last progress -> step stopped, job requeued':<52}{statistics.median(stopped):>8.2f}s"
        f"{max(stopped):>8.2f}s{f'<= {t + 10} s':>10}"
    )
    print(
        f"{'  beyond the hang timeout':<52}{statistics.median(stopped) - t:>8.2f}s{max(stopped) - t:>8.2f}s"
        f"{'<= 10 s':>10}"
    )
    print(
        f"{'stack dump per rank (py-spy dump --nonblocking)':<52}{statistics.median(dumps):>8.3f}s{max(dumps):>8.3f}s"
    )
    failures = [f for r in results for f in r["dump_failures"]]
    if failures:
        print(f"  py-spy dumps that failed (retried): {len(failures)}: {failures[0]}")
    print("targets met" if max(stopped) <= t + 10 else "TARGETS MISSED")


if __name__ == "__main__":
    main()
