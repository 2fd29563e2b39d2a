"""kit.train.progress on its own (no cluster): what each call writes, and how often the
heartbeat reaches the file system."""

from __future__ import annotations

import importlib

import pytest


@pytest.fixture
def progress(tmp_path, monkeypatch):
    """A fresh kit.train.progress writing into tmp_path, with its writes counted."""
    from kit import files
    from kit.train import progress as module

    module = importlib.reload(module)
    writes = []
    real = files.write_atomic

    def counted(path, text, *args, **kwargs):
        writes.append((str(path), text))
        return real(path, text, *args, **kwargs)

    monkeypatch.setattr(files, "write_atomic", counted)
    monkeypatch.setenv("KIT_PROGRESS_FILE", str(tmp_path / "rank-0"))
    monkeypatch.delenv("KIT_METRICS_DIR", raising=False)
    monkeypatch.delenv("KIT_HANG_TIMEOUT", raising=False)
    module.writes = writes
    return module


def test_the_heartbeat_is_written_at_most_once_a_second(progress, tmp_path, monkeypatch):
    """1,000 steps in a burst: one write, not 1,000 (on a shared file system each is a create
    and a rename). After the interval the next step is written again."""
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    for n in range(1000):
        progress.step(n)
    assert progress.writes == [(str(tmp_path / "rank-0"), "step 0\n")]
    clock[0] += 1.0
    progress.step(1000)
    assert progress.writes[-1][1] == "step 1000\n" and len(progress.writes) == 2


def test_a_save_mark_and_finished_are_written_at_once_and_the_step_after_a_save_too(progress, tmp_path, monkeypatch):
    """The watchdog reads a save's mark and `finished` from the file's first line: never
    held back; nor the step that ends the save (until it is written the save looks ongoing)."""
    monkeypatch.setattr(progress.time, "monotonic", lambda: 5.0)
    progress.step(1)
    progress.checkpointing(1)
    progress.step(2)
    progress.step(3)  # within the interval of step 2's write: held back
    progress.finished()
    assert [text for _, text in progress.writes] == ["step 1\n", "checkpointing 1\n", "step 2\n", "finished\n"]
    assert (tmp_path / "rank-0").read_text() == "finished\n"


@pytest.mark.parametrize("timeout, every", [("30", 0.5), ("900", 1.0), ("0", 1.0), ("nonsense", 1.0)])
def test_a_short_hang_timeout_gets_a_finer_heartbeat(progress, monkeypatch, timeout, every):
    """The heartbeat's interval is at most a sixtieth of --hang-timeout (the watchdog's own poll)."""
    monkeypatch.setenv("KIT_HANG_TIMEOUT", timeout)
    assert progress._beat_every() == every


def test_new_step_is_true_once_per_step_for_the_whole_job_per_tracker(tmp_path, monkeypatch):
    """kit.train.trackers.new_step: a requeued run (a new process) replaying from an older checkpoint is told
    not to log the steps the job's earlier runs logged; within one run a step may repeat; each tracker keeps
    its own record; outside a kit job (no $KIT_TRACKER_DIR) the process's own record serves."""
    from kit.train import trackers

    monkeypatch.setenv("KIT_TRACKER_DIR", str(tmp_path))
    monkeypatch.setattr(trackers, "_STATE", {})
    assert [s for s in range(5, 30, 5) if trackers.new_step(s)] == [5, 10, 15, 20, 25]
    assert trackers.new_step(25)  # the same run logs step 25's epoch metrics apart
    monkeypatch.setattr(trackers, "_STATE", {})  # the next run: a new process
    assert [s for s in range(20, 45, 5) if trackers.new_step(s)] == [30, 35, 40]
    assert trackers.logged_step() == 40 and trackers.logged_step("mlflow") == -1
    assert trackers.new_step(20, "mlflow")  # another tracker's record is its own
    monkeypatch.delenv("KIT_TRACKER_DIR")
    monkeypatch.setattr(trackers, "_STATE", {})
    assert trackers.new_step(3) and trackers.logged_step() == 3


def test_resumed_step_is_the_checkpoint_step_prelaunch_passed_or_none(monkeypatch):
    """progress.resumed_step: $KIT_RESUME_STEP (the checkpoint step the run began from), None for -1 (no
    checkpoint), a damaged value or outside a kit job."""
    from kit.train import progress, trackers

    monkeypatch.delenv("KIT_RESUME_STEP", raising=False)
    seen = [progress.resumed_step()]
    for value in ("-1", "40", "x", "0"):
        monkeypatch.setenv("KIT_RESUME_STEP", value)
        seen.append(progress.resumed_step())
    # trackers says the same (compared by value: another test here reloads kit.train.progress)
    assert seen == [None, None, 40, None, 0] and trackers.resumed_step() == 0
