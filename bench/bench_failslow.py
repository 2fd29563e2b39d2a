"""Fail-slow, side by side in one run: how soon a straggler is named, how often a clean run names
one, what a node's preflight costs, and what a straggler's requeue costs until the next run's first step.

    python bench/bench_failslow.py [--quick] [--kit-home DIR] [--clean SECONDS]

One job of the reference trainer (4 nodes of 1 rank, ~1 s steps; --quick: 2 nodes of 2 ranks, ~0.2 s steps) with
--on-straggler requeue: it trains clean for --clean seconds (default 600: the issue's 10 minutes; --quick 20), the
verdicts then counted (target 0); then rank 3 is stopped half of every two steps (SIGSTOP/SIGCONT; a stop shorter
than a step's sleep would hide in it) and the time from that onset to its verdict is measured (target <= 60 s);
prelaunch warns the command, which checkpoints, and the job
is requeued without the node: from the verdict to the next run's first step is the requeue path. The same job again
with --on-straggler restart (and one spare node where the cluster has one: not --quick on the suite's 2 nodes, where
the run restarts on the same nodes) measures the restart inside the allocation: verdict -> the next run's first
step, and the fault -> the next run's start (the record's end to the next start_ms; target <= 5 s plus the
container's start, here none: a host job); --quick runs this job alone (with the clean seconds first) and leaves
the requeue path to the full run (tests/test_stragglers.py holds it on the suite's cluster). Then a --preflight job of
`true`: each node's preflight seconds (target <= 5 s). The measurement's own cost to a step (target <= 1 %) is
bench/gpu_check.py's step 7, on a GPU. The preflight job is a --preflight-network one: each node's own checks,
then the network test's seconds (the all-reduce and every pair; 8 nodes, --quick 2).
--kit-home DIR uses the local cluster already up there (the suite's); else a throw-away one of 8 nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import on_cluster, wait_for  # noqa: E402

from kit.cluster import LocalCluster  # noqa: E402
from kit.jobdir import JobDir, goodput, records, slow_ranks  # noqa: E402
from kit.monitor import judges  # noqa: E402

NETWORK_NODES = 8  # the network test's nodes in a full run (the target is for 8)


def launch(cluster: LocalCluster, out: Path, *args: str) -> tuple[str, Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "kit", "launch", "--local", "--json", "--heartbeat", "0", "--output-dir", str(out)]
        + list(args),
        capture_output=True,
        text=True,
        env={**os.environ, "KIT_HOME": str(cluster.home)},
    )
    if proc.returncode:
        sys.exit(f"bench_failslow: kit launch failed ({proc.returncode}): {proc.stderr.strip()}")
    job = json.loads(proc.stdout)
    return job["job_id"], Path(job["job_dir"])


def duty_cycle(pid: int, stop: threading.Event, period: float) -> None:
    """Stop ``pid`` half of every ``period`` seconds until ``stop`` (or the process is gone)."""
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(period / 2)
            os.kill(pid, signal.SIGCONT)
            time.sleep(period / 2)
    except ProcessLookupError:
        pass


def first_step(job_dir: Path, run: int) -> float | None:
    """When run ``run``'s first rank made its first step (kit.train.progress's timeline, as goodput reads it)."""
    return next((t.first for t in goodput.run_times(job_dir) if t.run == run), None)


def straggler_job(cluster: LocalCluster, out: Path, quick: bool, clean: float, action: str = "requeue") -> dict:
    nodes, per_node, step = ("2", "2", 0.2) if quick else ("4", "1", 1.0)
    spare = int(action == "restart" and cluster.state().nodes > int(nodes))
    train = [sys.executable, "-m", "kit.train", "--max-steps", "100000", "--step-delay", str(step)]
    job_id, job_dir = launch(
        cluster,
        out,
        *("--nodes", nodes, "--ntasks-per-node", per_node, "--on-straggler", action, "--max-restarts", "1"),
        *("--spare-nodes", str(spare), "--", *train, "--checkpoint-every", "20"),
    )
    wait_for(lambda: len(judges.latest(job_dir)) == 4, 180, poll=0.5)
    time.sleep(clean)
    false = len(slow_ranks.read(job_dir))
    node, pid = (JobDir(job_dir).run_progress(0) / JobDir.TASK.format(rank=3)).read_text().split()[:2]
    stop = threading.Event()
    thread = threading.Thread(target=duty_cycle, args=(int(pid), stop, 2 * step))
    onset = time.time()
    thread.start()
    try:
        named = wait_for(lambda: slow_ranks.read(job_dir), 180, poll=0.5)
    finally:
        stop.set()
        thread.join()
    verdict = named[-1]
    resumed = wait_for(lambda: first_step(job_dir, 1), 300, poll=0.5)
    subprocess.run(["scancel", job_id], env={**os.environ, **cluster.target.env}, check=False)
    ended, following = goodput.run_times(job_dir)[:2]
    return {
        "spare": spare,
        "then": records.run_records(job_dir)[0].then,
        "fault_to_next_start": following.start - ended.end if following.start and ended.end else float("nan"),
        "clean_seconds": clean,
        "false_verdicts": false,
        "onset_to_verdict": verdict.at - onset,
        "named": f"rank {verdict.rank} on {verdict.node} ({verdict.factor:.2f}x)",
        "right": verdict.rank == 3 and verdict.node == node,
        "verdict_to_next_first_step": resumed - verdict.at,
    }


def preflight_job(cluster: LocalCluster, out: Path, nodes: int) -> tuple[list[float], float]:
    """A --preflight-network job of `true`: each node's own checks' seconds, and the network test's (the slowest
    node's: every node takes part in all of it)."""
    job_id, job_dir = launch(cluster, out, "--nodes", str(nodes), "--preflight-network", "--", "true")
    wait_for(lambda: records.run_records(job_dir), 180, poll=0.5)
    seconds, network = [], []
    for path in JobDir(job_dir).run_progress(0).glob(JobDir.PREFLIGHT_NODE.format(node="*")):
        record = json.loads(path.read_text())
        seconds.append(float(record["seconds"]))
        network.append(float((record.get("network") or {}).get("seconds", float("nan"))))
    return seconds, max(network, default=float("nan"))


