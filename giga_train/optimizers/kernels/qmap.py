"""The signed square-root companding 8-bit map and blockwise quantization in torch.

A block of `block_size` consecutive elements stores its absmax in fp32; an element x stores
code = 127 + sign(x) * k with k = floor(127 * sqrt(|x| / absmax) + 0.5), and decodes to
sign * (k / 127)^2 * absmax. Codes 0..254 are used (127 is 0, 254 is +absmax, 0 is -absmax). The Triton
kernels (kernels/came_codec.py) evaluate the same fp32 formulas; why this map: docs/guide.md, "CAME8Bit's code
map"."""
import functools

import torch

ZERO_CODE = 127
LEVELS = 127
INV_SQ = 1.0 / (LEVELS * LEVELS)  # decode: k*|k| (exact in fp32) times this fp32 constant


def num_blocks(numel, block_size):
    return -(-numel // block_size)


@functools.cache
def _table(device):
    k = torch.arange(256, dtype=torch.int32) - ZERO_CODE
    return ((k * k.abs()).float() * torch.tensor(INV_SQ, dtype=torch.float32)).to(device)


def code_table(device="cpu"):
    """Value of each of the 256 codes for absmax 1 (code 255 is never written)."""
    return _table(torch.device(device))


def encode(normalized):
    """x / absmax in [-1, 1] (fp32) -> uint8 codes."""
    k = normalized.abs().sqrt_().mul_(LEVELS).add_(0.5).floor_().clamp_(max=LEVELS)
    return k.copysign_(normalized).add_(ZERO_CODE).to(torch.uint8)


def decode(codes):
    """uint8 codes -> values for absmax 1 (fp32): a gather from code_table, whose entries are the
    kernels' arithmetic decode."""
    return code_table(codes.device)[codes.long()]


def quantize_blockwise(x, block_size):
    """x (any shape, fp32) -> (codes uint8 of x's shape, absmax fp32 [num_blocks]).

    Blocks are `block_size` consecutive elements of the flattened tensor; an all-zero block gets
    absmax 0 and code 127 everywhere, which decodes to exact zeros."""
    flat = x.reshape(-1)
    n = flat.numel()
    nb = num_blocks(n, block_size)
    padded = torch.nn.functional.pad(flat, (0, nb * block_size - n)).view(nb, block_size)
    absmax = padded.abs().amax(dim=1)
    inv = torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))
    codes = encode(padded * inv[:, None])
    return codes.view(-1)[:n].view(x.shape), absmax


def dequantize_blockwise(codes, absmax, block_size):
    """Inverse of quantize_blockwise: fp32 tensor of codes' shape."""
    flat = codes.reshape(-1)
    n = flat.numel()
    nb = absmax.numel()
    values = torch.nn.functional.pad(decode(flat), (0, nb * block_size - n)).view(nb, block_size)
    return (values * absmax[:, None]).view(-1)[:n].view(codes.shape)
