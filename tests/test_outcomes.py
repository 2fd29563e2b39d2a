"""Every way a job ends tells the truth (state, marker and exit code).

One case per row of the README's outcome table that the session cluster can
show in seconds; the rows that need a real time limit are in
test_preemption.py, those that kill daemons in test_recovery.py. Each case
checks Slurm's final state, the FINISHED marker, what ran next, the exit code
of `kit launch --wait` (the real command line), the log line, and that nothing
of the job is left: no process, no held port lock, no exporter target file,
no mount.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    Waiting,
    check_end,
    hastened,
    job_processes,
    kit,
    launch_and_wait,
    launch_wait,
    read_logs,
    release_requeued,
    runs,
    scancel,
    scontrol,
    state_is,
    wait_for,
)

from kit import slurm
from kit.core import outcome

HOLD = 'trap "exit 0" TERM; echo ready; sleep 300 & wait'


def wait_ready(w: Waiting, ranks: int = 1) -> None:
    wait_for(
        lambda: len(re.findall(r"^\d+: ready$", read_logs(w.job_dir), re.M)) >= ranks, 60, what="the command to start"
    )


def release_after_first_run(cluster, w: Waiting) -> None:
    release_requeued(cluster, w.job_id, w.job_dir)
    assert not (w.job_dir / "FINISHED").exists()


def rank_process(job_dir: Path, rank: int, needle: str) -> int | None:
    for pid, cmd in job_processes(job_dir):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in cmd and f"RANK={rank}".encode() in environ:
            return pid
    return None


def row_completed(cluster, tmp_path):
    w = launch_wait(tmp_path, command=["bash", "-c", "echo done"])
    check_end(
        cluster,
        w,
        state="COMPLETED",
        code=0,
        finished=True,
        log="step ended with exit 0; the work is finished",
        ends=["finished"],
    )


def row_command_failed(cluster, tmp_path):
    w = launch_wait(tmp_path, "--nodes", "2", command=["bash", "-c", "exit 3"])
    check_end(cluster, w, state="FAILED", code=3, finished=False, log="step ended with exit 3", ends=["failed"])


def row_cancelled_while_pending(cluster, tmp_path):
    w = launch_wait(tmp_path, "--sbatch-arg=--begin=now+600", command=["true"])
    wait_for(state_is(cluster, w.job_id, "PENDING"), 30)
    scancel(cluster, w.job_id)
    check_end(cluster, w, state="CANCELLED", code=outcome.CANCELLED, finished=False, log=None, ends=[])
    assert not (w.job_dir / "logs" / f"slurm-{w.job_id}.out").exists()  # it never ran


def row_cancelled_while_starting(cluster, tmp_path):
    # Cancelled the moment Slurm starts it: prelaunch is setting up, the step may not exist yet.
    w = launch_wait(tmp_path, "--nodes", "2", command=["bash", "-c", "echo started; sleep 5"])
    wait_for(state_is(cluster, w.job_id, "RUNNING"), 30, poll=0.01)
    scancel(cluster, w.job_id)
    check_end(cluster, w, state="CANCELLED", code=outcome.CANCELLED, finished=False, log=None, ends=None)
    # Before the step started there is no run to record; after, the run is recorded as stopped.
    assert [r["end"] for r in runs(w.job_dir)] in ([], ["stopped"])


def row_cancelled_while_running(cluster, tmp_path):
    # The command exits 0 on TERM, as Lightning does: still not finished.
    w = launch_wait(tmp_path, "--nodes", "2", command=["bash", "-c", HOLD])
    wait_ready(w, 2)
    scancel(cluster, w.job_id)
    check_end(
        cluster,
        w,
        state="CANCELLED",
        code=outcome.CANCELLED,
        finished=False,
        log="after a stop signal; the work is not finished",
        ends=["stopped"],
    )


def row_cancelled_after_the_warning(cluster, tmp_path):
    # A cancel after the warning, restarts left: cancelled, never requeued (Slurm requeues even a cancelled
    # batch job when asked, which would undo the user's cancel).
    w = launch_wait(tmp_path, "--max-restarts", "2", command=["bash", "-c", HOLD])
    wait_ready(w)
    subprocess.run(
        ["scancel", "--batch", "--signal=USR1", w.job_id], env={**os.environ, **cluster.target.env}, check=True
    )
    wait_for(lambda: "got SIGUSR1" in read_logs(w.job_dir), 30, what="the warning")
    scancel(cluster, w.job_id)
    check_end(
        cluster,
        w,
        state="CANCELLED",
        code=outcome.CANCELLED,
        finished=False,
        log="a stop signal came that was not the time limit",
        ends=["warned"],
    )
    assert slurm.job_status(cluster.target, w.job_id).restarts == 0


def row_requeued_by_admin(cluster, tmp_path):
    # scontrol requeue is what preemption with PreemptMode=REQUEUE does.
    cmd = f'if [ "$KIT_RESTART" = 0 ]; then {HOLD}; fi; echo second run'
    w = launch_wait(tmp_path, command=["bash", "-c", cmd])
    wait_ready(w)
    scontrol(cluster, "requeue", w.job_id)
    release_after_first_run(cluster, w)
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log="0: second run", ends=["stopped", "finished"])


def resume(cluster, node: str) -> None:
    """Bring a node set DOWN back (ReturnToService=2 may have done it already)."""
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
        env={**os.environ, **cluster.target.env},
        capture_output=True,
    )
    wait_for(
        lambda: (
            "idle"
            in subprocess.run(
                ["sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T"],
                env={**os.environ, **cluster.target.env},
                capture_output=True,
                text=True,
            ).stdout
        ),
        30,
        what=f"{node} to be idle again",
    )


def row_requeued_beyond_the_budget(cluster, tmp_path):
    # Requeues by Slurm or an admin count against --max-restarts too.
    w = launch_wait(tmp_path, "--max-restarts", "1", command=["bash", "-c", HOLD])
    for restart in (1, 2):
        wait_ready_in_run(w, restart - 1)
        scontrol(cluster, "requeue", w.job_id)
        release_requeued(cluster, w.job_id, w.job_dir, restart)
    check_end(
        cluster,
        w,
        state="FAILED",
        code=outcome.BUDGET_SPENT,
        finished=False,
        log="run 2: requeued more often than --max-restarts 1; retry budget spent, not running",
        ends=["stopped", "stopped"],
    )


def wait_ready_in_run(w: Waiting, restart: int) -> None:
    log = w.job_dir / "logs" / f"rank-0.r{restart}.log"
    wait_for(lambda: log.exists() and "ready" in log.read_text(), 60, what=f"run {restart} to start")


def node_of(cluster, job_id: str) -> str:
    return wait_for(lambda: slurm.job_status(cluster.target, job_id).nodes, 30)


def row_node_failure_without_requeue(cluster, tmp_path):
    w = launch_wait(tmp_path, "--max-restarts", "0", command=["bash", "-c", HOLD])
    wait_ready(w)
    node = node_of(cluster, w.job_id)
    scontrol(cluster, "update", f"NodeName={node}", "State=DOWN", "Reason=kit-test")
    try:
        check_end(cluster, w, state="NODE_FAIL", code=outcome.NODE_FAILED, finished=False, log=None, ends=None)
        # srun may exit 0 when its node fails, before the stop reaches prelaunch: never "finished". Slurm may
        # also kill the batch script before its trap writes anything (seen once in a loaded full suite; a
        # node that really fails leaves no record either): the end is then Slurm's NODE_FAIL alone, which
        # check_end held above (state, exit code, no FINISHED).
        assert [r["end"] for r in runs(w.job_dir)] in ([], ["incomplete"], ["stopped"])
    finally:
        resume(cluster, node)


def row_node_failure_requeued(cluster, tmp_path):
    cmd = f'if [ "$KIT_RESTART" = 0 ]; then {HOLD}; fi; echo second run on $SLURMD_NODENAME'
    w = launch_wait(tmp_path, "--max-restarts", "2", command=["bash", "-c", cmd])
    wait_ready(w)
    node = node_of(cluster, w.job_id)
    scontrol(cluster, "update", f"NodeName={node}", "State=DOWN", "Reason=kit-test")
    try:
        release_after_first_run(cluster, w)
        err = check_end(cluster, w, state="COMPLETED", code=0, finished=True, log="0: second run on", ends=None)
        # Run 0 ends in its own record (the stop reached prelaunch's trap), or — when slurmstepd's "CANCELLED DUE
        # TO NODE FAILURE" killed the batch script at once, as in one full suite (its log ends at srun's "Node
        # failure" line) — in the next run's catch-up, "killed": either way never finished, and run 1 ran it.
        assert [r["end"] for r in runs(w.job_dir)] in (
            ["incomplete", "finished"],
            ["stopped", "finished"],
            ["killed", "finished"],
        )
        assert "after 1 restart(s)" in err
    finally:
        resume(cluster, node)


def row_rank_killed(cluster, tmp_path):
    w = launch_wait(tmp_path, "--nodes", "2", "--step-wait", "10", command=["bash", "-c", "echo ready; sleep 300"])
    wait_ready(w, 2)
    os.kill(wait_for(lambda: rank_process(w.job_dir, 1, "sleep 300"), 10), signal.SIGKILL)
    check_end(cluster, w, state="FAILED", code=137, finished=False, log="step ended with exit 137", ends=["failed"])


def row_hang_with_budget_spent(cluster, tmp_path):
    # Reports progress once, then never again: a hang with no restart left.
    w = launch_wait(
        tmp_path,
        "--max-restarts",
        "0",
        "--hang-timeout",
        "3",
        command=["bash", "-c", 'echo "step 1" >"$KIT_PROGRESS_FILE"; echo ready; sleep 300'],
    )
    check_end(
        cluster,
        w,
        state="FAILED",
        code=outcome.HUNG,
        finished=False,
        log="retry budget spent (0 restarts), not requeueing",
        ends=["hang"],
    )
    assert (w.job_dir / "hang" / "r0" / "rank-0.txt").exists()


NO_PROGRESS = (
    'echo 5 >"$KIT_CHECKPOINT_STEP_FILE"; echo "step 5" >"$KIT_PROGRESS_FILE"; echo "run $KIT_RESTART"; sleep 300'
)


def decided_about(node: str) -> str:
    """What the batch log says the next run does with a suspect ``node``: requeued without it or with it, or
    restarted in the allocation with it kept or a spare in its place."""
    return rf"(the next run (leaves out|may use) {node}\b|restarting in this allocation .*\b{node}\b)"


def row_no_progress(cluster, tmp_path):
    # Every run ends (hung) at checkpoint step 5: the second run in a row that
    # does not advance it ends the retries, with budget left.
    # Each requeue is prelaunch's: it releases Slurm's hold after a requeue itself.
    w = launch_wait(tmp_path, "--max-restarts", "5", "--hang-timeout", "3", command=["bash", "-c", NO_PROGRESS])
    with hastened(cluster, w.job_id):
        check_end(
            cluster,
            w,
            state="FAILED",
            code=outcome.NO_PROGRESS,
            finished=False,
            log="the checkpoint step did not advance in this run or the one before (still 5): not requeueing again",
            ends=["hang", "hang", "hang"],
        )
    assert [r["advanced"] for r in runs(w.job_dir)] == [True, False, False]


ROWS = [
    row_completed,
    row_command_failed,
    row_cancelled_while_pending,
    row_cancelled_while_starting,
    row_cancelled_while_running,
    row_cancelled_after_the_warning,
    row_requeued_by_admin,
    row_requeued_beyond_the_budget,
    row_node_failure_without_requeue,
    row_node_failure_requeued,
    row_rank_killed,
    row_hang_with_budget_spent,
    row_no_progress,
]


@pytest.mark.parametrize("row", ROWS, ids=[r.__name__[4:] for r in ROWS])
def test_outcome_row(row, cluster, tmp_path):
    row(cluster, tmp_path)


def test_a_warning_as_the_batch_script_starts_is_kept_and_acted_on(cluster, tmp_path):
    """Slurm may send the warning signal as a run starts (it warned a requeued run 33 ms after starting it, before
    prelaunch had set its traps: the batch script died of it, FAILED 138 with restarts left). Here it comes while
    prelaunch's first external command runs (a mkdir on PATH that signals its parent, the batch script): the
    warning is kept and handed to the command, which ends its work on it."""
    bin_dir, flag = tmp_path / "bin", tmp_path / "signalled"
    bin_dir.mkdir()
    (bin_dir / "mkdir").write_text(
        "#!/bin/sh\n"
        f"if [ ! -e {flag} ] && tr '\\0' ' ' </proc/$PPID/cmdline | grep -q slurm_script; then\n"
        f"  : >{flag}; kill -USR1 $PPID; sleep 0.2\n"
        "fi\n"
        'exec /bin/mkdir "$@"\n'
    )
    (bin_dir / "mkdir").chmod(0o755)
    w = launch_wait(
        tmp_path,
        "--max-restarts",
        "0",
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
        command=["bash", "-c", 'trap "exit 0" USR1; touch "$KIT_FINISHED_FILE"; sleep 300 & wait'],
    )
    check_end(
        cluster,
        w,
        state="COMPLETED",
        code=0,
        finished=True,
        log="the warning signal came as the script started",
        ends=["finished"],
    )
    assert flag.exists() and "got SIGUSR1: the time limit is near" in read_logs(w.job_dir)


def test_a_step_refused_as_slurm_ends_the_job_is_recorded_as_stopped(cluster, tmp_path):
    """Cancelled as its step begins, srun is refused ("Job/step already completing") and may exit before the batch
    script's own TERM comes (seen once in a full run: the run recorded as failed while Slurm said CANCELLED; srun
    refused so in 1 of 60 cancels as the job started, the TERM then in time). Here an srun on PATH is refused so for
    the launcher's step, a squeue on PATH tells the batch script the job is COMPLETING, and the TERM comes a second
    after srun's exit: prelaunch waits for it, and the run is recorded as stopped, not failed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun, squeue = shutil.which("srun"), shutil.which("squeue")
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        'if [[ "$*" != *launcher.sh* ]]; then exec ' + srun + ' "$@"; fi\n'
        'echo "srun: error: Unable to create step for job $SLURM_JOB_ID: Job/step already completing" >&2\n'
        "(sleep 1; kill -TERM $PPID) </dev/null >/dev/null 2>&1 &\n"
        "exit 1\n"
    )
    (bin_dir / "squeue").write_text(
        "#!/bin/bash\n"
        'if [[ -n "${SLURM_JOB_ID-}" && " $* " == *" --format=%T "* ]]; then echo COMPLETING; exit 0; fi\n'
        "exec " + squeue + ' "$@"\n'
    )
    for name in ("srun", "squeue"):
        (bin_dir / name).chmod(0o755)
    w = launch_wait(tmp_path, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, command=["true"])
    w.finish()
    logs = read_logs(w.job_dir)
    assert "the step failed while Slurm ends the job (COMPLETING): waiting for its stop signal" in logs, logs
    assert "got SIGTERM" in logs and [r["end"] for r in runs(w.job_dir)] == ["stopped"], logs


