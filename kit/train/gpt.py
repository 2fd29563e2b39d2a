"""The reference trainer's GPT (``python -m kit.train --model gpt``): a decoder-only transformer (pre-norm blocks,
causal attention through ``scaled_dot_product_attention``, a GELU MLP, the output layer tied to the token
embedding) whose batches are made on its own device — no loader on the CPU feeds the GPU — from a sequence it can
learn (each token the one before it plus one, modulo the vocabulary, from a random start).

Its FLOPs per step are the 6·N·tokens rule plus attention's 12·layers·d_model·seq per token (PaLM's appendix B,
nanoGPT's ``estimate_mfu``): N counts every parameter but the position embedding (the tied output layer's matmul
is the token embedding's); a test holds it against ``torch.utils.flop_counter`` on a forward and backward pass.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import IterableDataset


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(L.LightningModule):
    """``layers`` blocks of ``d_model`` with ``heads`` heads over ``seq`` tokens of a ``vocab``-token vocabulary;
    ``batch`` sequences a step, made on the device."""

    def __init__(
        self,
        vocab: int = 256,
        d_model: int = 128,
        layers: int = 2,
        heads: int = 4,
        seq: int = 64,
        batch: int = 16,
        lr: float = 1e-3,
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"--d-model {d_model} is not a multiple of --heads {heads}")
        self.save_hyperparameters()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for module in self.modules():  # GPT-2's initialisation: a first loss near ln(vocab)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        self.first_loss: float | None = None
        self.last_loss: float | None = None

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch made on the model's device: inputs and their next tokens."""
        h = self.hparams
        start = torch.randint(0, h.vocab, (h.batch, 1), device=self.device)
        run = (start + torch.arange(h.seq + 1, device=self.device)) % h.vocab
        return run[:, :-1], run[:, 1:]

    def training_step(self, batch, batch_idx):
        x, y = self.tokens()
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        value = float(loss.detach())
        if self.first_loss is None:
            self.first_loss = value
        self.last_loss = value
        self.log("loss", loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    def counted_parameters(self) -> int:
        """N of the 6·N rule: every parameter once (the tied output layer is the embedding), the positions not."""
        return sum(p.numel() for p in self.parameters()) - self.pos.weight.numel()

    def flops_per_step(self) -> int:
        """One step's FLOPs on this rank: (6·N + 12·layers·d_model·seq) per token, ``batch``·``seq`` tokens."""
        h = self.hparams
        return (6 * self.counted_parameters() + 12 * h.layers * h.d_model * h.seq) * h.batch * h.seq


class Steps(IterableDataset):
    """What Lightning iterates for the GPT: a placeholder of ``batch`` rows a step (the model makes its tokens on
    its device), so a step's samples read as elsewhere (``len(batch[0])``)."""

    def __init__(self, batch: int):
        self.batch = batch

    def __iter__(self):
        while True:
            yield (torch.zeros(self.batch, dtype=torch.uint8),)
