"""One experiment-tracker run per kit job, across its runs and requeues; no step logged twice.

The batch script gives every rank of every run the job's identity (prelaunch's kit::tracker_env):

- ``WANDB_RUN_ID`` and ``WANDB_NAME``: the job directory's name (an array task's ``NAME-t<index>``),
  ``WANDB_RESUME=allow``, ``WANDB_DIR`` the job's ``tracker/`` — so ``wandb.init()`` opens the job's
  one run in every run and requeue (``kit rerun`` makes a new job, so a new run);
- ``MLFLOW_RUN_ID`` once the job's first run made its MLflow run (:func:`remember_mlflow_run`):
  ``mlflow.start_run()`` resumes it;
- ``KIT_TRACKER_DIR`` (TensorBoard's one log directory is its ``tensorboard/``) and
  ``KIT_RESUME_STEP``: the checkpoint step this run resumes from (-1: none).

A value the job's environment already has (``--env``, or the shell ``kit launch`` ran in) is kept.

A requeued run resumes from its last checkpoint, which may be older than the last step the lost
run logged. :func:`new_step` (rank 0) is true once per step for the whole job, so the steps a tracker
sees stay strictly increasing and none is logged twice: the lost run's values stand for the steps the
tracker has, the new run's follow. What a tracker has: for W&B, what its own files hold
(:mod:`kit.train.wandb_log`: its service loses its last second on a hard stop, and the new run logs
those steps again where they come after the checkpoint); for the others, the highest step logged, which
kit keeps in the job directory (MLflow writes at each call; TensorBoard at each flush). The Lightning
loggers of :func:`lightning_logger` do this by themselves.

No torch or Lightning import until a Lightning logger is asked for.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kit import files
from kit.jobdir import JobDir
from kit.train import progress, wandb_log

resumed_step = progress.resumed_step  # the checkpoint step this run resumed from (None: none)

KINDS = ("wandb", "mlflow", "tensorboard")


def tracker_dir() -> Path | None:
    """The job's tracker directory (``$KIT_TRACKER_DIR``), None outside a kit job."""
    path = os.environ.get("KIT_TRACKER_DIR")
    return Path(path) if path else None


def logged_step(tracker: str = "all") -> int:
    """The highest step the job's runs logged so far to ``tracker`` (-1: none)."""
    d = tracker_dir()
    try:
        recorded = int(files.read_text(d / JobDir.TRACKER_STEP.format(tracker=tracker), 64).strip()) if d else -1
    except (OSError, ValueError):
        recorded = -1
    return max(recorded, _STATE.get(tracker, {}).get("high", -1))


# Per tracker: the highest step the job's earlier runs logged (read once, at this process's first step),
# and this process's own highest.
_STATE: dict[str, dict] = {}


def held_step(tracker: str) -> int:
    """The highest step ``tracker`` has of the job's earlier runs: W&B's from its own files when they are
    there (``WANDB_DIR``, ``WANDB_RUN_ID``), else kit's record (:func:`logged_step`)."""
    if tracker == "wandb":
        root = os.environ.get("WANDB_DIR") or tracker_dir()
        held = wandb_log.held_step(Path(root) / "wandb", os.environ.get("WANDB_RUN_ID", "")) if root else None
        if held is not None:
            return held
    return logged_step(tracker)


def new_step(step: int, tracker: str = "all") -> bool:
    """False for a step ``tracker`` already has of the job's earlier runs (a requeued run replaying from
    its checkpoint; :func:`held_step`), else True, recording it first (rank 0, the one that logs): a run
    stopped between the record and the log loses that step (a gap of one log interval) rather than log
    it twice. One run may log a step more than once (Lightning logs a step's epoch metrics apart).
    ``tracker``: ``"wandb"``, ``"mlflow"``, ``"tensorboard"``, or any name for one a script logs to apart
    ("all": one record for all; W&B's steps then come from kit's record, not W&B's files)."""
    if tracker not in _STATE:
        _STATE[tracker] = {"before": held_step(tracker), "high": -1}
    state = _STATE[tracker]
    if step <= state["before"]:
        if not state.get("said"):  # never silently: a held step far ahead would stop every log of this run
            state["said"] = True
            print(
                f"kit.train: step {step} and later steps up to {state['before']} are not logged to {tracker}: "
                "the job's earlier runs logged them (a requeue replaying from its checkpoint)",
                file=sys.stderr,
            )
        return False
    if step > state["high"]:
        state["high"] = step
        d = tracker_dir()
        if d is not None:
            try:
                files.write_atomic(d / JobDir.TRACKER_STEP.format(tracker=tracker), f"{step}\n")
            except OSError:
                pass  # the log still goes to the tracker; a later run may then repeat a step
    return True


def remember_mlflow_run(run_id: str, tracking_uri: str | None = None) -> None:
    """Keep the MLflow run the job's first run made (later runs get ``MLFLOW_RUN_ID``)."""
    d = tracker_dir()
    if d is None or (d / JobDir.TRACKER_MLFLOW).exists():
        return
    # One line, run_id first: prelaunch reads it with a pattern (tests/test_bash_rules.py pins the pair).
    files.write_atomic(d / JobDir.TRACKER_MLFLOW, json.dumps({"run_id": run_id, "tracking_uri": tracking_uri}) + "\n")