TRAIN = [
    sys.executable,
    "-m",
    "kit.train",
    "--max-steps",
    "400",
    "--step-delay",
    "0.03",
    "--log-every",
    "10",
    "--checkpoint-every",
    "20",
    "--no-snapshots",  # the resume from last.ckpt is what is told here (kit's snapshots: test_checkpoints)
]


def trained_to(job_dir: Path, step: int):
    return lambda: any(int(s) >= step for s in re.findall(r"step=(\d+) loss", read_logs(job_dir)))


def test_reference_trainer_cancelled_is_not_finished(cluster, tmp_path):
    """Lightning exits 0 on SIGTERM; the job is still cancelled, not finished."""
    w = launch_wait(tmp_path, "--nodes", "2", command=TRAIN)
    wait_for(trained_to(w.job_dir, 30), 90, what="training")
    scancel(cluster, w.job_id)
    check_end(
        cluster,
        w,
        state="CANCELLED",
        code=outcome.CANCELLED,
        finished=False,
        log="after a stop signal; the work is not finished",
        ends=["stopped"],
    )


def test_reference_trainer_requeued_resumes_and_completes(cluster, tmp_path):
    w = launch_wait(tmp_path, "--nodes", "2", command=TRAIN)
    wait_for(trained_to(w.job_dir, 60), 90, what="training")
    scontrol(cluster, "requeue", w.job_id)
    release_after_first_run(cluster, w)
    err = check_end(
        cluster, w, state="COMPLETED", code=0, finished=True, log="done at step=400", ends=["stopped", "finished"]
    )
    # --wait says the requeue as Slurm makes it (an admin's: no run of kit's asked for it), not at the next start
    assert "requeued by Slurm (an admin, a preemption or a node failure); run 1 comes next" in err, err
    second = (w.job_dir / "logs" / "rank-0.r1.log").read_text()
    resumed = int(re.search(r"resuming from .*last.ckpt at step (\d+)", second).group(1))
    assert resumed >= 40
    # The step run 0 recorded is the newest save rank 0 reported done; the resume
    # reads last.ckpt. A save is reported at the next batch's start, once the file is
    # written (kit.train.metrics.ProgressCallback): a stop between the two leaves the
    # record one save (20 steps) behind the file, the safe side (seen in a full run);
    # once in CI it was one save ahead (unexplained).
    recorded = runs(w.job_dir)[0]["checkpoint_step"]
    assert resumed - 20 <= recorded <= resumed + 20, (recorded, resumed, read_logs(w.job_dir)[-3000:])


