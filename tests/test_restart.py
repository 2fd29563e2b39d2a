"""A run restarted inside its allocation: after a hang, with a restart left and no node the partition could spare
for the suspect, prelaunch starts a new srun step in the same job (no requeue: Slurm's restart count stays 0), and
every way the job then ends tells the truth; runs.jsonl, the report and the events tell the restart from a requeue.

The session's cluster has 2 nodes, so a 2-node job's suspect node cannot be left out: the restart stays in the
allocation (a job whose partition has a node to spare is requeued without the suspect: test_recovery)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import Receiver, check_end, kit, launch_wait, read_logs, runs, scancel, wait_for

from kit.core import outcome
from kit.jobdir import events

# Rank 1 stops reporting progress in run 0 (rank 0 goes on for 18 s); in later runs both finish in 1.5 s, unless
# HANG_ALWAYS: then every run is run 0's. Python, so that the hang report names the rank from its stack.
SCRIPT = """
import os, time
from pathlib import Path
progress, rank, run = Path(os.environ["KIT_PROGRESS_FILE"]), os.environ["RANK"], os.environ["KIT_RESTART"]
progress.write_text("step 1\\n")
again = run != "0" and not os.environ.get("HANG_ALWAYS")
if rank == "1" and not again:
    time.sleep(300)
for i in range(2, 6 if again else 60):
    progress.write_text(f"step {i}\\n")
    time.sleep(0.3)
print(f"rank {rank} run {run} done", flush=True)
"""


def restarts_of(cluster, job_id: str) -> str:
    """Slurm's own count of the job's requeues (scontrol keeps an ended job for MinJobAge, 300 s)."""
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], env={**os.environ, **cluster.target.env}, capture_output=True, text=True
    ).stdout
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("Restarts="))


def hanging(tmp_path, restarts: int, *more: str, command: str = SCRIPT):
    """A 2-node job (every node of the session's cluster) of ``command`` watched with a 3 s hang timeout."""
    return launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--hang-timeout",
        "3",
        "--max-restarts",
        str(restarts),
        *more,
        command=[sys.executable, "-c", command] if command is SCRIPT else ["bash", "-c", command],
    )


def test_a_hang_restarts_in_the_allocation_and_the_job_completes_there(cluster, tmp_path):
    w = hanging(tmp_path, 2)
    err = check_end(
        cluster,
        w,
        state="COMPLETED",
        code=0,
        finished=True,
        log="restarting in this allocation (restart 1 of 2), node2 kept: the partition has no node to spare",
        ends=["hang", "finished"],
    )
    first, second = runs(w.job_dir)
    assert first["then"] == "restart" and "then" not in second, (first, second)
    # --wait's end names the hung rank and why the run restarted
    assert f"kit: job {w.job_id}: run 0 ended hang" in err and "rank 1" in err, err
    assert ": hang: " in err and "; restarted in the allocation" in err, err
    assert restarts_of(cluster, w.job_id) == "0"  # one allocation, no requeue
    logs = read_logs(w.job_dir)
    assert "rank 0 run 1 done" in logs and "rank 1 run 1 done" in logs and "run 0 done" not in logs, logs
    report = (w.job_dir / "hang" / "r0" / "report").read_text()
    assert "rank=1\n" in report and "node=node2\n" in report, report
    said = [e.text for e in events.events(w.job_dir) if e.kind == "started"]
    assert said == ["started", "started (restarted in the allocation)"], said
    out = kit("report", str(w.job_dir)).stdout
    assert "2 run(s), 1 restart(s) in the allocation, 0 requeue(s)" in out, out
    assert out.splitlines()[1] == "ended COMPLETED: the work finished (exit code 0)", out  # as --wait told it


def test_a_hang_in_every_run_spends_the_budget_inside_the_allocation_and_fails_hung(cluster, tmp_path):
    w = hanging(tmp_path, 1, "--env", "HANG_ALWAYS=1")
    check_end(
        cluster,
        w,
        state="FAILED",
        code=outcome.HUNG,
        finished=False,
        log="retry budget spent (1 restarts), not requeueing",
        ends=["hang", "hang"],
    )
    assert [r.get("then") for r in runs(w.job_dir)] == ["restart", None]
    assert restarts_of(cluster, w.job_id) == "0"
    assert (w.job_dir / "hang" / "r1" / "report").exists()


SPARE = """
echo "step 1" >"$KIT_PROGRESS_FILE"
echo "run $KIT_RESTART on $SLURMD_NODENAME, rendezvous $MASTER_ADDR:$MASTER_PORT"
if [[ "$KIT_RESTART" == 0 ]]; then sleep 300; fi
"""


