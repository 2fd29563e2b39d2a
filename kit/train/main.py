"""``python -m kit.train``: see :mod:`kit.train`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kit.jobdir import JobDir
from kit.train import lightning_checkpoints, preempt, trackers
from kit.train import progress as kit_progress


def log(msg: str) -> None:
    print(f"kit.train[rank {os.environ.get('RANK', '0')}]: {msg}", flush=True)


# Where --logger's runs go: W&B's project, MLflow's experiment (the run itself is the job's: kit.train.trackers).
TRACKER_ARGS = {"wandb": {"project": "kit"}, "mlflow": {"experiment_name": "kit"}, "tensorboard": {}}


class Regression(L.LightningModule):
    """An MLP fitting a fixed random linear map plus a nonlinearity, on data it generates."""

    def __init__(self, features: int = 32, hidden: int = 64, lr: float = 1e-2, gradient_checkpointing: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.gradient_checkpointing = gradient_checkpointing
        self.first_loss: float | None = None
        self.last_loss: float | None = None

    def forward(self, x):
        if self.gradient_checkpointing and self.training:
            # Activations of the hidden layer are recomputed in the backward pass, not kept.
            hidden = torch.utils.checkpoint.checkpoint(self.net[:2], x, use_reentrant=False)
            return self.net[2:](hidden)
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        value = float(loss.detach())
        if self.first_loss is None:
            self.first_loss = value
        self.last_loss = value
        self.log("loss", loss.detach())  # to the --logger trackers (nothing without one)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def make_data(samples: int, features: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = torch.tanh(x @ w / features**0.5) + 0.05 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


class Preemption(Callback):
    """On the warning signal, all ranks agree at a step boundary to checkpoint (to every tier) and stop."""

    def __init__(self, ckpt_path: Path, progress, store=None):
        self.ckpt_path = ckpt_path
        self.progress = progress
        self.store = store  # kit's checkpoints (else today's last.ckpt)
        self.preempted = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # One tiny all-reduce per step: ranks see the signal at different steps.
        if trainer.strategy.reduce_boolean_decision(preempt.requested(), all=False):
            self.preempted = True
            if self.store is not None:
                state = lightning_checkpoints.full_state(trainer)
                whole = self.store.finish(state, trainer.global_step, "warning")
                what = "a checkpoint to every tier" if whole else "a checkpoint (not yet in the job directory)"
            else:
                trainer.save_checkpoint(self.ckpt_path)
                what = self.ckpt_path.name
            self.progress.flush(trainer)
            log(f"warning signal: saved {what} at step {trainer.global_step}, stopping")
            trainer.should_stop = True


class StepProfiler(Callback):
    """torch.profiler over steps FIRST..LAST on this rank; a Chrome trace per
    rank (``rank-<R>.json``) in ``directory``; each step is a ``kit.step.N`` range."""

    def __init__(self, first: int, last: int, directory: Path):
        self.first, self.last, self.directory = first, last, directory
        self.profiler = None
        self.step_range = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step + 1  # the step this batch makes
        if self.profiler is None and self.first <= step <= self.last:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
        if self.profiler is not None:
            from torch.profiler import record_function

            self.step_range = record_function(f"kit.step.{step}")
            self.step_range.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None
        if self.profiler is not None and trainer.global_step >= self.last:
            self._finish(trainer)

    def on_train_end(self, trainer, pl_module):
        if self.profiler is not None:
            self._finish(trainer)

    def _finish(self, trainer) -> None:
        self.profiler.__exit__(None, None, None)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / JobDir.RANK_METRICS.format(rank=trainer.global_rank)  # the same name, per rank
        self.profiler.export_chrome_trace(str(path))
        self.profiler = None
        log(f"profile of steps {self.first}-{self.last}: {path}")


def parse_step_range(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B (steps), got {text!r}") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected 1 <= A <= B, got {text!r}")
    return a, b


class StepDelay(Callback):
    """Slows each step down (for trying out preemption on a tiny model)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, *args):
        time.sleep(self.seconds)