def test_wait_is_not_fooled_by_strings_and_site_export_none(cluster, tmp_path):
    """Job state comes from squeue --json: an output directory and job name made to
    look like scontrol fields change nothing; SBATCH_EXPORT=NONE jobs run."""
    odd = tmp_path / "x JobState=FAILED ExitCode=7:0"
    odd.mkdir()
    w = launch_wait(
        odd,
        "--nodes",
        "2",
        "--job-name",
        "y JobState=COMPLETED",
        command=["bash", "-c", 'echo "rank $RANK of $WORLD_SIZE via $MASTER_ADDR:$MASTER_PORT"; sleep 2'],
        env={"SBATCH_EXPORT": "NONE"},
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["finished"])
    assert sorted(re.findall(r"^\d: rank (\d) of 2 via \S+:\d+$", read_logs(w.job_dir), re.M)) == ["0", "1"]


def test_a_save_marked_on_one_rank_covers_the_ranks_waiting_for_it(cluster, tmp_path):
    """Rank 0 marks `checkpointing` and saves for 8 s; rank 1 waits
    in the barrier with no progress of its own. The hang timeout is 3 s, the first-progress
    (saving) timeout 60 s: no hang, the job finishes. The README says one rank is enough."""
    save = (
        'for i in $(seq 10); do echo "step $i" >"$KIT_PROGRESS_FILE"; sleep 0.2; done; '
        'if [ "$RANK" = 0 ]; then echo "checkpointing 10" >"$KIT_PROGRESS_FILE"; fi; '
        'sleep 8; echo "step 11" >"$KIT_PROGRESS_FILE"; echo "rank $RANK saved and went on"'
    )
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--hang-timeout",
        "3",
        "--first-progress-timeout",
        "60",
        "--max-restarts",
        "0",
        command=["bash", "-c", save],
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log="rank 1 saved and went on", ends=["finished"])
    assert not (w.job_dir / "hang" / "r0" / "report").exists()


