"""One tracker run per job across requeues, and no step logged twice, on the local cluster with
the trackers offline (W&B offline mode, an MLflow file: store, TensorBoard event files).

Two 2-node jobs side by side (the user's driven by a thread), each stopped twice: kit's reference trainer logging to all three through
``--logger`` (stopped first by the time-limit warning: it saves and kit requeues it; then requeued by an
admin after a periodic checkpoint older than the last step it logged), and a user's own plain-PyTorch
trainer using the README's lines (requeued by an admin twice, each time past its last checkpoint)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import check_end, hastened, kit, launch_and_wait, launch_wait, release_requeued, scontrol, wait_for
from tracker_check import mlflow_runs, strictly_increasing, tensorboard_steps, wandb_offline_runs

from kit.jobdir import JobDir

pytestmark = pytest.mark.cluster
TRAIN = [
    sys.executable,
    "-m",
    "kit.train",
    "--max-steps",
    "80",
    "--checkpoint-every",
    "20",
    "--no-snapshots",  # a requeue replays steps from last.ckpt: what the trackers must not log twice (kit's own
    # snapshots leave almost none to replay: tests/test_checkpoints.py)
    "--log-every",
    "5",
    "--step-delay",
    "0.1",
    "--logger",
    "wandb,mlflow,tensorboard",
]
USER = [sys.executable, str(Path(__file__).parent / "user_tracker_script.py")]


def offline_env(tmp: Path) -> dict:
    # An MLflow file store as users name it (MLflow 3 refuses one unless MLFLOW_ALLOW_FILE_STORE: kit sets it).
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": f"file:{tmp / 'mlruns'}"}


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """Both jobs launched at once; the user's job is driven (requeued twice) by a thread while the reference
    trainer's test drives its own: the two run side by side, the user's test checks its end."""
    lightning, user = tmp_path_factory.mktemp("lightning"), tmp_path_factory.mktemp("user")
    out = {
        "lightning": (
            lightning,
            launch_wait(lightning, "--nodes", "2", "--max-restarts", "3", command=TRAIN, env=offline_env(lightning)),
        ),
        "user": (user, launch_wait(user, "--nodes", "2", "--max-restarts", "3", command=USER, env=offline_env(user))),
    }
    driver = Driver(cluster, out["user"][1])
    driver.start()
    out["user driver"] = driver
    yield out
    driver.join(300)


class Driver(threading.Thread):
    """Requeues the user's job by an admin twice, each time past its last checkpoint (its error, if any, is kept
    for the test to raise)."""

    def __init__(self, cluster, w):
        super().__init__(daemon=True)
        self.cluster, self.w, self.error = cluster, w, None

    def run(self):
        try:
            logged_past(self.w, 0, r"user: logged step (\d+)", 15)
            scontrol(self.cluster, "requeue", self.w.job_id)
            release_requeued(self.cluster, self.w.job_id, self.w.job_dir, restarts=1)
            logged_past(self.w, 1, r"user: logged step (\d+)", 35)
            scontrol(self.cluster, "requeue", self.w.job_id)
            release_requeued(self.cluster, self.w.job_id, self.w.job_dir, restarts=2)
        except BaseException as e:  # raised by the test
            self.error = e


def rank0_log(w, run: int) -> str:
    path = w.job_dir / "logs" / f"rank-0.r{run}.log"
    return path.read_text() if path.exists() else ""


def logged_past(w, run: int, pattern: str, step: int):
    """Wait until rank 0 of ``run`` logged a step >= ``step`` (``pattern``'s group 1)."""
    return wait_for(
        lambda: any(int(s) >= step for s in re.findall(pattern, rank0_log(w, run))),
        120,
        what=f"run {run} to reach step {step}",
    )


def check_one_run(w, tmp: Path, wandb_key: str, runs: int, checkpoint_every: int, first: int) -> list[int]:
    """One W&B run id (the job's) in every run's offline files, one MLflow run, one TensorBoard directory;
    in each the steps strictly increasing (none logged twice) from the first step to the last, with no gap
    beyond the checkpoint interval: a run stopped between kit's record of a step and MLflow's or
    TensorBoard's write loses that one; W&B's service exits on Slurm's SIGTERM without writing what it holds
    ("forced shutdown"), so W&B loses up to its last flush (1 s, as kit sets it), and the next run logs again
    what W&B lost after its checkpoint (README, "Experiment trackers"). Returns MLflow's steps."""
    tracker = w.job_dir / JobDir.TRACKER
    wandb_runs = wandb_offline_runs(tracker / "wandb", wandb_key)
    assert len(wandb_runs) == runs and {run_id for run_id, _ in wandb_runs} - {None} == {
        JobDir(w.job_dir).tracker_run_id
    }
    wandb_steps = [s for _, run in wandb_runs for s in run]
    mlflow = mlflow_runs(tmp / "mlruns")
    assert len(mlflow) == 1, mlflow
    run_id, steps = next(iter(mlflow.items()))
    assert (tracker / JobDir.TRACKER_MLFLOW).read_text().startswith('{"run_id": "%s"' % run_id)
    board = tracker / JobDir.TRACKER_TENSORBOARD
    assert not [p for p in board.iterdir() if p.is_dir()]  # one directory: no version_<N> per run
    for logged in (steps, tensorboard_steps(board), wandb_steps):
        assert strictly_increasing(logged) and max(b - a for a, b in zip(logged, logged[1:])) <= checkpoint_every, (
            logged,
            wandb_runs,
        )
        assert logged[0] == first and logged[-1] == steps[-1], (logged, wandb_runs)
    # kit report goes from the job to each dashboard: the W&B run (and its offline parts), the MLflow run, TensorBoard.
    report = kit("report", str(w.job_dir), "-o", str(tmp / "report.png"))
    assert report.returncode == 0, report.stderr
    rid = JobDir(w.job_dir).tracker_run_id
    assert (
        f"tracker: W&B run {rid}; {runs} part(s) offline: wandb sync {tracker / 'wandb'}/offline-run-*" in report.stdout
    )
    assert f"tracker: MLflow run {run_id} at file:{tmp / 'mlruns'}" in report.stdout, report.stdout
    assert f"tracker: TensorBoard: tensorboard --logdir {board}" in report.stdout
    return steps


def test_reference_trainer_keeps_one_run_per_tracker_through_a_warning_and_an_admin_requeue(cluster, jobs):
    tmp, w = jobs["lightning"]
    logged_past(w, 0, r"step=(\d+) loss", 25)
    subprocess.run(
        ["scancel", "--signal=USR1", "--batch", w.job_id], env={**os.environ, **cluster.target.env}, check=True
    )
    # The warning: the trainer saves where it is and stops; kit requeues it (no hold).
    saved = int(
        wait_for(
            lambda: re.search(r"saved last.ckpt at step (\d+)", rank0_log(w, 0)), 60, what="the save on the warning"
        ).group(1)
    )
    with hastened(cluster, w.job_id):
        logged_past(w, 1, r"step=(\d+) loss", (saved // 20 + 1) * 20 + 9)  # past the next periodic checkpoint
    scontrol(cluster, "requeue", w.job_id)
    release_requeued(cluster, w.job_id, w.job_dir, restarts=2)
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["warned", "stopped", "finished"])
    resumed = [
        re.search(r"resuming from \S+ at step (\d+) \(kit: (\d+)\)", rank0_log(w, run)).groups() for run in (1, 2)
    ]
    assert [int(a) for a, b in resumed] == [int(b) for a, b in resumed]  # KIT_RESUME_STEP is the checkpoint's
    assert int(resumed[0][0]) == saved
    steps = check_one_run(w, tmp, "trainer/global_step", runs=3, checkpoint_every=20, first=4)
    # The second requeue resumed from a checkpoint older than the last step logged: those steps were not
    # logged again (the lost run's values stand), and the log goes on past them.
    before_second = [s for s in steps if s < int(resumed[1][0]) + 20]
    assert int(resumed[1][0]) < max(before_second) and steps[-1] == 79


def test_a_users_own_trainer_keeps_one_run_per_tracker_with_the_readme_lines(cluster, jobs):
    tmp, w = jobs["user"]
    driver = jobs["user driver"]
    driver.join(300)
    assert not driver.is_alive()
    if driver.error:
        raise driver.error
    check_end(cluster, w, state="COMPLETED", code=0, finished=True, log=None, ends=["stopped", "stopped", "finished"])
    resumed = [
        re.search(r"user: resuming at step (\d+) \(kit: (\S+)\)", rank0_log(w, run)).groups() for run in (0, 1, 2)
    ]
    assert resumed[0] == ("0", "None") and all(a == b for a, b in resumed[1:]), resumed
    lost = [int(s) for s in re.findall(r"user: logged step (\d+)", rank0_log(w, 1))]
    assert int(resumed[2][0]) < max(lost)  # the last requeue went back past steps already logged
    steps = check_one_run(w, tmp, "_step", runs=3, checkpoint_every=10, first=5)
    assert set(steps) <= set(range(5, 61, 5)) and steps[-1] == 60, steps


def test_the_reference_trainers_tflops_are_measured_and_its_mfu_on_a_cpu_is_na(cluster, jobs):
    """MFU on this machine's CPUs: rank 0's achieved TFLOP/s in kit ps --json and kit report, MFU "n/a" (None),
    never 0 (the H100 case: tests/test_mfu.py, through the NVML test library)."""
    tmp, w = jobs["lightning"]
    assert w.proc.wait(timeout=300) is not None  # the job ended (its own test drove it)
    rows = json.loads(kit("ps", "--json", "--output-dir", str(tmp / "jobs")).stdout)
    row = next(r for r in rows if r["job_dir"] == str(w.job_dir.resolve()))
    assert row["tflops"] > 0 and row["mfu"] is None, row
    report = kit("report", str(w.job_dir), "-o", str(tmp / "report.png"))
    assert re.search(r"model FLOP/s \(rank 0's device\): [0-9.e+-]+ TFLOP/s, MFU n/a \(a CPU", report.stdout), (
        report.stdout
    )


def test_the_reference_trainer_logs_to_mlflow_with_no_store_named(cluster, tmp_path, monkeypatch):
    """`python3 -m kit.train --logger mlflow` as docs/trainer.md gives it, with the `trackers` extra (mlflow-skinny,
    the newest pip picks) and no MLFLOW_TRACKING_URI: it failed at its first log (Lightning's logger fell back to
    ./mlruns, a file store MLflow 3 refuses). The job's store is now in its tracker/ directory (SQLite where MLflow
    can open one, else the file store with MLflow 3's opt-out), every logged step is there, and kit report names it."""
    command = [*TRAIN[: TRAIN.index("--logger")], "--max-steps", "12", "--logger", "mlflow"]
    proc, job_dir = launch_and_wait(tmp_path, command=command, env={"MLFLOW_TRACKING_URI": ""})
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text() for p in (job_dir / "logs").glob("*.log"))
    kept = json.loads((job_dir / JobDir.TRACKER / JobDir.TRACKER_MLFLOW).read_text())
    tracker = job_dir.resolve() / JobDir.TRACKER
    assert kept["tracking_uri"] in (
        f"file:{tracker / JobDir.TRACKER_MLRUNS}",
        f"sqlite:///{tracker / JobDir.TRACKER_MLFLOW_DB}",
    )
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this reader's own opt-out, for a file store
    history = MlflowClient(kept["tracking_uri"]).get_metric_history(kept["run_id"], "loss")
    assert sorted(m.step for m in history) == list(range(4, 12, 5)), history
    report = kit("report", str(job_dir), "-o", str(tmp_path / "report.png"))
    assert f"MLflow run {kept['run_id']} at {kept['tracking_uri']}" in report.stdout, report.stdout
