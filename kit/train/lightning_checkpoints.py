"""The reference trainer's checkpoints: kit's every-step snapshots in Lightning (:mod:`kit.train.checkpoint`), or
today's ``last.ckpt`` with ``--no-snapshots``; the arguments that choose."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from kit.train import trackers


def log(msg: str) -> None:
    print(f"kit.train[rank {os.environ.get('RANK', '0')}]: {msg}", flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint-every",
        type=parse_every,
        default="auto",
        metavar="auto|N|Ns",
        help="Persist the every-step snapshots to the node's disk and the next node every N steps, or N seconds, "
        "or as often as the measured costs and the time between failures make best (auto); 0: no checkpoints. "
        "With --no-snapshots: save last.ckpt every N steps (auto: 50).",
    )
    p.add_argument(
        "--no-snapshots",
        dest="snapshots",
        action="store_false",
        help="Today's checkpoints instead of kit's: Lightning's last.ckpt, saved synchronously in the job directory.",
    )
    p.add_argument(
        "--checkpoint-memory",
        default=None,
        metavar="DIR",
        help="Where each node holds the every-step snapshots [default: /dev/shm].",
    )
    p.add_argument(
        "--checkpoint-local",
        default=None,
        metavar="DIR",
        help="Each node's own disk for its persisted snapshots and its peer's copies [default: $TMPDIR, else /var/tmp].",
    )
    p.add_argument(
        "--mtbf",
        type=float,
        default=None,
        metavar="SECONDS",
        help="The time between failures --checkpoint-every auto assumes until the job has seen its own "
        "[default: 86400].",
    )


def parse_every(text: str) -> str:
    if text == "auto" or re.fullmatch(r"\d{1,9}s?", text):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, N (steps) or Ns (seconds), got {text!r}")


def full_state(trainer) -> dict:
    """What Lightning's own checkpoint holds (model, optimizers, loops, callbacks), as a dictionary."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


class Snapshots(Callback):
    """A snapshot of every step (kit.train.checkpoint), its copy waited for before the next optimizer step."""

    def __init__(self, store):
        self.store = store

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        def state():
            trainer.kit_snapshot = True  # the callbacks' on_save_checkpoint see a snapshot, not a save
            try:
                return full_state(trainer)
            finally:
                trainer.kit_snapshot = False

        self.store.save(state, trainer.global_step)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.store.copied()


def restore_io(state: dict):
    """Lightning's checkpoint reader, answering ``kit://restore`` with the state kit loaded."""
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class RestoreIO(TorchCheckpointIO):
        def load_checkpoint(self, path, map_location=None, weights_only=None):
            return state if str(path) == RESTORE else super().load_checkpoint(path, map_location, weights_only)

    return RestoreIO()


RESTORE = "kit://restore"


def store_for(args):
    """kit's checkpoints for this rank (None with --no-snapshots or --checkpoint-every 0)."""
    if not args.snapshots or args.checkpoint_every == "0":
        return None
    os.environ["KIT_CHECKPOINT_EVERY"] = args.checkpoint_every  # the keeper's
    for name, value in (
        ("KIT_MTBF", args.mtbf),
        ("KIT_CKPT_MEMORY", args.checkpoint_memory),
        ("KIT_CKPT_LOCAL", args.checkpoint_local),
    ):
        if value:
            os.environ[name] = str(value)  # the keeper's too
    from kit.train import checkpoint

    return checkpoint.store()


def resume(store, last: Path, plugins: list) -> str | None:
    """What ``fit`` resumes from: kit's restored state (its reader added to ``plugins``), else last.ckpt."""
    if store is not None:
        state, step = store.load()
        if state is None:
            return None
        plugins.append(restore_io(state))
        log(f"resuming at step {step} (kit: {trackers.resumed_step()})")
        return RESTORE
    if not last.exists():
        return None
    step = torch.load(last, map_location="cpu", weights_only=False).get("global_step", "?")
    log(f"resuming from {last} at step {step} (kit: {trackers.resumed_step()})")
    return str(last)
