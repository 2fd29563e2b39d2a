"""What W&B holds of a run, read from its transaction logs: the last step W&B has, so a requeued run logs
again what W&B lost and never a step it has (:func:`kit.train.trackers.new_step`).

Every part of a W&B run (one per kit run: ``WANDB_DIR/wandb/offline-run-<time>-<id>/`` offline,
``run-<time>-<id>/`` online) has a transaction log ``run-<id>.wandb``: a 7-byte header (``:W&B``, a version)
and then LevelDB-log framed records in 32 KiB blocks — each chunk a CRC (4 bytes), a length (2), a type
(1 whole, 2 first, 3 middle, 4 last) — each record a ``wandb_internal_pb2.Record``. W&B's service writes it
through a buffer it flushes every ``x_transaction_log_flush_interval`` seconds (15 by default; kit sets 1,
``WANDB__TRANSACTION_LOG_FLUSH_INTERVAL``) and exits on Slurm's SIGTERM without writing the rest
(wandb/wandb#9963): after a hard stop the file holds the run up to its last flush, and a torn chunk at
its end is left out here.

Read from the end backwards, a span of blocks at a time (doubling), so a long run's file is not read whole.
"""

from __future__ import annotations

import glob
import struct
from pathlib import Path
from typing import Iterator

BLOCK = 32768
HEADER = 7  # ":W&B", then 3 bytes of version, inside the first block
CHUNK = struct.Struct("<IHB")  # CRC, length, type
MAX_READ = 64 << 20  # past this many bytes with no step in them, W&B's files say nothing (None)
STEP_KEYS = ("trainer/global_step", "_step")  # Lightning's step; else W&B's own (a plain log(..., step=))


def chunks(data: bytes, base: int) -> Iterator[bytes]:
    """The whole records of ``data`` (read from file offset ``base``, a block boundary) whose first chunk is
    in it: a record continued from before ``base`` and a torn one at the end are left out."""
    pos, partial = (HEADER if base == 0 else 0), None
    while pos + CHUNK.size <= len(data):
        left = BLOCK - (base + pos) % BLOCK
        if left < CHUNK.size:  # a block's tail too short for a chunk: padding
            pos += left
            continue
        _, length, kind = CHUNK.unpack_from(data, pos)
        end = pos + CHUNK.size + length
        if kind == 0 or end > len(data):  # zeros (preallocated, or padding) or a torn chunk: nothing further
            break
        payload, pos = data[pos + CHUNK.size : end], end
        if kind == 1:
            yield payload
        elif kind == 2:
            partial = payload
        elif kind == 3 and partial is not None:
            partial += payload
        elif kind == 4 and partial is not None:
            yield partial + payload
            partial = None


def step_of(payload: bytes) -> int | None:
    """The step of a history record (its ``trainer/global_step``, else ``_step``); None for any other record."""
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()
    try:
        record.ParseFromString(payload)
    except Exception:  # a damaged record: not a step W&B has
        return None
    if record.WhichOneof("record_type") != "history":
        return None
    items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
    for key in STEP_KEYS:
        try:
            value = float(items[key])
        except (KeyError, ValueError):
            continue
        # A step is a whole number W&B can hold (int64): Infinity, NaN or 1e300 is no step of a run.
        if value.is_integer() and 0 <= value < 2**63:
            return int(value)
    return None


def last_step(path: Path) -> int | None:
    """The highest step in one transaction log: -1 where it has none (a run lost whole), None where it is not
    one or has none in its last :data:`MAX_READ` bytes."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b":W&B":
                return None
            size = f.seek(0, 2)
            span = BLOCK
            while True:
                base = max(0, (size - span) // BLOCK * BLOCK)
                f.seek(base)
                steps = [s for p in chunks(f.read(size - base), base) if (s := step_of(p)) is not None]
                if steps:
                    return max(steps)
                if base == 0:
                    return -1
                if span >= MAX_READ:
                    return None
                span *= 2
    except OSError:
        return None


def held_step(wandb_dir: Path, run_id: str) -> int | None:
    """The highest step W&B holds of run ``run_id`` over all its parts under ``wandb_dir`` (W&B's ``wandb/``
    in ``WANDB_DIR``): -1 where the parts hold none; None where there is no part to read (then W&B's files
    cannot tell, and kit's own record stands)."""
    parts = sorted(
        Path(p)
        for p in glob.glob(f"{glob.escape(str(wandb_dir))}/*-{glob.escape(run_id)}/run-{glob.escape(run_id)}.wandb")
    )
    steps = [last_step(p) for p in parts]
    if not run_id or not parts or None in steps:
        return None
    return max(steps)
