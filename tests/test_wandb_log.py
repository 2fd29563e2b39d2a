"""kit.train.wandb_log on W&B's own files (offline mode, no cluster): after a stop like Slurm's (SIGTERM to
every process of the run at once, W&B's service included) the step it reads is the last one W&B kept, the
same as a reading of the whole file from its start; kit.train.trackers.new_step(step, "wandb") takes W&B's
steps from there, not from kit's record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tracker_check import wandb_offline_runs

from kit.train import trackers, wandb_log

pytest.importorskip("wandb")  # the trackers extra: .ci/setup installs it

RUN = """
import sys, time, wandb
run = wandb.init(project="kit", mode="offline", id="job-1", dir=sys.argv[1])
for step in range(int(sys.argv[2])):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
    time.sleep(float(sys.argv[3]))
print("kept", flush=True)
time.sleep(3)  # past W&B's flush
for step in range(int(sys.argv[2]), int(sys.argv[2]) + 5):
    run.log({"loss": 1.0 / (step + 1)}, step=step)
print("stop me", flush=True)
time.sleep(100)
"""


def stopped_run(root: Path, steps: int, pause: float, flush: str | None) -> Path:
    """An offline W&B run logging ``steps`` steps, then (3 s later) 5 more at once, then stopped as Slurm stops a
    step: SIGTERM to every process of it at the same time (its process group: the script and wandb-core).
    ``flush``: W&B's transaction log flush interval (None: W&B's default)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL"}
    env["WANDB_SILENT"] = "true"
    if flush:
        env["WANDB__TRANSACTION_LOG_FLUSH_INTERVAL"] = flush
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(root), str(steps), str(pause)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        for line in proc.stdout:
            if line.startswith("stop me"):
                break
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    subprocess.run(["pkill", "-KILL", "-f", f"wandb-core.*--pid {proc.pid}"], check=False)
    return root / "wandb"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run stopped with kit's flush interval (1 s) and with W&B's default (15 s)."""
    kit_flush = stopped_run(tmp_path_factory.mktemp("kit"), 40, 0.05, "1")
    default = stopped_run(tmp_path_factory.mktemp("default"), 40, 0.05, None)
    return kit_flush, default


def kept(wandb_dir: Path) -> int:
    """The highest step in the run's files, read whole from their start (tests/tracker_check.py)."""
    return max((s for _, steps in wandb_offline_runs(wandb_dir, "_step") for s in steps), default=-1)


def test_a_hard_stop_costs_w_and_b_its_last_second_with_kits_flush_interval(runs):
    kit_flush, default = runs
    held, lost = wandb_log.held_step(kit_flush, "job-1"), wandb_log.held_step(default, "job-1")
    assert held == kept(kit_flush) and lost == kept(default)
    # Steps 0..39 were logged 3 s before the stop, 40..44 at it; W&B writes a step's row once the next step
    # comes (step 39's at the stop), so 38 is the last it could have written a second before.
    assert 38 <= held <= 44, held
    assert lost < 38, lost  # W&B's own 15 s: the stop cost it the run (as in tests/test_trackers.py before)


def test_the_last_step_is_read_from_the_end_and_a_torn_end_is_left_out(tmp_path):
    """A run of many blocks: the step read from the file's end is the whole reading's; cut anywhere (a torn
    chunk, a record cut between blocks) it is a step the cut file holds whole — never past it."""
    run = tmp_path / "w"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN.replace('print("kept"', 'run.finish(); print("kept"').replace("time.sleep(3)", "sys.exit(0)"),
            str(run),
            "3000",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    assert proc.returncode == 0, proc.stderr
    [path] = (run / "wandb").glob("offline-run-*/run-job-1.wandb")
    data = path.read_bytes()
    assert len(data) > 8 * wandb_log.BLOCK and wandb_log.last_step(path) == kept(run / "wandb") == 2999
    at_blocks = {}
    for cut in range(wandb_log.BLOCK, len(data), wandb_log.BLOCK):
        path.write_bytes(data[:cut])
        at_blocks[cut] = wandb_log.last_step(path)
        assert at_blocks[cut] == kept(run / "wandb"), cut
    for cut in (wandb_log.BLOCK * 3 + 5, wandb_log.BLOCK * 3 + 100, wandb_log.BLOCK * 5 - 3):
        path.write_bytes(data[:cut])
        below, above = cut // wandb_log.BLOCK * wandb_log.BLOCK, (cut // wandb_log.BLOCK + 1) * wandb_log.BLOCK
        assert at_blocks[below] <= wandb_log.last_step(path) <= at_blocks[above], cut
    path.write_bytes(data[:7])
    assert wandb_log.last_step(path) == -1  # a run W&B kept nothing of
    path.write_bytes(b"not W&B's")
    assert wandb_log.last_step(path) is None and wandb_log.held_step(run / "wandb", "job-1") is None
    assert wandb_log.held_step(run / "wandb", "another") is None  # no part of that run: W&B's files cannot tell


def test_new_step_takes_w_and_b_steps_from_w_and_b_and_the_others_from_kits_record(runs, tmp_path, monkeypatch):
    """kit recorded step 44 as logged to every tracker, but W&B kept less (the stop): the next run logs to W&B
    again the steps after what W&B has, and to MLflow none up to 44."""
    kit_flush, _ = runs
    monkeypatch.setenv("KIT_TRACKER_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_DIR", str(kit_flush.parent))
    monkeypatch.setenv("WANDB_RUN_ID", "job-1")
    monkeypatch.setattr(trackers, "_STATE", {})
    for tracker in ("wandb", "mlflow"):
        (tmp_path / f"logged_step.{tracker}").write_text("44\n")
    held = wandb_log.held_step(kit_flush, "job-1")
    assert [s for s in range(30, 50) if trackers.new_step(s, "wandb")] == list(range(held + 1, 50))
    assert [s for s in range(30, 50) if trackers.new_step(s, "mlflow")] == list(range(45, 50))
    monkeypatch.setenv("WANDB_RUN_ID", "another")  # no W&B files of the run: kit's record
    monkeypatch.setattr(trackers, "_STATE", {})
    (tmp_path / "logged_step.wandb").write_text("44\n")
    assert [s for s in range(30, 50) if trackers.new_step(s, "wandb")] == [45, 46, 47, 48, 49]


def test_a_step_w_and_b_could_not_hold_is_no_step_and_a_held_step_is_never_silent(tmp_path, monkeypatch, capsys):
    """A history record whose step is Infinity, NaN, 1e300 or a fraction (a job's code wrote it) is no step
    (it raised OverflowError in the tracker gate); a whole step is. A step the gate holds back because
    earlier runs logged it is said once on stderr, never silently dropped."""
    from wandb.proto import wandb_internal_pb2

    def history(value: str) -> bytes:
        record = wandb_internal_pb2.Record()
        item = record.history.item.add()
        item.key, item.value_json = "_step", value
        return record.SerializeToString()

    assert [wandb_log.step_of(history(v)) for v in ("Infinity", "-Infinity", "NaN", "1e300", "2.5", "-3")] == [None] * 6
    assert wandb_log.step_of(history("12")) == 12 and wandb_log.step_of(history("12.0")) == 12
    monkeypatch.setattr(trackers, "_STATE", {})
    monkeypatch.setattr(trackers, "held_step", lambda tracker: 10**15)
    assert [trackers.new_step(s, "wandb") for s in (1, 2)] == [False, False]
    err = capsys.readouterr().err
    assert err.count("kit.train: step 1 and later steps up to 1000000000000000 are not logged to wandb") == 1, err
