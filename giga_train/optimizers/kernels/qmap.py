"""The signed dynamic 8-bit map (exponent + fraction, after Dettmers et al. 2021) and blockwise
quantization in torch.

Codes are sign-magnitude around 127: code 127 is 0, code 127 + pos (pos 1..127) is +v(pos), code
127 - pos is -v(pos), code 255 is +1.0. Positions 1..127 are "exponent + fraction": each decade
[0.1, 1] x 10^e gets a number of codes at the midpoints of equal bins, the most for the top decade.
A block stores its absmax in fp32 and codes hold x / absmax.

Dettmers' map spreads the codes over 7 decades (1, 2, 4 .. 64 codes). CAME's momentum is an
average of RMS-normalised updates, so a 2048-element block rarely spans more than 3-4 decades;
spending the codes on 4 decades (2, 8, 38, 79) lowers the trajectory drift against fp32 CAME on
heavy-tailed gradients from 0.029-0.031 to 0.024-0.027 (tests/test_optimizers.py measures it).

The Triton kernel (kernels/came_triton.py) evaluates the same fp32 formula; encoding is
round-to-nearest in both.
"""
import functools

import torch

ZERO_CODE = 127
# (decade exponent e, number of codes in [0.1, 1] x 10^e), smallest decade first: 127 codes
DECADES = ((-3, 2), (-2, 8), (-1, 38), (0, 79))


def _positive_values():
    """v(pos) for pos = 0..128, in fp32, with the same operation order as the kernel."""
    vals = [torch.zeros(1)]
    for e, count in DECADES:
        k = torch.arange(count, dtype=torch.float32)
        inv_count = torch.tensor(1.0 / count, dtype=torch.float32)
        frac = 0.1 + 0.9 * ((k + 0.5) * inv_count)
        vals.append(torch.tensor(10.0 ** e, dtype=torch.float32) * frac)
    vals.append(torch.ones(1))
    v = torch.cat(vals)
    assert v.numel() == 129
    return v


@functools.lru_cache(maxsize=None)
def _code_table_cpu():
    pos_v = _positive_values()
    table = torch.empty(256, dtype=torch.float32)
    table[127:] = pos_v                      # codes 127..255 -> pos 0..128
    table[:127] = -pos_v[1:128].flip(0)      # codes 0..126 -> -v(127)..-v(1); no -1.0
    return table


@functools.lru_cache(maxsize=None)
def _tables(device):
    table = _code_table_cpu().to(device)
    thresholds = (table[:-1] + table[1:]) / 2  # nearest code = number of midpoints <= x
    return table, thresholds


def code_table(device="cpu"):
    """The 256 values, sorted ascending (code c decodes to table[c] * block absmax)."""
    return _tables(torch.device(device))[0]


def num_blocks(numel, block_size):
    return -(-numel // block_size)


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
    normalized = padded * inv[:, None]
    _, thresholds = _tables(x.device)
    codes = torch.bucketize(normalized, thresholds, right=True).to(torch.uint8)
    return codes.view(-1)[:n].view(x.shape), absmax


def dequantize_blockwise(codes, absmax, block_size):
    """Inverse of quantize_blockwise: fp32 tensor of codes' shape."""
    flat = codes.reshape(-1)
    n = flat.numel()
    nb = absmax.numel()
    table, _ = _tables(codes.device)
    values = table[flat.long()]
    values = torch.nn.functional.pad(values, (0, nb * block_size - n)).view(nb, block_size)
    return (values * absmax[:, None]).view(-1)[:n].view(codes.shape)


def kernel_constants():
    """Constants the Triton encode/decode use, derived from the table (see came_triton.py):
    per decade (smallest first) its first position, code count, lower edge, 10^-e and the
    midpoint below its first code (to zero, or to the previous decade's last code); plus the
    midpoint below +1.0."""
    table = _code_table_cpu().double()
    pos_v = table[127:]
    out, start = [], 1
    for e, count in DECADES:
        dec = 10.0 ** e
        below = (pos_v[start - 1] + pos_v[start]).item() / 2   # zero, or the previous decade's last code
        out.append(dict(start=start, count=count, edge=0.1 * dec, inv_dec=1.0 / dec,
                        below=float(torch.tensor(below, dtype=torch.float32))))
        start += count
    # encode corrects its in-decade estimate only downwards at a decade's first code: valid when
    # each boundary midpoint lies above the decade's lower edge
    assert all(d["below"] > d["edge"] for d in out[1:])
    top = float(torch.tensor((pos_v[127] + pos_v[128]).item() / 2, dtype=torch.float32))
    return out, top
