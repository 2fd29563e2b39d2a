"""How far a job's training got: its latest step, loss, samples/s, TFLOP/s and MFU, from the files each rank's
metrics callback writes (``kit ps``, ``--wait``'s line, ``kit ui``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kit.jobdir.metrics import newest_rank_metrics


@dataclass
class Progress:
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    samples_per_second: float | None = None  # the job's: every rank of the latest run
    tflops: float | None = None  # rank 0's device: the model's achieved TFLOP/s (kit.train.mfu)
    mfu: float | None = None  # rank 0's device: of its peak (None: n/a, a CPU or an unknown GPU)


def _rank_files(job_dir: Path) -> dict[int, dict]:
    """Each rank's newest metrics values (kit.jobdir.metrics.newest_rank_metrics)."""
    return {rank: values for rank, (_, values) in newest_rank_metrics(job_dir).items()}


def training_progress(job_dir: Path) -> Progress:
    """The job's latest training metrics, from the files kit.train's callback
    writes: step, max steps and loss from rank 0; samples/s summed over the
    ranks that reported within 30 s of rank 0 (the current run's)."""
    files = _rank_files(job_dir)
    zero = files.get(0)
    if zero is None:
        return Progress()
    t0 = zero["last_step_timestamp_seconds"]
    rates = [
        f["samples_per_second"]
        for f in files.values()
        if "samples_per_second" in f and abs(f["last_step_timestamp_seconds"] - t0) <= 30
    ]
    return Progress(
        step=int(zero["step"]) if "step" in zero else None,
        max_steps=int(zero["max_steps"]) if "max_steps" in zero else None,
        loss=zero.get("loss"),
        samples_per_second=sum(rates) if rates else None,
        tflops=zero.get("tflops"),
        mfu=zero.get("mfu"),
    )


def progress_words(p: Progress) -> list[str]:
    """``step 120/3000``, ``loss 0.0312``, ``5120 samples/s``: what is known."""
    words = []
    if p.step is not None:
        words.append(f"step {p.step}" + (f"/{p.max_steps}" if p.max_steps else ""))
    if p.loss is not None:
        words.append(f"loss {p.loss:.4g}")
    if p.samples_per_second is not None:
        words.append(f"{p.samples_per_second:.0f} samples/s")
    if p.tflops is not None:
        words.append(f"{p.tflops:.3g} TFLOP/s/device, MFU " + (f"{100 * p.mfu:.0f}%" if p.mfu is not None else "n/a"))
    return words
