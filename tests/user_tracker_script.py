"""A user's own trainer (plain PyTorch, no Lightning) that logs to W&B, MLflow and TensorBoard through
the README's lines: the job's one run in each, no step logged twice across requeues. It checkpoints
every 10 steps (and reports the step to kit), logs every 5, and runs to 60 steps."""

import os
import time
from pathlib import Path

import mlflow
import torch
import wandb
from torch.utils.tensorboard import SummaryWriter

from kit.train import progress, trackers

job = Path(os.environ["KIT_JOB_DIR"])
ckpt = job / "user.ckpt"
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if ckpt.exists():
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
print(f"user: resuming at step {start} (kit: {trackers.resumed_step()})", flush=True)
rank0 = os.environ.get("RANK", "0") == "0"
if rank0:
    run = wandb.init(project="kit-user")  # the README's lines: kit's WANDB_* make this the job's one run
    trackers.mlflow_start_run()
    writer = SummaryWriter(trackers.tensorboard_dir())
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(start + 1, 61):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    progress.step(step, loss=float(loss))
    if rank0 and step % 5 == 0:  # the README's lines, one per tracker
        if trackers.new_step(step, "wandb"):
            run.log({"loss": float(loss)}, step=step)
        if trackers.new_step(step, "mlflow"):
            mlflow.log_metric("loss", float(loss), step=step)
        if trackers.new_step(step, "tensorboard"):
            writer.add_scalar("loss", float(loss), step)
            writer.flush()
        print(f"user: logged step {step}", flush=True)
    if step % 10 == 0 and rank0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
        Path(os.environ["KIT_CHECKPOINT_STEP_FILE"]).write_text(f"{step}\n")
    time.sleep(0.25)
if rank0:
    run.finish()
    mlflow.end_run()
    writer.close()
progress.finished()