# A plain DDP loop reporting through the documented call only.
BLAME = """
import time, torch, torch.distributed as dist
from kit.train import progress
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(100000):
    progress.step(step)
    if step == 20 and rank == 1:
        time.sleep(1)
        progress.step(step)  # the stuck rank reported last: the oldest report is the waiting rank's
        time.sleep(600)  # stuck in user code
    dist.all_reduce(torch.ones(1))
    time.sleep(0.05)
"""


def test_the_hang_report_blames_the_rank_outside_the_collective(cluster, tmp_path):
    """Rank 1 stuck in user code, rank 0 waiting for it in all_reduce
    (and reporting progress earlier): the report names rank 1 and its node, and the
    requeue decides about that node."""
    from helpers import require

    require("py-spy")
    (tmp_path / "blame.py").write_text(BLAME)
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--hang-timeout",
        "4",
        "--first-progress-timeout",
        "120",
        "--max-restarts",
        "1",
        command=[sys.executable, str(tmp_path / "blame.py")],
    )
    try:
        report = w.job_dir / "hang" / "r0" / "report"
        wait_for(report.exists, 120, poll=0.2, what="the hang report")
        fields = dict(line.split("=", 1) for line in report.read_text().splitlines())
        node1 = (w.job_dir / "progress" / "r0" / "task-1").read_text().split()[0]
        assert (fields["rank"], fields["node"]) == ("1", node1), fields
        assert "is in code of its own while 1 rank(s) wait for it" in fields["summary"], fields
        assert "torch/distributed/distributed_c10d.py" in (w.job_dir / "hang" / "r0" / "rank-0.txt").read_text()
        # The next run's decision is about that node (this 2-node cluster has none to spare: the run restarts in
        # the allocation, the node kept; test_recovery's 3-node cluster shows one left out).
        wait_for(
            lambda: re.search(decided_about(node1), read_logs(w.job_dir)),
            60,
            what="the next run's decision about the stuck rank's node",
        )
    finally:
        scancel(cluster, w.job_id)
        w.finish()