def test_a_hang_on_the_batch_node_restarts_on_a_spare_node_in_the_allocation(cluster, tmp_path):
    """--nodes 1 --spare-nodes 1: the allocation holds both nodes, the step runs on node1 (the batch script's);
    rank 0 hangs there in run 0, and run 1 starts in the same allocation on node2, the spare, its rendezvous
    decided by a probe step there (the batch script's node is no longer the step's)."""
    w = hanging(tmp_path, 2, "--nodes", "1", "--spare-nodes", "1", command=SPARE)
    check_end(
        cluster,
        w,
        state="COMPLETED",
        code=0,
        finished=True,
        log="restarting in this allocation (restart 1 of 2), without node1: a spare node takes its place",
        ends=["hang", "finished"],
    )
    logs = read_logs(w.job_dir)
    assert "run 0 on node1, rendezvous" in logs and "run 1 on node2, rendezvous" in logs, logs
    assert "the rendezvous is on node2, the step's first node" in logs and "run 1: node2, MASTER_ADDR=" in logs, logs
    assert restarts_of(cluster, w.job_id) == "0"
    out = kit("report", str(w.job_dir)).stdout
    assert "(2 node(s), 2 run(s), 1 restart(s) in the allocation, 0 requeue(s))" in out, out


def test_a_run_restarted_in_the_allocation_and_then_cancelled_ends_cancelled(cluster, tmp_path):
    """scancel during the run started in the allocation: CANCELLED (80), no FINISHED, no further run; the first
    run's record says it was followed by a restart, the cancelled run's says it was stopped."""
    w = hanging(tmp_path, 3, "--env", "HANG_ALWAYS=1")
    wait_for(lambda: (w.job_dir / "progress" / "r1" / "rank-0").exists(), 60, what="run 1's first progress")
    scancel(cluster, w.job_id)
    check_end(cluster, w, state="CANCELLED", code=outcome.CANCELLED, finished=False, log=None, ends=None)
    ended = runs(w.job_dir)
    assert [r["run"] for r in ended][:1] == [0] and ended[0]["then"] == "restart", ended
    assert all(r["run"] <= 1 for r in ended) and not (w.job_dir / "progress" / "r2").exists(), ended
    assert restarts_of(cluster, w.job_id) == "0"


FAILING = """
echo "step 1" >"$KIT_PROGRESS_FILE"
echo "run $KIT_RESTART rank $RANK on $SLURMD_NODENAME"
if [[ "$RANK" == "${FAIL_RANK:-0}" && ( "$KIT_RESTART" == 0 || -n "${FAIL_ALWAYS-}" ) ]]; then exit 3; fi
sleep 2
"""


def test_a_failed_command_restarts_on_a_spare_node_with_on_failure_restart(cluster, tmp_path):
    """--on-failure restart --nodes 1 --spare-nodes 1: the command exits 3 on node1 in run 0; run 1 starts in the
    same allocation on the spare, node2, and completes: one job, no requeue, the failed run recorded as such. kit
    events and the webhook name the spare and the node it replaced."""
    receiver = Receiver()
    more = ("--nodes", "1", "--spare-nodes", "1", "--on-failure", "restart", "--notify", f"{receiver.url}/hook")
    w = hanging(tmp_path, 2, *more, command=FAILING)
    err = check_end(
        cluster,
        w,
        state="COMPLETED",
        code=0,
        finished=True,
        log="a command failed (exit 3); restarting in this allocation (restart 1 of 2), without node1: a spare node "
        "takes its place",
        ends=["failed", "finished"],
    )
    assert [r.get("then") for r in runs(w.job_dir)] == ["restart", None]
    told = (
        f"kit: job {w.job_id}: run 0 ended failed (exit code 3): rank 0 on node1 failed first, exit code 3; restarted"
    )
    assert told in err, err  # --wait's end: the rank that failed, and what followed
    started = [e.text for e in events.events(w.job_dir) if e.kind == "started"]
    assert started == ["started", "started (restarted in the allocation); node2 in place of node1"], started
    try:
        sent = wait_for(lambda: [b["text"] for b in receiver.bodies("/hook") if b["event"] == "started"][1:], 30)
    finally:
        receiver.close()
    assert sent == ["started (restarted in the allocation); node2 in place of node1"], sent
    logs = read_logs(w.job_dir)
    assert "run 0 rank 0 on node1" in logs and "run 1 rank 0 on node2" in logs, logs
    assert restarts_of(cluster, w.job_id) == "0"


def test_a_command_that_always_fails_spends_its_restarts_and_fails_with_its_own_code(cluster, tmp_path):
    """--on-failure restart on both nodes (none to spare): rank 1 exits 3 in every run; the run restarts once on the
    same nodes, then the job fails with exit 3 (the command's, not a budget's code); without --on-failure the same
    command fails at once (the default is to stop)."""
    w = hanging(
        tmp_path, 1, "--on-failure", "restart", "--env", "FAIL_RANK=1", "--env", "FAIL_ALWAYS=1", command=FAILING
    )
    check_end(
        cluster,
        w,
        state="FAILED",
        code=3,
        finished=False,
        log="restarting in this allocation (restart 1 of 1), node2 kept: no spare node in the allocation",
        ends=["failed", "failed"],
    )
    assert [r.get("then") for r in runs(w.job_dir)] == ["restart", None]
    once = hanging(tmp_path, 1, "--env", "FAIL_RANK=1", command=FAILING)
    check_end(cluster, once, state="FAILED", code=3, finished=False, log=None, ends=["failed"])
