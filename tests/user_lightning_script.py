"""A user's own Lightning script (not kit's trainer), using Lightning's defaults
for cluster detection: the launcher must make it see the real topology."""

import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    nodes = int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=nodes,
        strategy="ddp",
        max_steps=3,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    print(
        f"user-script global_rank={trainer.global_rank} world_size={trainer.world_size} "
        f"env={type(trainer.strategy.cluster_environment).__name__}",
        flush=True,
    )
    # Lightning leaves the process group up; gloo's threads then die unjoined at exit now and then
    # (SIGABRT, "terminate called without an active exception", torch 2.13): what this script tests
    # is the rank mapping, so it ends the group as torch asks. kit's answer for scripts that do not
    # is the case of work declared finished, then a crash in teardown.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
