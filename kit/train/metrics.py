"""The Lightning callback that hands training metrics to kit's exporter.

Local values only (no collective): each rank writes its own file in
``$KIT_METRICS_DIR`` at most every ``interval`` seconds, atomically.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from kit.monitor import training
from kit.train import mfu, progress, stragglers


class ProgressCallback(Callback):
    """Reports each step to kit's hang watchdog, and each saved checkpoint's step.

    Lightning calls ``on_save_checkpoint`` on every rank before the file is
    written: the rank says it is saving; at the next batch (or the end) the
    save is done and rank 0 records the checkpoint step.
    """

    def __init__(self):
        self._saving: int | None = None

    def _saved(self, trainer) -> None:
        if self._saving is not None and trainer.global_rank == 0:
            progress.checkpoint_saved(self._saving)
        self._saving = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._saved(trainer)
        progress.step(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        progress.step(trainer.global_step)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if getattr(trainer, "kit_snapshot", False):
            return  # kit's every-step snapshot (kit.train.lightning_checkpoints): not a save the step waits for
        self._saving = trainer.global_step
        progress.checkpointing(trainer.global_step)

    def on_train_end(self, trainer, pl_module):
        self._saved(trainer)

    def flush(self, trainer) -> None:
        """Call after an explicit ``trainer.save_checkpoint``."""
        self._saved(trainer)
        progress.step(trainer.global_step)


class MetricsCallback(Callback):
    def __init__(
        self,
        directory: str | None = None,
        interval: float = 1.0,
        tokens_per_sample: int | None = None,
        flops_per_step: float | None = None,
        count_flops: bool = False,
    ):
        """``flops_per_step`` (this rank's, per step) gives TFLOP/s and MFU; ``count_flops`` counts them at the
        first batch instead (a no_grad forward of the module on the batch's first element, x 3: kit.train.mfu;
        off by default, as a forward in train mode still moves a BatchNorm's running statistics)."""
        d = directory or os.environ.get("KIT_METRICS_DIR")
        self.directory = Path(d) if d else None
        self.interval = interval
        self.tokens_per_sample = tokens_per_sample
        self.samples = 0
        self._t_start = None
        self._last_write = 0.0
        self._written_samples = 0
        self.values: dict = {}
        self.flops_per_step, self.count_flops = flops_per_step, count_flops
        self.throughput: mfu.Throughput | None = None  # made at the first batch
        self.rates: dict = {}  # tflops (and mfu) over the last write interval

    def _count(self, trainer, pl_module, batch) -> mfu.Throughput:
        flops = self.flops_per_step
        if flops is None and self.count_flops:
            try:
                flops = mfu.flops_per_step(pl_module, batch)
            except Exception:  # a model the counter cannot run alone: no TFLOP/s, never a wrong one
                flops = None
        if trainer.global_rank == 0 and (self.count_flops or flops):
            print(
                f"kit.train[rank 0]: model FLOPs per step per device: {flops if flops else 'not counted'} "
                f"({mfu.HOW if self.flops_per_step is None else 'as given'})",
                flush=True,
            )
        return mfu.Throughput(
            flops, str(trainer.precision), mfu.device_name() if pl_module.device.type == "cuda" else None
        )

    def on_train_start(self, trainer, pl_module):
        if trainer.world_size > 1:  # how late this rank arrives at the gradient all-reduce (kit.train.stragglers)
            stragglers.watch(trainer.strategy.model)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.time()
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        n = int(getattr(x, "shape", [len(x)])[0])
        self.samples += n
        if self.throughput is None:
            self.throughput = self._count(trainer, pl_module, batch)
        self.throughput.step()
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.values = {
            "step": trainer.global_step,
            "loss": float(loss.detach()) if hasattr(loss, "detach") else float(loss),
            "samples_total": self.samples,
            "step_duration_seconds": time.perf_counter() - (self._t_start or time.perf_counter()),
            "last_step_timestamp_seconds": now,
        }
        if self.tokens_per_sample:
            self.values["tokens_total"] = self.samples * self.tokens_per_sample
        if trainer.optimizers:
            self.values["learning_rate"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        if trainer.max_steps and trainer.max_steps > 0:
            self.values["max_steps"] = trainer.max_steps
        self.values.update(self.rates)  # the last measured TFLOP/s and MFU, kept to the end
        if self.directory is not None and now - self._last_write >= self.interval:
            if self._last_write:  # this rank's rate since the last write (kit ps, --wait)
                self.values["samples_per_second"] = (self.samples - self._written_samples) / (now - self._last_write)
                self.rates = self.throughput.values(now - self._last_write) or self.rates
                self.values.update(self.rates)
                self.values.update(stragglers.values())
            else:
                self.throughput.values(0.0)  # the first write: the count starts here
            training.write(self.directory, trainer.global_rank, self.values)
            self._last_write, self._written_samples = now, self.samples

    def on_train_end(self, trainer, pl_module):
        if self.directory is not None and self.values:
            training.write(self.directory, trainer.global_rank, self.values)