def measure(cluster: LocalCluster, out: Path, quick: bool, clean: float) -> None:
    # --quick: the restart path alone (test_stragglers.py holds the requeue path on the suite's cluster).
    slow = None if quick else straggler_job(cluster, out, quick, clean)
    here = straggler_job(cluster, out, quick, clean if quick else 0.0, "restart")
    first = slow or here
    checks, network = preflight_job(cluster, out, 2 if quick else NETWORK_NODES)
    print(f"fail-slow, {'2 nodes x 2 ranks at ~0.2 s' if quick else '4 nodes x 1 rank at ~1 s'} steps")
    row("measure", "value", "target")
    row(f"false verdicts in a clean run of {first['clean_seconds']:.0f} s", first["false_verdicts"], "0")
    row(f"slowdown onset -> verdict ({first['named']})", f"{first['onset_to_verdict']:.1f}s", "<= 60 s")
    row("the right rank and node named", first["right"], "True")
    where = "on a spare node" if here["spare"] else "on the same nodes"
    row(f"verdict -> next run first step (restart {where})", f"{here['verdict_to_next_first_step']:.1f}s", "-")
    row("  run end -> next run start (in the allocation)", f"{here['fault_to_next_start']:.1f}s", "<= 5 s")
    if slow:
        row("verdict -> next run first step (requeue path)", f"{slow['verdict_to_next_first_step']:.1f}s", "-")
        row("  run end -> next run start (requeue path)", f"{slow['fault_to_next_start']:.1f}s", "-")
        ratio = slow["verdict_to_next_first_step"] / here["verdict_to_next_first_step"]
        row("  requeue / restart in the allocation (verdict -> step)", f"{ratio:.1f}x", "-")
    else:
        row("the requeue path, requeue / restart", "full run", "-")
    row(f"preflight per node, quick (max of {len(checks)})", f"{max(checks):.1f}s", "<= 5 s")
    row(f"network test at {2 if quick else NETWORK_NODES} nodes", f"{network:.1f}s", "<= 30 s at 8")
    row("measurement cost per step", "gpu_check 7", "<= 1 %")
    met = first["false_verdicts"] == 0 and first["onset_to_verdict"] <= 60 and first["right"] and max(checks) <= 5
    met = met and network <= 30
    met = met and here["then"] == "restart" and here["fault_to_next_start"] <= 5
    print("targets met" if met else "TARGETS MISSED")


def row(what: str, value: object, target: str) -> None:
    print(f"{what:<56}{str(value):>10}{target:>12}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kit-home", help="a KIT_HOME whose local cluster is up (default: a throw-away cluster)")
    ap.add_argument("--clean", type=float, default=None, help="seconds of clean training [600; --quick 20]")
    args = ap.parse_args()
    clean = args.clean if args.clean is not None else 20.0 if args.quick else 600.0
    on_cluster(
        "bench_failslow", args.kit_home, NETWORK_NODES, lambda cluster, tmp: measure(cluster, tmp, args.quick, clean)
    )


if __name__ == "__main__":
    main()
