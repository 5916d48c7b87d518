"""Tiny models for the sequence-parallel tests: a causal decoder with rotary positions whose blocks call
giga_train's sequence-parallel attention (each rank runs its slice of the sequence, positions per slice),
and its trainer, which writes the per-step losses that every strategy logs (reduced over the ranks)."""
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from giga_train import Trainer
from giga_train.engine.sequence_parallel import attention, gather_sequence, shard_sequence
from examples.char_lm import data  # noqa: F401  (registers StdlibText)


def rotary(positions, dim, base=10000.0):
    """cos, sin [S, dim] of the rotation at each (absolute) position."""
    freqs = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * freqs[None]
    return angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)


def rotate(x, cos, sin):
    pairs = x.unflatten(-1, (-1, 2))
    turned = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)
    return x * cos + turned * sin


class RopeBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = attention(q, k, v, is_causal=True)  # this rank's slice of the sequence
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class RopeDecoder(nn.Module):
    """Sharded after the embedding, gathered after the head: every parameter sees only this rank's slice,
    so the SP group's gradients sum to one process's."""

    def __init__(self, vocab_size=256, dim=16, layers=2, heads=4):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(RopeBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head_dim = dim // heads
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.1)

    def forward(self, tokens, targets):
        positions = shard_sequence(torch.arange(tokens.shape[1], device=tokens.device), 0)
        cos, sin = rotary(positions, self.head_dim)
        x = shard_sequence(self.embed(tokens), 1)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = gather_sequence(self.head(self.norm(x)), 1)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class LossFileTrainer(Trainer):
    """Writes each micro-batch's loss averaged over the ranks (what the log reports) to losses.json."""

    def get_models(self, model_config):
        self.losses = []
        return RopeDecoder(**model_config)

    def forward_step(self, batch_dict):
        loss = self.model(batch_dict["tokens"], batch_dict["targets"])
        self.record(loss)
        return loss

    def record(self, loss):
        self.losses.append(self.strategy.reduce_mean(loss.detach().float()).item())
        if self.is_main_process:
            with open(os.path.join(self.project_dir, "losses.json"), "w") as f:
                json.dump(self.losses, f)


def read_losses(project):
    with open(os.path.join(str(project), "losses.json")) as f:
        return json.load(f)
