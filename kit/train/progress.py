"""Telling kit's hang watchdog that a rank makes progress (no torch, no Lightning).

The launcher gives every rank ``$KIT_PROGRESS_FILE``; any command reports
through it, from any language: touch or rewrite it at each step (its time is
the heartbeat). While a long save runs, write a first line starting with
``checkpoint``: until the next write the watchdog allows the longer
first-progress timeout (a hang inside a save is still caught, later). When a checkpoint is
safely on disk, write its step to ``$KIT_CHECKPOINT_STEP_FILE`` (one rank is
enough): kit stops requeueing a job whose runs stop advancing it.

``finished()``, on every rank, declares the work done (the progress file's
first word becomes ``finished``).

Beside the heartbeat each rank appends a few lines to its run's timeline
(``progress/r<run>/timeline-<R>``: "first|save|saved|last TIME STEP"): its first
step, each save's start and end (the next step after the mark), and at exit its
last step. kit.jobdir.goodput cuts the job's time at them.

``step(n, loss=..., samples=...)`` also feeds what the reference trainer's
callback feeds (``$KIT_METRICS_DIR/rank-<R>.json``): kit ps's STEP, LOSS and
SAMPLES/S, the exporter's ``training_*`` metrics and kit report's curves.

Each call is one small write of a local file: no collective, no shared state. The
heartbeat is written at most once a second (more often when ``$KIT_HANG_TIMEOUT`` is
under a minute: its sixtieth): the watchdog reads it no more often, and on a shared
file system every write is metadata work for servers every user shares (a trainer
that reports every batch of 1,000 nodes x 8 ranks would otherwise write tens of
thousands of files a second). A save's mark and ``finished()`` are written at once.
"""

from __future__ import annotations

import atexit
import os
import time

from kit import files, jobdir
from kit.train import mfu, stragglers


def _write(path: str | None, text: str) -> None:
    if not path:
        return
    try:
        files.write_atomic(path, text)
    except OSError:
        pass  # a full or gone filesystem must not stop the training


_BEAT = {"at": None, "kind": None}  # the last progress-file write: when (monotonic), and which kind


def _beat_every() -> float:
    try:
        timeout = float(os.environ.get("KIT_HANG_TIMEOUT", "0"))
    except ValueError:
        timeout = 0.0
    return min(1.0, timeout / 60) if timeout > 0 else 1.0


def _progress(kind: str, text: str) -> None:
    """Write the progress file: a step line no sooner than _beat_every() after the last step
    line (a save's mark or ``finished`` is always written, and a step after either too)."""
    now = time.monotonic()
    if kind == "step" and _BEAT["kind"] == "step" and now - _BEAT["at"] < _beat_every():
        return
    _write(os.environ.get("KIT_PROGRESS_FILE"), text)
    _BEAT["at"], _BEAT["kind"] = now, kind


_TIMELINE: dict = {"first": False, "saving": None, "last": None, "at_exit": False}


