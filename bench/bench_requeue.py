"""The gap between two runs of a requeued job: kit's requeue against Slurm's own, side by side.

    python bench/bench_requeue.py [--runs N] [--quick] [--kit-home DIR]

One 1-node job per measurement, whose command holds on its first run (with a
handler for the warning) and ends at once on the next:

- kit: the job is warned (`scancel --batch --signal=USR1`, what Slurm's
  `--signal=B:USR1@90` does near the time limit); the command stops, and
  prelaunch requeues the job and gives it a begin time a few seconds ahead.
- slurm: the same job requeued by `scontrol requeue` (what a hand-written
  batch script's `trap 'scontrol requeue $SLURM_JOB_ID' USR1` gets): Slurm holds
  a requeued job until its credential lifetime has passed (BeginTime = end + 121 s).

Measured: from the first run's end (its line in runs.jsonl) to the second run's
start (prelaunch's `run 1` line), in seconds. Target: kit's gap at most 30 s
(the scheduler's next pass; Slurm's backfill runs every 30 s) and under a
quarter of Slurm's own. --quick measures kit's side once (Slurm's takes over
two minutes a run) and prints Slurm's hold as configured; the test suite runs it.
--kit-home DIR uses the local cluster already up there instead of a throw-away one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import wait_for  # noqa: E402

from kit import slurm  # noqa: E402
from kit.cluster import LocalCluster  # noqa: E402

HOLD = (
    'if [ "$KIT_RESTART" = 0 ]; then trap "exit 0" USR1; echo ready; sleep 300 & wait; fi; echo "run $KIT_RESTART done"'
)
SLURM_HOLD = 121  # BeginTime after a requeue: now + the credential lifetime (120 s) + 1


def one_run(cluster: LocalCluster, out: Path, how: str, env: dict) -> float:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kit",
            "launch",
            "--local",
            "--json",
            "--heartbeat",
            "0",
            "--time",
            "10",
            "--max-restarts",
            "1",
            "--output-dir",
            str(out),
            "--",
            "bash",
            "-c",
            HOLD,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job = json.loads(proc.stdout)
    job_dir, job_id = Path(job["job_dir"]), job["job_id"]
    rank_log = job_dir / "logs" / "rank-0.r0.log"
    wait_for(lambda: rank_log.exists() and "ready" in rank_log.read_text(), 120, poll=0.2)
    slurm_env = {**os.environ, **cluster.target.env}
    if how == "kit":
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=slurm_env, check=True)
    else:
        subprocess.run(["scontrol", "requeue", job_id], env=slurm_env, check=True)
    end = slurm.wait(cluster.target, job_id, timeout=SLURM_HOLD + 180)
    if end.state != "COMPLETED" or end.restarts != 1:
        raise RuntimeError(f"{how}: job {job_id} ended {end.state} after {end.restarts} restart(s)")
    first_end = json.loads((job_dir / "runs.jsonl").read_text().splitlines()[0])["time"]
    batch_log = "".join(p.read_text() for p in (job_dir / "logs").glob("slurm-*.out"))
    stamp = re.search(r"^\[kit (\S+) prelaunch\] job \d+ run 1:", batch_log, re.M)
    if not stamp:
        raise RuntimeError(f"{how}: no start of run 1 in the batch log:\n{batch_log[-2000:]}")
    return datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S%z").timestamp() - first_end


def measure(cluster: LocalCluster, work: Path, runs: int, quick: bool) -> dict[str, list[float]]:
    env = {**os.environ, "KIT_HOME": str(cluster.home)}
    gaps: dict[str, list[float]] = {"kit": [], "slurm": []}
    for i in range(1 if quick else runs):
        for how in ("kit",) if quick else ("kit", "slurm"):
            gaps[how].append(one_run(cluster, work / f"{how}{i}", how, env))
    return gaps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kit-home", help="a KIT_HOME whose local cluster is up (default: a throw-away cluster)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if args.kit_home:
            cluster = LocalCluster(Path(args.kit_home))
            if not cluster.running():
                sys.exit(f"bench_requeue: no local cluster is running under {args.kit_home}")
            gaps = measure(cluster, Path(d), args.runs, args.quick)
        else:
            cluster = LocalCluster(Path(d) / "home")
            cluster.up(nodes=1, cpus_per_node=2)
            try:
                gaps = measure(cluster, Path(d), args.runs, args.quick)
            finally:
                cluster.down(force=True)
    kit_gap = statistics.median(gaps["kit"])
    print(f"requeue gap: first run's end -> second run's start, 1-node job, {len(gaps['kit'])} run(s) a side")
    print(f"{'side':<44}{'median':>9}{'max':>9}{'target':>10}")
    print(
        f"{'kit (prelaunch requeues, begin time released)':<44}{kit_gap:>8.1f}s{max(gaps['kit']):>8.1f}s{'<= 30 s':>10}"
    )
    if gaps["slurm"]:
        slurm_gap = statistics.median(gaps["slurm"])
        print(f"{'slurm (scontrol requeue: the hold)':<44}{slurm_gap:>8.1f}s{max(gaps['slurm']):>8.1f}s")
        print(f"ratio kit/slurm: {kit_gap / slurm_gap:.2f} (target <= 0.25)")
        met = max(gaps["kit"]) <= 30 and kit_gap / slurm_gap <= 0.25
    else:
        print(
            f"{'slurm (scontrol requeue: the hold)':<44}{'(--quick: not run; held >= ' + str(SLURM_HOLD) + ' s)':>28}"
        )
        met = max(gaps["kit"]) <= 30
    print("targets met" if met else "TARGETS MISSED")


if __name__ == "__main__":
    main()
