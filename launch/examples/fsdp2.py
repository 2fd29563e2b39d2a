"""FSDP2 (torch.distributed.fsdp.fully_shard) on CPU with gloo, started by torchrun through kit.

    kit launch --nodes 2 --ntasks-per-node 1 -- torchrun --nproc-per-node 2 fsdp2.py --steps 30

Every rank holds a shard of each layer's parameters; the loss (all-reduced)
is printed by rank 0 and falls. Runs on GPUs too (nccl) when they are there.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

try:  # kit's progress call: the work declared done before a teardown that gloo may abort
    from kit.train import progress
except ImportError:
    progress = None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)  # the same initial weights on every rank before sharding
    model = nn.Sequential(
        nn.Linear(16, args.width), nn.Tanh(), nn.Linear(args.width, args.width), nn.Tanh(), nn.Linear(args.width, 1)
    ).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(1)
    w_true = torch.randn(16, 1, generator=g)
    data_gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    first = last = None
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 16, generator=data_gen)
        y = torch.tanh(x @ w_true / 4)
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        first = mean if first is None else first
        last = mean
        if rank == 0 and (step == 1 or step % 10 == 0):
            print(f"fsdp2 step={step} loss={mean:.5f} world={world}", flush=True)
    shard = sum(p.to_local().numel() for p in model.parameters())
    full = sum(p.numel() for p in model.parameters())
    print(f"fsdp2 rank={rank} holds {shard} of {full} parameters", flush=True)
    if rank == 0:
        print(f"fsdp2 done first_loss={first:.5f} last_loss={last:.5f}", flush=True)
    if progress is not None:
        progress.finished()  # every rank: the work is done, whatever the teardown below does
    # Tear down in order: FSDP's state (and the collectives it holds) first, then every rank
    # together, then the group. gloo on torch 2.13 can abort ("terminate called without an
    # active exception") when a rank exits while a peer still holds work on the group.
    del model, opt
    loss = mean = None  # the loop's last tensors
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    # Then leave without the interpreter's finalization: gloo's C++ worker threads may still hold work
    # whose tensors the finalization frees, taking the GIL from a C++ thread as it goes, and the process
    # aborts ("terminate called without an active exception", SIGABRT; the mechanism pytorch/pytorch#179291
    # describes). It failed this example's torchrun once in a full suite, after the work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
