"""Helpers of multi-tensor launches: dtype codes, address tables, program tables."""
import torch

KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def cumsum0(sizes):
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out, total


def upload(t, device):
    """A host tensor on `device` without a host sync (pinned staging, non-blocking copy): a bucket built
    at the first step must not stall it either."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def program_table(counts, device):
    """int32 [sum(counts), 2] of (tensor index, local index) pairs: the grid of a multi-tensor launch."""
    counts_t = torch.tensor(counts, dtype=torch.int64)
    owner = torch.repeat_interleave(torch.arange(len(counts)), counts_t)
    starts = torch.cumsum(counts_t, 0) - counts_t
    local = torch.arange(int(counts_t.sum())) - torch.repeat_interleave(starts, counts_t)
    return upload(torch.stack([owner, local], 1).to(torch.int32).contiguous(), device)


def segments(sizes, device):
    """int64 [len(sizes) + 1] boundaries of consecutive segments of the given sizes."""
    starts, total = cumsum0(sizes)
    return upload(torch.tensor(starts + [total], dtype=torch.int64), device)


class PointerTable:
    """Device int64 addresses of a list of tensors, uploaded again only when one changes."""

    def __init__(self, device):
        self.device, self.host, self.table = device, None, None

    def update(self, tensors):
        ptrs = [t.data_ptr() for t in tensors]
        if ptrs != self.host:
            self.table = upload(torch.tensor(ptrs, dtype=torch.int64), self.device)
            self.host = ptrs
        return self.table

    def aligned(self):
        return all(p % 16 == 0 for p in self.host)


class OffsetTable:
    """Device int64 element offsets of same-dtype tensors from the first one (the kernels' base
    pointer argument), uploaded again only when an address changes."""

    def __init__(self, device):
        self.device, self.host, self.table, self.diffs = device, None, None, None

    def update(self, tensors):
        ptrs = [t.data_ptr() for t in tensors]
        if ptrs != self.host:
            size = tensors[0].element_size()
            self.diffs = [p - ptrs[0] for p in ptrs]
            assert all(d % size == 0 for d in self.diffs), "tensors of one bucket share a dtype"
            staging = torch.tensor([d // size for d in self.diffs], dtype=torch.int64,
                                   pin_memory=self.device.type == "cuda")
            self.table = staging.to(self.device, non_blocking=True)
            self.host, self.size = ptrs, size
        return self.table

    def aligned(self):
        """Every tensor 16-byte aligned at an offset of a multiple of 16 elements (the kernels' hint)."""
        return self.host[0] % 16 == 0 and all(d % (16 * self.size) == 0 for d in self.diffs)


def cdiv1(a, b):
    """Grid size for `a` elements in blocks of `b` (at least one program)."""
    return max(1, -(-a // b))


def advance_steps(steps, skip=None):
    """Step counters + 1, or + (1 - skip) with `skip` a 0-dim device tensor (0.0, or 1.0 for a step the
    kernel skips): the count stays right without a host read."""
    torch._foreach_add_(steps, 1.0)
    if skip is not None:  # a list of tensors, as torch's fused Adam does: a 0-dim tensor operand would sync
        torch._foreach_sub_(steps, [skip] * len(steps))