def test_without_stacks_a_hang_names_no_rank_and_is_told_in_errors_and_report(cluster, tmp_path):
    """The same hang where no stack can be taken (no py-spy where the command runs: a user of an older
    `kit-slurm[train]`): the rank that reported last is the stuck one, so progress alone would blame the
    waiting rank 0. The report names no rank, and says why; `kit logs --errors` and `kit report` tell
    the hang."""
    (tmp_path / "blame.py").write_text(BLAME)
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--hang-timeout",
        "4",
        "--first-progress-timeout",
        "120",
        "--max-restarts",
        "0",
        command=[sys.executable, str(tmp_path / "blame.py")],
        env={"PATH": "/usr/bin:/bin"},
    )  # the interpreters by their paths (KIT_PYTHON); no py-spy on PATH
    check_end(
        cluster,
        w,
        state="FAILED",
        code=outcome.HUNG,
        finished=False,
        log="retry budget spent (0 restarts), not requeueing",
        ends=["hang"],
    )
    fields = dict(line.split("=", 1) for line in (w.job_dir / "hang" / "r0" / "report").read_text().splitlines())
    assert fields["rank"] == "unknown" and fields["node"] == "", fields
    assert (
        fields["summary"].startswith("no rank named: the ranks made no progress for ")
        and "no rank's Python stacks could be taken (py-spy, in kit-slurm[train]" in fields["summary"]
    ), fields
    assert "py-spy not found" in (w.job_dir / "hang" / "r0" / "rank-1.txt").read_text()
    errors = kit("logs", str(w.job_dir), "--errors")
    assert errors.returncode == 0 and errors.stdout.startswith(f"run 0: hang: {fields['summary']}\n"), errors.stdout
    rep = kit("report", str(w.job_dir), "--prometheus", "http://127.0.0.1:1")
    assert (
        f"  ALERT: run 0 hung: {fields['summary']}; every rank's stacks in hang/r0/ (kit logs --errors)"
        in rep.stdout.splitlines()
    ), rep.stdout + rep.stderr


