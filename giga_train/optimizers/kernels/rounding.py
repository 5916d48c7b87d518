"""Stochastic rounding to bf16 from a counter-based hash, in torch.

The noise of element i of a tensor is hash(i, key) & 0xFFFF, key mixing the tensor's step count
(a device tensor) and its position in the optimizer: computed on the device, so a step needs no
host read of the step count, draws new noise every step, and a resumed run (whose state holds
the step) draws the same noise. The Triton kernels (came_codec.py) compute the same bits.
Arithmetic is int64 with every product below 2^63 (the uint32 hash, emulated).
"""
import torch

M32 = 0xFFFFFFFF
MIX = 1000003        # key = ((step * MIX + group) * MIX + index) mod 2^31
SPREAD = 0x27D4EB2F  # element index -> hash input
MUL = 0x45D9F3B      # the integer hash of Thomas Mueller: two multiply-xorshift rounds


def seed_key(step, group_index, param_index):
    """int64 device scalar from the fp32 step tensor (before this step's increment)."""
    k = (step.to(torch.int64) * MIX + group_index) & 0x7FFFFFFF
    return (k * MIX + param_index) & 0x7FFFFFFF


def noise16(numel, key):
    """int32 noise in [0, 65536) for elements 0..numel-1 of a tensor."""
    x = (torch.arange(numel, dtype=torch.int64, device=key.device) * SPREAD + key) & M32
    x = (((x >> 16) ^ x) * MUL) & M32
    x = (((x >> 16) ^ x) * MUL) & M32
    x = (x >> 16) ^ x
    return (x & 0xFFFF).to(torch.int32)


def write_param_(p, value, key=None):
    """Store fp32 `value` into `p`: bf16 with stochastic rounding (small steps survive on
    average), other dtypes by round-to-nearest."""
    if p.dtype == torch.bfloat16:
        bits = value.contiguous().view(torch.int32)
        noise = noise16(value.numel(), key).view(value.shape)
        value = ((bits + noise) & -65536).view(torch.float32)
    p.copy_(value)
