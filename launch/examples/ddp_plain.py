"""Plain torch.distributed DDP, no Lightning: DistributedSampler, rank-0 checkpoint.

The shape of most hand-written PyTorch training scripts. It reads only the
variables kit's launcher (or torchrun) sets: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT. Either way works:

    kit launch --nodes 2 --ntasks-per-node 2 -- python ddp_plain.py
    kit launch --nodes 2 --ntasks-per-node 1 -- torchrun --nproc-per-node 2 ddp_plain.py

A requeued run resumes from ``$KIT_JOB_DIR/checkpoints/plain.pt``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # kit's progress call: its hang watchdog, and the step, loss and samples/s kit ps and kit report show
    from kit.train import progress
except ImportError:  # runs without kit too
    progress = None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--step-delay", type=float, default=0.0, help="Sleep this long after each step (trying things).")
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 1, generator=g) / 4)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=64, sampler=sampler)

    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(device),
        device_ids=[local_rank] if gpu else None,
    )
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ckpt = Path(os.environ.get("KIT_JOB_DIR", ".")) / "checkpoints" / "plain.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
        print(f"plain rank={rank} resuming at epoch {start}", flush=True)
    samples = 0
    step = start * len(loader)
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        total = torch.zeros(2, device=device)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=device)])
            samples += len(xb)
            step += 1
            if progress is not None:
                progress.step(step, loss=loss.item(), samples=len(xb), max_steps=args.epochs * len(loader))
            if args.step_delay:
                time.sleep(args.step_delay)
        dist.all_reduce(total)
        if rank == 0:
            print(f"plain epoch={epoch} loss={(total[0] / total[1]).item():.5f}", flush=True)
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, tmp)
            os.replace(tmp, ckpt)  # only rank 0 writes; a torn checkpoint is never left
        dist.barrier()
    print(f"plain rank={rank} world={world} samples={samples}", flush=True)
    if progress is not None:
        progress.finished()  # every rank: the work is done, whatever the teardown does
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