# Rank 1 never reaches the rendezvous; rank 0 waits in it. Neither reports progress.
RENDEZVOUS = """
import os, time, torch.distributed as dist
if os.environ["RANK"] == "1":
    time.sleep(600)  # stuck in user code before init_process_group
dist.init_process_group("gloo")
"""


def test_a_rank_that_never_reaches_the_rendezvous_is_caught(cluster, tmp_path):
    """No rank ever reports progress, so only the rendezvous tells: rank 0
    serves it and waits, rank 1 never comes. Caught once the first-progress timeout passes
    (torch's own would wait 30 minutes); the report names rank 1 and its node."""
    (tmp_path / "rendezvous.py").write_text(RENDEZVOUS)
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--hang-timeout",
        "60",
        "--first-progress-timeout",
        "15",
        "--max-restarts",
        "0",
        command=[sys.executable, str(tmp_path / "rendezvous.py")],
    )
    check_end(
        cluster,
        w,
        state="FAILED",
        code=outcome.HUNG,
        finished=False,
        log="retry budget spent (0 restarts), not requeueing",
        ends=["hang"],
    )
    fields = dict(line.split("=", 1) for line in (w.job_dir / "hang" / "r0" / "report").read_text().splitlines())
    node1 = (w.job_dir / "progress" / "r0" / "task-1").read_text().split()[0]
    assert (fields["rank"], fields["node"]) == ("1", node1), fields
    assert "has not joined the rendezvous" in fields["summary"] and "while 1 rank(s) wait in it" in fields["summary"]
    assert (w.job_dir / "progress" / "r0" / "joined-0").exists()
    assert not (w.job_dir / "progress" / "r0" / "joined-1").exists()
    errors = kit("logs", str(w.job_dir), "--errors").stdout.splitlines()  # the hang, then the blamed rank's stacks
    stacks = (w.job_dir / "hang" / "r0" / "rank-1.txt").read_text().splitlines()
    assert errors[: 1 + min(len(stacks), 60)] == [f"run 0: hang: {fields['summary']}"] + [
        "  " + line for line in stacks[:60]
    ], errors


def test_a_rendezvous_that_every_rank_joins_is_no_hang_without_progress_reports(cluster, tmp_path):
    """The other side: a DDP script that never reports progress and takes longer than the
    first-progress timeout is never called hung (every rank joined the rendezvous).
    The timeout leaves every rank time to import torch and join on a loaded 2-core machine
    (4 s did not: rank 1 joined late in a full run and was rightly called hung), and the
    script runs well past it."""
    script = (
        "import time, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "for _ in range(60):\n    dist.all_reduce(torch.ones(1)); time.sleep(0.4)\n"
        "print('done', flush=True)\ndist.destroy_process_group()\n"
    )
    (tmp_path / "quiet.py").write_text(script)
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--hang-timeout",
        "3",
        "--first-progress-timeout",
        "15",
        "--max-restarts",
        "0",
        command=[sys.executable, str(tmp_path / "quiet.py")],
    )
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log="1: done", ends=["finished"])
    assert all((w.job_dir / "progress" / "r0" / f"joined-{r}").exists() for r in (0, 1))


