"""Helpers of multi-tensor launches: dtype codes, address tables, program tables."""
import torch

KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def cumsum0(sizes):
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out, total


def program_table(counts, device):
    """int32 [sum(counts), 2] of (tensor index, local index) pairs: the grid of a multi-tensor launch."""
    counts_t = torch.tensor(counts, dtype=torch.int64)
    owner = torch.repeat_interleave(torch.arange(len(counts)), counts_t)
    starts = torch.cumsum(counts_t, 0) - counts_t
    local = torch.arange(int(counts_t.sum())) - torch.repeat_interleave(starts, counts_t)
    return torch.stack([owner, local], 1).to(torch.int32).contiguous().to(device)


def segments(sizes, device):
    """int64 [len(sizes) + 1] boundaries of consecutive segments of the given sizes."""
    starts, total = cumsum0(sizes)
    return torch.tensor(starts + [total], dtype=torch.int64, device=device)


class PointerTable:
    """Device int64 addresses of a list of tensors, uploaded again only when one changes."""

    def __init__(self, device):
        self.device, self.host, self.table = device, None, None

    def update(self, tensors):
        ptrs = [t.data_ptr() for t in tensors]
        if ptrs != self.host:
            staging = torch.tensor(ptrs, dtype=torch.int64, pin_memory=self.device.type == "cuda")
            self.table = staging.to(self.device, non_blocking=True)
            self.host = ptrs
        return self.table

    def aligned(self):
        return all(p % 16 == 0 for p in self.host)


def cdiv1(a, b):
    """Grid size for `a` elements in blocks of `b` (at least one program)."""
    return max(1, -(-a // b))


def advance_steps(steps, skip=None):
    """Step counters + 1, or + (1 - skip) with `skip` a 0-dim device tensor (0.0, or 1.0 for a step the
    kernel skips): the count stays right without a host read."""
    if skip is None:
        torch._foreach_add_(steps, 1.0)
    else:
        torch._foreach_add_(steps, 1.0 - skip)