def _timeline(event: str, n: int, at: float) -> None:
    """One line of this rank's timeline, appended (a few per run: never per step)."""
    progress_file = os.environ.get("KIT_PROGRESS_FILE")
    if not progress_file:
        return
    name = jobdir.JobDir.TIMELINE.format(rank=os.environ.get("RANK", "0"))
    try:
        fd = os.open(
            os.path.join(os.path.dirname(progress_file), name),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
        )
        try:
            os.write(fd, f"{event} {at:.3f} {n}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a full or gone filesystem must not stop the training


def _stepped(n: int) -> None:
    """The timeline at a step: the run's first, the end of a save marked before it, and the last (kept)."""
    now = time.time()
    if not _TIMELINE["first"]:
        _TIMELINE["first"] = True
        _timeline("first", n, now)
        if not _TIMELINE["at_exit"]:
            atexit.register(_timeline_end)
            _TIMELINE["at_exit"] = True
    if _TIMELINE["saving"] is not None:
        _timeline("saved", _TIMELINE["saving"], now)
        _TIMELINE["saving"] = None
    _TIMELINE["last"] = (now, n)


def _timeline_end() -> None:
    """At exit (and at ``finished()``): a save still marked is over; the last step's time."""
    now = time.time()
    if _TIMELINE["saving"] is not None:
        _timeline("saved", _TIMELINE["saving"], now)
        _TIMELINE["saving"] = None
    if _TIMELINE["last"] is not None:
        _timeline("last", _TIMELINE["last"][1], _TIMELINE["last"][0])
        _TIMELINE["last"] = None


_METRICS = {"samples_total": 0.0, "written_at": 0.0, "written_samples": 0.0}
METRICS_INTERVAL = 1.0  # seconds between two writes of the rank's metrics file


def step(
    n: int,
    *,
    loss: float | None = None,
    samples: int | None = None,
    max_steps: int | None = None,
    flops: float | None = None,
    precision: str | None = None,
    device: object = None,
) -> None:
    """This rank finished step ``n``: the heartbeat of kit's hang watchdog, and — with
    ``loss`` (this step's), ``samples`` (this step's, on this rank) or ``max_steps`` —
    the training metrics kit ps, the exporter and kit report show, as for the reference
    trainer; ``flops`` (this step's on this rank's device) and ``precision`` (``bf16``,
    ``bf16-mixed``, ``fp32``, …) give its TFLOP/s and MFU (:mod:`kit.train.mfu`) on ``device``
    (torch's device or ``"cuda:1"``, ``"cpu"``; by default torch's current CUDA device, where CUDA is).
    Cheap: the metrics file is rewritten at most once a second."""
    _stepped(n)
    _progress("step", f"step {n}\n")
    directory = os.environ.get("KIT_METRICS_DIR")
    if not directory or (loss is None and samples is None and max_steps is None and flops is None):
        return
    if flops is not None:
        if "throughput" not in _METRICS:
            _METRICS["throughput"] = mfu.Throughput(precision=precision, gpu_name=mfu.device_name(device))
        _METRICS["throughput"].step(flops)
    now = time.time()
    if samples is not None:
        _METRICS["samples_total"] += samples
    values: dict = {"step": n, "last_step_timestamp_seconds": now}
    if loss is not None:
        values["loss"] = float(loss)
    if samples is not None:
        values["samples_total"] = _METRICS["samples_total"]
    if max_steps is not None:
        values["max_steps"] = max_steps
    values.update(_METRICS.get("rates", {}))
    if not _METRICS.get("at_exit"):
        atexit.register(_write_pending)
        _METRICS["at_exit"] = True
    _METRICS["pending"] = (directory, values)
    if now - _METRICS["written_at"] < METRICS_INTERVAL:
        return
    if samples is not None and _METRICS["written_at"]:
        values["samples_per_second"] = (_METRICS["samples_total"] - _METRICS["written_samples"]) / (
            now - _METRICS["written_at"]
        )
    if "throughput" in _METRICS:  # this rank's TFLOP/s since the last write (and MFU), kept until the next
        seconds = now - _METRICS["written_at"] if _METRICS["written_at"] else 0.0
        _METRICS["rates"] = _METRICS["throughput"].values(seconds) or _METRICS.get("rates", {})
        values.update(_METRICS["rates"])
    values.update(stragglers.values())  # this rank's waits at the all-reduce, where kit.train.stragglers watches
    try:
        jobdir.write_rank_metrics(directory, int(os.environ.get("RANK", "0")), values)
    except (OSError, ValueError):
        return  # a full disk must not stop the training
    _METRICS["written_at"], _METRICS["written_samples"] = now, _METRICS["samples_total"]
    _METRICS["pending"] = None


def _write_pending() -> None:
    """At exit: the last step's values (a rank's final numbers are not lost to the once-a-second limit)."""
    pending = _METRICS.get("pending")
    _METRICS["pending"] = None
    if pending:
        try:
            jobdir.write_rank_metrics(pending[0], int(os.environ.get("RANK", "0")), pending[1])
        except (OSError, ValueError):
            pass


def resumed_step() -> int | None:
    """The checkpoint step this run resumed from (``$KIT_RESUME_STEP``, prelaunch's: the step in
    ``$KIT_CHECKPOINT_STEP_FILE`` when the run began); None for a first run or a command that reports
    no checkpoint step. A tracker's steps past it were logged by a lost run (kit.train.trackers.new_step)."""
    try:
        step = int(os.environ.get("KIT_RESUME_STEP", "-1"))
    except ValueError:
        return None
    return step if step >= 0 else None


def checkpointing(n: int) -> None:
    """This rank starts saving a checkpoint at step ``n`` (the watchdog allows it longer); its next step (or
    ``finished()``, or its exit) ends the save."""
    if _TIMELINE["saving"] is None:
        _timeline("save", n, time.time())
        _TIMELINE["saving"] = n
    _progress("checkpointing", f"checkpointing {n}\n")


def checkpoint_saved(n: int) -> None:
    """The checkpoint of step ``n`` is on disk (call it on one rank)."""
    _write(os.environ.get("KIT_CHECKPOINT_STEP_FILE"), f"{n}\n")


def finished() -> None:
    """This rank's work is done (call it on every rank, after the last save and before
    tearing down). Once every rank has said so, the run's work is finished whatever
    happens after: a rank that then dies in its teardown (torch's process-group
    destructors abort now and then) does not make the job FAILED, nor is the job requeued;
    and the hang watchdog no longer waits for progress from this rank."""
    _write_pending()
    _timeline_end()
    _progress("finished", "finished\n")