# Rank 0 reaches the rendezvous late (a slow import under load), past first-progress + 10 s;
# rank 1 never comes.
LATE = """
import os, time, torch.distributed as dist
time.sleep(22 if os.environ["RANK"] == "0" else 600)
dist.init_process_group("gloo")
"""


def test_a_rendezvous_reached_late_is_still_watched(cluster, tmp_path):
    """The launcher marked `joined` only within first-progress + 10 s of the
    task's start; rank 0 serving the rendezvous later was never marked, no rank had joined, and
    the job hung until cancelled. Now rank 0 is marked late, and rank 1 is named."""
    (tmp_path / "late.py").write_text(LATE)
    w = launch_wait(
        tmp_path,
        "--nodes",
        "2",
        "--no-exporter",
        "--hang-timeout",
        "60",
        "--first-progress-timeout",
        "5",
        "--max-restarts",
        "0",
        command=[sys.executable, str(tmp_path / "late.py")],
    )
    check_end(cluster, w, state="FAILED", code=outcome.HUNG, finished=False, log=None, ends=["hang"])
    fields = dict(line.split("=", 1) for line in (w.job_dir / "hang" / "r0" / "report").read_text().splitlines())
    assert fields["rank"] == "1" and "has not joined the rendezvous" in fields["summary"], fields
    assert (w.job_dir / "progress" / "r0" / "joined-0").exists()


# Every rank declares its work finished, then rank 1 aborts, as torch 2.13's gloo teardown does now and then.
TEARDOWN = """
import json
import os
from kit.train import progress
progress.step(1, loss=0.5, samples=8, max_steps=1)
print("work done", flush=True)
progress.finished()
if os.environ["RANK"] == "1":
    os.abort()
"""


def test_work_declared_finished_then_a_teardown_abort_is_finished_and_the_chain_goes_on(cluster, tmp_path):
    """Every rank called kit.train.progress.finished(), then one died in
    its teardown (SIGABRT, 134): the job is COMPLETED with exit 0, the abort is told in the
    batch log and runs.jsonl, and a stage launched --after it runs."""
    (tmp_path / "teardown.py").write_text(TEARDOWN)
    first = launch_wait(tmp_path, "--nodes", "2", command=[sys.executable, str(tmp_path / "teardown.py")])
    second = launch_wait(tmp_path, "--after", first.job_id, command=["bash", "-c", "echo stage two ran"])
    check_end(
        cluster,
        first,
        state="COMPLETED",
        code=0,
        finished=True,
        log="after its work was declared finished: a failure in teardown; the work is finished",
        ends=["finished"],
    )
    (run,) = runs(first.job_dir)
    assert (run["exit_code"], run["teardown_exit_code"]) == (0, 134), run
    check_end(cluster, second, state="COMPLETED", code=0, finished=True, log="stage two ran", ends=["finished"])
    # A code of the command's own after the declaration (a wrapper's next stage failed) still fails the job.
    (tmp_path / "after.py").write_text(TEARDOWN.replace("os.abort()", "raise SystemExit(3)"))
    third = launch_wait(
        tmp_path, "--nodes", "2", "--max-restarts", "0", command=[sys.executable, str(tmp_path / "after.py")]
    )
    check_end(
        cluster,
        third,
        state="FAILED",
        code=3,
        finished=False,
        log="step ended with exit 3 after the work was declared finished: a command failed after it",
        ends=["failed"],
    )


