"""Telling kit's hang watchdog that a rank makes progress (no torch, no Lightning).

The launcher gives every rank ``$KIT_PROGRESS_FILE``; any command reports
through it, from any language: touch or rewrite it at each step (its time is
the heartbeat). While a long save runs, write a first line starting with
``checkpoint``: until the next write the watchdog allows the longer
first-progress timeout (a hang inside a save is still caught, later). When a checkpoint is
safely on disk, write its step to ``$KIT_CHECKPOINT_STEP_FILE`` (one rank is
enough): kit stops requeueing a job whose runs stop advancing it.

Each call is one small write of a local file: no collective, no shared state.
"""

from __future__ import annotations

import os

from kit import files


def _write(path: str | None, text: str) -> None:
    if not path:
        return
    try:
        files.write_atomic(path, text)
    except OSError:
        pass  # a full or gone filesystem must not stop the training


def step(n: int) -> None:
    """This rank finished step ``n``."""
    _write(os.environ.get("KIT_PROGRESS_FILE"), f"step {n}\n")


def checkpointing(n: int) -> None:
    """This rank starts saving a checkpoint at step ``n`` (the watchdog allows it longer)."""
    _write(os.environ.get("KIT_PROGRESS_FILE"), f"checkpointing {n}\n")


def checkpoint_saved(n: int) -> None:
    """The checkpoint of step ``n`` is on disk (call it on one rank)."""
    _write(os.environ.get("KIT_CHECKPOINT_STEP_FILE"), f"{n}\n")