class Progress(Callback):
    def __init__(self, every: int):
        self.every = every
        self.last = -1
        self.samples = 0
        self.t_first: float | None = None
        self.t_last: float | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self.t_first is None:
            self.t_first = now  # throughput counts from the end of the first batch
        else:
            self.samples += len(batch[0])
        self.t_last = now
        step = trainer.global_step
        if trainer.global_rank == 0 and step != self.last and (step == 1 or step % self.every == 0):
            self.last = step
            log(f"step={step} loss={pl_module.last_loss:.5f}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kit.train", description=__doc__)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--model",
        choices=("mlp", "gpt"),
        default="mlp",
        help="mlp: a small MLP on data a CPU loader feeds; gpt: a decoder-only transformer whose batches are made "
        "on its device (--d-model, --layers, --heads, --seq-len, --vocab; --batch-size sequences a step).",
    )
    p.add_argument("--lr", type=float, default=None, help="[default: 1e-2 for the MLP, 1e-3 for the GPT]")
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128, help="The GPT's width.")
    p.add_argument("--layers", type=int, default=2, help="The GPT's blocks.")
    p.add_argument("--heads", type=int, default=4, help="The GPT's attention heads.")
    p.add_argument("--seq-len", type=int, default=64, help="The GPT's tokens per sequence.")
    p.add_argument("--vocab", type=int, default=256, help="The GPT's vocabulary.")
    p.add_argument(
        "--precision", default="32-true", help="Lightning precision: 32-true, bf16-mixed, 16-mixed (GPU), ..."
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model's forward (in place: checkpoints keep their keys); its first steps compile.",
    )
    p.add_argument("--gradient-clip-val", type=float, default=None)
    p.add_argument("--accumulate-grad-batches", type=int, default=1)
    lightning_checkpoints.add_arguments(p)
    p.add_argument("--checkpoint-dir", default=None, help="[default: $KIT_JOB_DIR/checkpoints]")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--step-delay", type=float, default=0.0, help="Sleep this long after each step (testing).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="Recompute the hidden activations in the backward pass instead of keeping them.",
    )
    p.add_argument(
        "--profile-steps",
        type=parse_step_range,
        default=None,
        metavar="A-B",
        help="torch.profiler on every rank for steps A-B: a Chrome trace per rank in $KIT_JOB_DIR/profiles/.",
    )
    p.add_argument(
        "--logger",
        type=parse_loggers,
        default=[],
        metavar="KIND[,KIND]",
        help="Log to wandb, mlflow and/or tensorboard: the job's one run across requeues, no step "
        "logged twice (kit.train.trackers).",
    )
    return p.parse_args(argv)


def parse_loggers(text: str) -> list[str]:
    kinds = [k for k in text.split(",") if k]
    bad = [k for k in kinds if k not in trackers.KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown logger {bad[0]!r}: one of {', '.join(trackers.KINDS)}")
    return kinds


def _callbacks(args, ckpt_dir: Path, job_dir: Path, flops: int | None, store) -> tuple[list, "Preemption", "Progress"]:
    """The trainer's callbacks: preemption (checkpoint on kit's warning), progress lines and kit's progress
    reports, the exporter's metrics when a metrics directory is set (``flops``: a step's, else counted), kit's
    snapshots (``store``; else today's last.ckpt), then what the arguments ask for."""
    from kit.train.metrics import MetricsCallback, ProgressCallback

    reporter = ProgressCallback()
    preemption = Preemption(ckpt_dir / "last.ckpt", reporter, store)
    progress = Progress(args.log_every)
    callbacks = [preemption, progress, reporter]
    if os.environ.get("KIT_METRICS_DIR"):
        callbacks.append(MetricsCallback(flops_per_step=flops, count_flops=flops is None))
    if store is not None:  # first: a step's snapshot before the warning's save of the same step (which is final)
        callbacks.insert(0, lightning_checkpoints.Snapshots(store))
    elif args.checkpoint_every != "0":
        every = args.checkpoint_every
        timed = {"train_time_interval": timedelta(seconds=int(every[:-1]))} if every.endswith("s") else {}
        steps = {} if timed else {"every_n_train_steps": 50 if every == "auto" else int(every)}
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, **timed, **steps))
    if args.step_delay:
        callbacks.append(StepDelay(args.step_delay))
    if args.profile_steps:
        callbacks.append(StepProfiler(*args.profile_steps, job_dir / JobDir.PROFILES))
    return callbacks, preemption, progress