# A DDP model; at step 20 rank 1 is stuck in code of its own, rank 0 waits
# for it in the way named. Rank 1 reports last (the oldest report is the waiting rank's).
STUCK = """
import os, sys, time, torch, torch.distributed as dist
from kit.train import progress
stuck, waits = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))

class Never(torch.utils.data.Dataset):  # a data source that never delivers
    def __len__(self):
        return 10
    def __getitem__(self, i):
        while True:
            time.sleep(1)

def stuck_here():
    if stuck == "sleep":
        time.sleep(600)
    elif stuck == "busy":
        while True:
            pass
    else:
        r, w = os.pipe()
        os.read(r, 1)  # a blocking read that never returns

def wait_here():
    if waits == "backward":
        model(torch.ones(8, 4)).sum().backward()
    elif waits == "all_reduce":
        dist.all_reduce(torch.ones(1))
    elif waits == "barrier":
        dist.barrier()
    else:
        next(iter(torch.utils.data.DataLoader(Never(), num_workers=1)))

for step in range(100000):
    progress.step(step)
    if step == 20:
        if rank == 1:
            time.sleep(1)
            progress.step(step)
            stuck_here()
        wait_here()
    model(torch.ones(8, 4)).sum().backward()
    time.sleep(0.05)
"""
STUCK_CASES = [("sleep", "backward"), ("busy", "all_reduce"), ("read", "barrier"), ("sleep", "dataloader")]


def test_the_stuck_rank_is_named_whatever_the_others_wait_in(cluster, tmp_path):
    """Rank 1 stuck in a sleep, a busy loop or a blocking read; rank 0 waiting
    in DDP's backward, all_reduce, a barrier or a DataLoader. Every report names rank 1 and its node,
    and the requeue decides about that node, never the healthy one. The cases run side by side."""
    from helpers import require

    require("py-spy")
    (tmp_path / "stuck.py").write_text(STUCK)
    waiting = {}
    for stuck, waits in STUCK_CASES:
        (tmp_path / waits).mkdir()
        waiting[(stuck, waits)] = launch_wait(
            tmp_path / waits,
            "--nodes",
            "2",
            "--no-exporter",
            "--hang-timeout",
            "4",
            "--first-progress-timeout",
            "120",
            "--max-restarts",
            "1",
            command=[sys.executable, str(tmp_path / "stuck.py"), stuck, waits],
        )
    try:
        for case, w in waiting.items():
            report = w.job_dir / "hang" / "r0" / "report"
            wait_for(report.exists, 180, poll=0.2, what=f"the hang report of {case}")
            fields = dict(line.split("=", 1) for line in report.read_text().splitlines())
            stuck_node = (w.job_dir / "progress" / "r0" / "task-1").read_text().split()[0]
            healthy = (w.job_dir / "progress" / "r0" / "task-0").read_text().split()[0]
            assert (fields["rank"], fields["node"]) == ("1", stuck_node), (case, fields)
            assert "is in code of its own while 1 rank(s) wait for it" in fields["summary"], (case, fields)
            wait_for(
                lambda: re.search(decided_about(stuck_node), read_logs(w.job_dir)),
                60,
                what=f"the next run's decision about {case}'s stuck node",
            )
            assert not re.search(decided_about(healthy), read_logs(w.job_dir))
    finally:
        for w in waiting.values():
            scancel(cluster, w.job_id)
            w.finish()


def test_a_job_that_failed_at_once_without_metrics_logs_is_reported(cluster, tmp_path):
    """`kit report` / `Job.report()` of a job with no metrics logs (it failed at once, without the exporter) refused
    ("no metrics logs … ran without the exporter", though it ran). It reports what the job directory knows: how it
    ended, its run and goodput, and says it has no metrics (no picture, report.json written)."""
    import kit as kitlib

    proc, job_dir = launch_and_wait(tmp_path, "--no-exporter", command=["bash", "-c", "exit 3"])
    assert proc.returncode != 0, proc.stdout
    assert "run 0 ended failed (exit code 3): rank 0 on node1 failed first, exit code 3\n" in proc.stderr, proc.stderr
    report = kit("report", str(job_dir))
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert re.match(r"job \d+ \(data: no metrics logs: the job ran without the exporter", lines[0]), lines
    assert "ended FAILED: the command failed with exit code 3 (exit code 3)" in report.stdout, report.stdout
    assert any(line.startswith("goodput n/a (the command reports no steps)") for line in lines), report.stdout
    assert "GPUs: unknown (no metrics)" in lines and "metrics span" not in report.stdout, report.stdout
    assert "kit: warning: no picture: no metrics logs" in report.stderr and not (job_dir / "report.png").exists()
    numbers = json.loads((job_dir / "report.json").read_text())
    assert numbers["ended"].startswith("ended FAILED") and numbers["goodput"]["runs"] == 1, numbers
    summary = kitlib.Job.from_dir(job_dir).report(output=tmp_path / "again.png")
    assert summary["ended"] == numbers["ended"] and (tmp_path / "again.json").exists()
