"""Reading back what the trackers wrote, offline: W&B's offline run files (LevelDB-log framed protobuf
records, read here without W&B's service), an MLflow file store's metrics, TensorBoard's event files."""

from __future__ import annotations

import struct
from pathlib import Path

BLOCK = 32768  # LevelDB log blocks; a .wandb file's first starts after its 7-byte ":W&B" header


def _wandb_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    out, partial, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # padding to the block's end
            pos += left
            continue
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(payload)
        elif kind == 2:
            partial = payload
        elif kind == 3:
            partial += payload
        elif kind == 4:
            out.append(partial + payload)
    return out


def wandb_offline_runs(wandb_dir: Path, key: str) -> list[tuple[str, list[int]]]:
    """Every offline run under ``wandb_dir`` in the order made: (its run id or None, the steps it logged: the value of
    ``key`` in each history record that has it, e.g. Lightning's ``trainer/global_step``, or ``_step``)."""
    from wandb.proto import wandb_internal_pb2

    runs = []
    for run_dir in sorted(Path(wandb_dir).glob("offline-run-*")):
        ids, steps = set(), []
        for f in run_dir.glob("*.wandb"):
            for payload in _wandb_records(f):
                rec = wandb_internal_pb2.Record()
                rec.ParseFromString(payload)
                kind = rec.WhichOneof("record_type")
                if kind == "run":
                    ids.add(rec.run.run_id)
                elif kind == "history":
                    items = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
                    if key in items and "loss" in items:
                        steps.append(int(float(items[key])))
        assert len(ids) <= 1, (run_dir, ids)
        runs.append((ids.pop() if ids else None, steps))  # None: the file holds no record at all
    return runs


def mlflow_runs(store: Path, metric: str = "loss") -> dict[str, list[int]]:
    """Every run of an MLflow file store: its id -> the steps of ``metric``, in the order logged."""
    out = {}
    for f in Path(store).glob(f"*/*/metrics/{metric}"):
        out[f.parent.parent.name] = [int(line.split()[2]) for line in f.read_text().splitlines() if line.strip()]
    return out


def tensorboard_steps(log_dir: Path, tag: str = "loss") -> list[int]:
    """The steps of ``tag`` over every event file in ``log_dir``, in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}, purge_orphaned_data=False)  # keep repeats
    ea.Reload()
    return [e.step for e in ea.Scalars(tag)]


def strictly_increasing(steps: list[int]) -> bool:
    return all(a < b for a, b in zip(steps, steps[1:]))