def mlflow_tracking_uri() -> str:
    """The MLflow store: ``$MLFLOW_TRACKING_URI``, else the job's own in tracker/ — SQLite, MLflow 3's default, where
    MLflow can open one (full ``mlflow``: SQLAlchemy); else (``mlflow-skinny``, what the ``trackers`` extra installs:
    no SQLite store) a file store, with MLflow 3's opt-out for it set. (Lightning's logger fell back to ``./mlruns``,
    a file store MLflow 3 refuses: the job failed at its first log.)"""
    named = os.environ.get("MLFLOW_TRACKING_URI")
    if named:
        return named
    d = tracker_dir() or Path.cwd()
    if importlib.util.find_spec("sqlalchemy") and importlib.util.find_spec("alembic"):
        return f"sqlite:///{d / JobDir.TRACKER_MLFLOW_DB}"
    if not os.environ.get("MLFLOW_ALLOW_FILE_STORE"):  # an empty value MLflow refuses too
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    return f"file:{d / JobDir.TRACKER_MLRUNS}"


def mlflow_start_run(**kwargs: Any):
    """``mlflow.start_run()`` as the job's one MLflow run: the first run makes it and kit keeps its id,
    later runs resume it (``MLFLOW_RUN_ID``)."""
    import mlflow

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(mlflow_tracking_uri())
    run = mlflow.start_run(**kwargs)
    remember_mlflow_run(run.info.run_id, mlflow.get_tracking_uri())
    return run


def tensorboard_dir() -> Path:
    """TensorBoard's one log directory for the job (``$KIT_TRACKER_DIR/tensorboard``; outside a kit job
    ``./tensorboard``): every run writes its event files there."""
    return (tracker_dir() or Path.cwd()) / JobDir.TRACKER_TENSORBOARD


def lightning_logger(kind: str, **kwargs: Any):
    """A Lightning logger (``wandb``, ``mlflow`` or ``tensorboard``) that is the job's one run and
    never logs a step twice; ``kwargs`` go to Lightning's logger (``project=``, ``experiment_name=``,
    ``tracking_uri=``, …)."""
    if kind not in KINDS:
        raise ValueError(f"unknown logger {kind!r}: one of {', '.join(KINDS)}")
    d = tracker_dir() or Path.cwd()
    if kind == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        kwargs.setdefault("save_dir", str(d))
        inner = WandbLogger(**kwargs)  # id, resume and name come from kit's WANDB_* variables
    elif kind == "mlflow":
        from lightning.pytorch.loggers import MLFlowLogger

        kwargs.setdefault("run_id", os.environ.get("MLFLOW_RUN_ID") or None)
        kwargs.setdefault("tracking_uri", mlflow_tracking_uri())
        inner = MLFlowLogger(**kwargs)
    else:
        from lightning.pytorch.loggers import TensorBoardLogger

        kwargs.setdefault("save_dir", str(d))
        kwargs.setdefault("name", JobDir.TRACKER_TENSORBOARD)  # d/tensorboard: tensorboard_dir()
        kwargs.setdefault("version", "")  # one directory for the job, not version_<N> per run
        inner = TensorBoardLogger(**kwargs)
    return _once_only(inner, kind)


def _once_only(inner, kind: str):
    from lightning.pytorch.loggers.logger import Logger
    from lightning.pytorch.utilities import rank_zero_only

    class OnceOnly(Logger):
        """``inner``, with every step logged once per job (:func:`new_step`)."""

        def __init__(self):
            super().__init__()
            self.inner, self.kind = inner, kind

        name = property(lambda self: self.inner.name)
        version = property(lambda self: self.inner.version)
        save_dir = property(lambda self: self.inner.save_dir)
        log_dir = property(lambda self: getattr(self.inner, "log_dir", None))
        experiment = property(lambda self: self.inner.experiment)

        @rank_zero_only
        def log_metrics(self, metrics, step=None):
            if step is None or new_step(int(step), self.kind):
                self.inner.log_metrics(metrics, step)
            if self.kind == "mlflow":
                remember_mlflow_run(self.inner.run_id, getattr(self.inner, "_tracking_uri", None))

        @rank_zero_only
        def log_hyperparams(self, params, *args, **kwargs):
            self.inner.log_hyperparams(params, *args, **kwargs)

        def save(self):
            self.inner.save()

        def finalize(self, status):
            with _signals_deferred():
                self.inner.finalize(status)

        def after_save_checkpoint(self, checkpoint_callback):
            self.inner.after_save_checkpoint(checkpoint_callback)

    return OnceOnly()


@contextlib.contextmanager
def _signals_deferred():
    """The stop signals' Python handlers held back while inside, then run: MLflow's file store rewrites a run's
    meta.yaml in place (truncated, then written), and Lightning's SIGTERM handler (which talks to the other ranks)
    run in between left it empty — the job's next run could not resume its tracker run (CI: a requeue during the
    first one's finalize). The main thread only (where Python runs handlers and may set them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    kept = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)
        for signum in held:
            signal.raise_signal(signum)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
