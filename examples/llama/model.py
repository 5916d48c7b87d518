"""A Llama-style decoder (used by bench/ and the tests): RMSNorm, SwiGLU, RoPE, GQA through
scaled_dot_product_attention, untied embedding and output head. Module names follow Meta's reference
(tok_embeddings, layers.N.attention.wq, feed_forward.w1, norm, output), as torchtitan's do."""
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    batch: int
    checkpointing: bool = False  # activation checkpointing of every Block

    @property
    def head_dim(self):
        return self.dim // self.heads

    def linear_params(self):
        """Parameters that take part in matmuls: every Linear, the output head included."""
        kv = self.kv_heads * self.head_dim
        per_layer = 2 * self.dim * self.dim + 2 * self.dim * kv + 3 * self.dim * self.ffn
        return self.layers * per_layer + self.dim * self.vocab

    def params(self):
        return self.linear_params() + self.dim * self.vocab + (2 * self.layers + 1) * self.dim

    def flops_per_token(self):
        """Model FLOPs of one training token (forward + backward), PaLM's count: 6 per matmul parameter,
        plus 12 * layers * dim * seq for the attention scores and values (the causal half not taken
        off, as PaLM, nanoGPT and torchtitan count it). Recomputation is not counted."""
        return 6 * self.linear_params() + 12 * self.layers * self.dim * self.seq

    def to_dict(self):
        return asdict(self)


SHAPES = {
    "tiny": Shape(dim=64, layers=2, heads=4, kv_heads=2, ffn=160, vocab=256, seq=32, batch=2),
    # The 1B probe (hand loop, H200, 2026-12-02): 61.1k tokens/s at 37.9% MFU fixes 6.13 GFLOP/token: this shape.
    "1b": Shape(dim=2048, layers=16, heads=16, kv_heads=16, ffn=5632, vocab=32000, seq=2048, batch=4),
    "8b": Shape(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq=2048, batch=1,
                checkpointing=True),
    # The fp8 probe (H200, 2026-12-02): 8 blocks of the 8B shape, seq 4096, batch 2.
    "8b8": Shape(dim=4096, layers=8, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq=4096, batch=2),
    "13b": Shape(dim=5120, layers=40, heads=40, kv_heads=40, ffn=13824, vocab=32000, seq=2048, batch=1,
                 checkpointing=True),
}


def shape_of(name, **overrides):
    return replace(SHAPES[name], **{k: v for k, v in overrides.items() if v is not None})


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(seq, head_dim, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)  # tables are fp32: keep q, k in autocast dtype


class Attention(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, s.head_dim
        self.wq = nn.Linear(s.dim, s.heads * s.head_dim, bias=False)
        self.wk = nn.Linear(s.dim, s.kv_heads * s.head_dim, bias=False)
        self.wv = nn.Linear(s.dim, s.kv_heads * s.head_dim, bias=False)
        self.wo = nn.Linear(s.heads * s.head_dim, s.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = dict(enable_gqa=True) if self.kv_heads != self.heads else {}
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.w1 = nn.Linear(s.dim, s.ffn, bias=False)  # gate
        self.w3 = nn.Linear(s.dim, s.ffn, bias=False)  # up
        self.w2 = nn.Linear(s.ffn, s.dim, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(s.dim), Attention(s)
        self.ffn_norm, self.feed_forward = RMSNorm(s.dim), FeedForward(s)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """forward(tokens (B, T+1)) -> mean next-token cross-entropy over the T predicted positions."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.dim)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.dim)
        self.output = nn.Linear(shape.dim, shape.vocab, bias=False)
        cos, sin = rope_tables(shape.seq, shape.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        t = inputs.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.tok_embeddings(inputs)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class SyntheticTokens(torch.utils.data.Dataset):
    """Item i: seq+1 random token ids drawn from a generator seeded by (seed, i): the same batches
    whoever iterates, in whatever order."""

    def __init__(self, size, seq, vocab, seed=0):
        self.size, self.seq, self.vocab, self.seed = size, seq, vocab, seed

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return {"tokens": torch.randint(0, self.vocab, (self.seq + 1,), generator=g)}