def _model_and_data(args):
    """The model the arguments name and what Lightning iterates for it."""
    if args.model == "gpt":
        from kit.train import gpt

        model = gpt.GPT(
            args.vocab,
            args.d_model,
            args.layers,
            args.heads,
            args.seq_len,
            args.batch_size,
            1e-3 if args.lr is None else args.lr,
        )
        if int(os.environ.get("RANK", "0")) == 0:
            log(f"gpt: {model.counted_parameters()} parameters, {model.flops_per_step()} FLOPs per step per rank")
        return model, DataLoader(gpt.Steps(args.batch_size), batch_size=None)
    model = Regression(args.features, args.hidden, 1e-2 if args.lr is None else args.lr, args.gradient_checkpointing)
    return model, DataLoader(
        make_data(args.samples, args.features, args.seed), batch_size=args.batch_size, shuffle=True
    )


def _compiled_graphs() -> int:
    """How many graphs torch.compile made in this process (dynamo's own count)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def main(argv=None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if world % per_node:
        sys.exit(f"kit.train: WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={per_node}")
    num_nodes = world // per_node
    gpu = torch.cuda.is_available()
    job_dir = Path(os.environ.get("KIT_JOB_DIR", "."))
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else job_dir / JobDir.CHECKPOINTS
    last = ckpt_dir / "last.ckpt"
    log(
        f"rank={os.environ.get('RANK', '0')} world_size={world} local_rank={os.environ.get('LOCAL_RANK', '0')} "
        f"node_rank={os.environ.get('NODE_RANK', '0')} nodes={num_nodes} devices={per_node} "
        f"backend={'nccl' if gpu else 'gloo'}"
    )

    L.seed_everything(args.seed, workers=True, verbose=False)
    preempt.install()
    model, data = _model_and_data(args)
    flops = model.flops_per_step() if args.model == "gpt" else None
    if args.compile:
        model.compile()  # nn.Module.compile: the module's call compiled, its parameters and their names kept
    store = lightning_checkpoints.store_for(args)
    callbacks, preemption, progress = _callbacks(args, ckpt_dir, job_dir, flops, store)
    loggers = [trackers.lightning_logger(kind, **TRACKER_ARGS[kind]) for kind in args.logger]
    plugins = []
    resume = lightning_checkpoints.resume(store, last, plugins)
    if SLURMEnvironment.detect():
        # kit requeues from the batch script; Lightning's own requeue would race it.
        plugins.append(SLURMEnvironment(auto_requeue=False))
    trainer = L.Trainer(
        accelerator="gpu" if gpu else "cpu",
        devices=per_node,
        num_nodes=num_nodes,
        strategy=DDPStrategy(process_group_backend="nccl" if gpu else "gloo") if world > 1 else "auto",
        plugins=plugins,
        precision=args.precision,
        max_steps=args.max_steps,
        gradient_clip_val=args.gradient_clip_val,
        accumulate_grad_batches=args.accumulate_grad_batches,
        callbacks=callbacks,
        logger=loggers or False,
        log_every_n_steps=args.log_every,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=store is None and args.checkpoint_every != "0",
        default_root_dir=str(job_dir),
        max_epochs=-1,
    )
    trainer.fit(model, data, ckpt_path=resume)
    step = trainer.global_step
    if trainer.global_rank == 0:
        losses = " ".join(
            f"{k}={v:.5f}"
            for k, v in (("first_loss", model.first_loss), ("last_loss", model.last_loss))
            if v is not None
        )
        log(f"done at step={step} {losses or '(no step left to run)'}")
        if args.compile:
            log(f"torch.compile: {_compiled_graphs()} graph(s) compiled")
        if progress.t_first is not None and progress.t_last > progress.t_first:
            rate = progress.samples / (progress.t_last - progress.t_first)
            log(f"throughput: {rate:.1f} samples/s per rank over {progress.t_last - progress.t_first:.2f} s")
    if not preemption.preempted and step >= args.max_steps:
        if store is not None and not store.finish(lightning_checkpoints.full_state(trainer), step):
            log(f"the last state (step {step}) did not reach the job directory in time: it is on the nodes")
        # Every rank says its work is done (kit then calls the run finished even if
        # a rank dies in teardown); rank 0 writes the job's marker.
        kit_progress.finished()
        if trainer.global_rank == 0 and os.environ.get("KIT_FINISHED_FILE"):
            Path(os.environ["KIT_FINISHED_FILE"]).touch()
    # Leaving with the process group up lets gloo's threads die unjoined at exit (SIGABRT).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
