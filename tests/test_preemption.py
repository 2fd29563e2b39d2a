"""The preemption plan, on real time limits (the README's outcome table).

Seven jobs of 1 minute (the handlerless loop's: 2) run side by side, each told
to expect the warning 45 s before its limit: one that resumes after a requeue, one with no retry
budget, one whose work is already finished when the warning comes, one with
no handler for the warning and no restart left, and a user's loop with no
handler and restarts left (kit stops it before the limit, requeues it, and
calls it finished when its next run ends its work by itself), and a Python
function job (kit.submit) likewise: the rows of the README's outcome table that
need a real time limit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from helpers import kit, read_logs, runs, submit, wait_for, wait_no_processes

import kit as kitlib
from kit import slurm
from kit.core import outcome

TRAIN = [sys.executable, "-m", "kit.train", "--checkpoint-every", "0", "--log-every", "10"]
WARN = ["--time", "1", "--signal-lead", "45", "--heartbeat", "5"]


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preempt")
    slow = [*TRAIN, "--max-steps", "100000", "--step-delay", "0.1"]
    return {
        "resume": submit(tmp, "--nodes", "2", "--max-restarts", "3", *WARN, command=slow),
        "budget": submit(tmp, "--nodes", "1", "--max-restarts", "0", *WARN, command=slow),
        # kit's checkpoints (the trainer's default): the warning's save goes to every tier.
        "snapshots": submit(
            tmp,
            "--nodes",
            "2",
            "--max-restarts",
            "3",
            *WARN,
            command=[
                *TRAIN[:3],
                "--log-every",
                "10",
                "--max-steps",
                "100000",
                "--step-delay",
                "0.1",
                f"--checkpoint-memory={tmp / 'shm'}",
                f"--checkpoint-local={tmp / 'disk'}",
            ],
        ),  # fmt: skip
        # Its work is done at once; it then waits for the warning and exits 0.
        "finished": submit(
            tmp,
            "--nodes",
            "1",
            "--max-restarts",
            "3",
            *WARN,
            command=["bash", "-c", 'trap "exit 0" USR1; touch "$KIT_FINISHED_FILE"; sleep 300 & wait'],
        ),
        # No handler for the warning and no restart left: never sent the signal (it
        # would die of it); Slurm ends it at the time limit.
        "timeout": submit(tmp, "--nodes", "1", "--max-restarts", "0", *WARN, command=["sleep", "300"]),
        # Two minutes: with one, Slurm may warn a run at its very start (its periodic check finds the limit within
        # the lead at once), in bash's start-up before prelaunch's first trap, which kills the batch script. A
        # limit that short is the tests' own; this job's two runs are not about that window.
        "handlerless": submit(
            tmp,
            "--nodes",
            "2",
            "--max-restarts",
            "2",
            "--time",
            "2",
            *WARN[2:],
            command=[sys.executable, str(Path(__file__).parent / "handlerless_train.py")],
        ),
        # A Python function (kit.submit) that has no handler either: its first run outlasts the
        # limit, the second returns at once.
        "function": kitlib.submit(
            _long_then_done, local=True, output_dir=tmp / "fn", max_restarts=2, time="1", signal_lead=45, heartbeat=5
        ),
    }


def _long_then_done():
    import os
    import time

    if os.environ["KIT_RESTART"] == "0":
        time.sleep(300)
    return f"done in run {os.environ['KIT_RESTART']}"


def test_warning_checkpoints_requeues_and_resumes_from_the_saved_step(cluster, jobs):
    job = jobs["resume"]
    job_id, job_dir = job["job_id"], Path(job["job_dir"])

    def requeued():
        st = slurm.job_status(cluster.target, job_id)
        return st if st.restarts >= 1 else None

    wait_for(requeued, 120, poll=0.5, what="the job to requeue itself")
    first = (job_dir / "logs" / "rank-0.r0.log").read_text()
    saved = re.search(r"warning signal: saved last.ckpt at step (\d+), stopping", first)
    assert saved, first
    saved_step = int(saved.group(1))
    assert saved_step > 0
    assert (job_dir / "checkpoints" / "last.ckpt").exists()
    assert "requeueing (restart 1 of 3)" in read_logs(job_dir)
    # The requeue is a record (kit events, --notify), written once Slurm took the requeue and the next run's nodes.
    record = job_dir / "progress" / "r0" / "requeued"
    why = wait_for(lambda: record.exists() and record.read_text(), 30, what="the requeue's record")
    assert why.strip() and why.strip() in read_logs(job_dir), why
    # Slurm would hold the requeued job for 2 minutes (BeginTime): prelaunch gave it an
    # earlier begin time itself, so the next run comes without help from this test.

    def resumed():
        path = job_dir / "logs" / "rank-0.r1.log"
        text = path.read_text() if path.exists() else ""
        m = re.search(r"resuming from .*last.ckpt at step (\d+)", text)
        # Slurm may send the warning up to a minute early, so the second run
        # may be warned right away too: it then saves again, a step further.
        later = [int(s) for s in re.findall(r"step=(\d+) loss|saved last.ckpt at step (\d+)", text) for s in s if s]
        return (m, later) if m and later else None

    m, later = wait_for(resumed, 120, what="the second run to resume and step")
    assert int(m.group(1)) == saved_step
    assert min(later) > saved_step, f"second run reached steps {later} after resuming at {saved_step}"
    # The first run's logs are still there, untouched by the second.
    assert (job_dir / "logs" / "rank-0.r0.log").read_text() == first
    merged = read_logs(job_dir)
    assert "run 0: 2 node(s)" in merged and "run 1: 2 node(s)" in merged
    subprocess.run(["scancel", job_id], env={**os.environ, **cluster.target.env}, check=True)
    # Cancelled, also when the second run's warning came first: never requeued after the cancel.
    end = slurm.wait(cluster.target, job_id, timeout=90)
    assert end.state == "CANCELLED" and end.restarts == 1, (end, read_logs(job_dir)[-3000:])
    assert wait_no_processes(job_dir, 5) == []
    events = kit("events", str(job_dir)).stdout
    assert f"run 0   requeued: {why.strip()}" in events and "run 1   started (requeued)" in events, events
    assert "run 1   the batch script ended with exit code" in events and "a stop signal came" in events, events


def test_warning_saves_kits_checkpoint_to_every_tier_and_the_requeued_run_resumes_there(cluster, jobs):
    """With kit's checkpoints the warning's save is forced to every tier: the job directory holds the step, sealed
    (every rank's shard and its peer copy), before the run stops; the requeued run resumes from exactly that step."""
    job = jobs["snapshots"]
    job_id, job_dir = job["job_id"], Path(job["job_dir"])
    wait_for(lambda: slurm.job_status(cluster.target, job_id).restarts >= 1, 120, poll=0.5, what="the requeue")
    first = (job_dir / "logs" / "rank-0.r0.log").read_text()
    saved = re.search(r"warning signal: saved a checkpoint to every tier at step (\d+), stopping", first)
    assert saved, first
    step = int(saved.group(1))
    wait_for(lambda: (job_dir / "checkpoints" / "restore.r1.json").exists(), 120, what="run 1's resume")
    restore = json.loads((job_dir / "checkpoints" / "restore.r1.json").read_text())
    assert restore["step"] == step and restore["newest_held"] == step, restore
    # Sealed before run 0 stopped: run 1 found it complete in the job directory before it made a step of its own.
    # (Later runs, warned in turn, seal newer steps and drop the old: the directory of today may have moved on.)
    assert step in restore["shared"], (restore, sorted(p.name for p in (job_dir / "checkpoints").iterdir()))
    sealed = job_dir / "checkpoints" / f"step-{step}" / "manifest.json"
    if sealed.exists():
        manifest = json.loads(sealed.read_text())
        assert manifest["world"] == 2 and sorted(manifest["shards"]) == ["0", "1"], manifest
    subprocess.run(["scancel", job_id], env={**os.environ, **cluster.target.env}, check=True)
    slurm.wait(cluster.target, job_id, timeout=90)
    assert wait_no_processes(job_dir, 15) == []


def test_retry_budget_is_honoured(cluster, jobs):
    job = jobs["budget"]
    end = slurm.wait(cluster.target, job["job_id"], timeout=150)
    logs = read_logs(job["job_dir"])
    assert end.restarts == 0
    assert "retry budget spent (0 restarts), not requeueing" in logs
    assert re.search(r"saved last.ckpt at step \d+", logs)
    # Stopped before its work was done: not reported as a success.
    assert (end.state, end.exit_code) == ("FAILED", 75)


def test_finished_job_is_never_requeued(cluster, jobs):
    job = jobs["finished"]
    end = slurm.wait(cluster.target, job["job_id"], timeout=150)
    logs = read_logs(job["job_dir"])
    assert end.restarts == 0, logs
    assert "got SIGUSR1" in logs
    assert "the work is finished" in logs and "requeueing" not in logs
    assert (end.state, end.exit_code) == ("COMPLETED", 0)
    assert (Path(job["job_dir"]) / "FINISHED").exists()


def test_time_limit_without_acting_on_the_warning_is_a_timeout(cluster, jobs):
    job = jobs["timeout"]
    end = slurm.wait(cluster.target, job["job_id"], timeout=200)
    result = slurm.job_outcome(end, Path(job["job_dir"]))
    assert (end.state, result.exit_code) == ("TIMEOUT", outcome.TIME_LIMIT), read_logs(job["job_dir"])
    assert not (Path(job["job_dir"]) / "FINISHED").exists()
    logs = read_logs(job["job_dir"])
    assert "got SIGUSR1" in logs
    # Not killed by the warning: it ran on to the limit.
    assert "has no handler for SIGUSR1: not sending it" in logs and "sent SIGUSR1" not in logs, logs
    # ... said before the limit, however late Slurm's warning came: prelaunch gave the time to say it by.
    assert (Path(job["job_dir"]) / "progress" / "r0" / "limit-near").read_text().strip().isdigit()
    assert "stopping it, to requeue" not in logs  # no restart left: nothing to stop it for
    assert wait_no_processes(job["job_dir"], 15) == []


def test_a_command_without_a_handler_is_requeued_before_the_limit_and_finishes(cluster, jobs):
    """A loop with no USR1 handler is never killed by the warning;
    kit stops it shortly before the limit and requeues it, the next run starts without
    Slurm's 2-minute hold after a requeue, resumes from the saved step, and ends its work
    by itself after that run's warning: COMPLETED, FINISHED, exit 0."""
    job = jobs["handlerless"]
    job_dir = Path(job["job_dir"])
    end = slurm.wait(cluster.target, job["job_id"], timeout=300)
    logs = read_logs(job_dir)
    result = slurm.job_outcome(end, job_dir)
    assert (end.state, end.restarts, result.exit_code) == ("COMPLETED", 1, 0), logs[-3000:]
    assert (job_dir / "FINISHED").exists()
    ends = runs(job_dir)
    assert [r["end"] for r in ends] == ["warned", "finished"] and ends[0]["advanced"], ends
    run0 = logs[: logs.index("run 1: 2 node(s)")]
    assert sorted(
        re.findall(
            r"^(\d): \[kit \S+ rank \1\] the command \(pid \d+\) has no handler for SIGUSR1: "
            r"not sending it",
            run0,
            re.M,
        )
    ) == ["0", "1"], run0
    assert "sent SIGUSR1" not in logs
    assert "the job step still runs" in logs and "stopping it, to requeue the job" in logs
    assert "exit 138" not in logs
    saved = ends[0]["checkpoint_step"]
    second = (job_dir / "logs" / "rank-0.r1.log").read_text()
    assert f"rank 0 run 1: starting at step {saved}" in second and "all work done" in second, second
    assert "after the warning, every command by itself; the work is finished" in logs
    # The next run started long before Slurm's hold after a requeue (121 s) would have ended.
    stamp = re.search(r"^\[kit (\S+) prelaunch\] job \d+ run 1:", logs, re.M)
    gap = datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S%z").timestamp() - ends[0]["time"]
    assert gap < 121, f"run 1 started {gap} s after run 0 ended"
    print(f"requeue gap: {gap:.0f} s")
    assert wait_no_processes(job_dir, 15) == []


def test_a_function_job_is_stopped_before_the_limit_requeued_and_finishes(cluster, jobs):
    """A function job keeps kit's semantics: run 0 outlasts the limit (no
    handler for the warning: stopped before it, requeued), run 1 returns; its result is run 1's,
    FINISHED only then."""
    job = jobs["function"]
    assert job.result(timeout=300) == "done in run 1"
    end = job.wait()
    assert (end.state, end.restarts, end.exit_code) == ("COMPLETED", 1, 0), read_logs(job.dir)[-3000:]
    assert [r["end"] for r in runs(job.dir)] == ["warned", "finished"] and (job.dir / "FINISHED").exists()
    assert wait_no_processes(job.dir, 15) == []
