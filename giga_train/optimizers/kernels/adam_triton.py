"""Multi-tensor Adam/AdamW in one Triton launch per bucket (tensors of one dtype set).

Every program updates BLOCK consecutive elements of one tensor; addresses come from a device
table (params, grads, exp_avg, exp_avg_sq, master weights, step counters), so a 300M-parameter
step is a single launch that streams the 28 bytes/param fp32 Adam must move, plus a step-counter
increment. Bias corrections are computed on the device from the step tensors: no host sync.
With a skip flag (FusedAdam's `found_inf`) every program masks all its loads and stores off when the
flag is 1.0, and the step counters advance by 1 - flag: a skipped step changes nothing, on the device.
"""
import math

import torch
import triton
import triton.language as tl

from .multi_tensor import KIND, PointerTable, advance_steps, program_table, upload
from .triton_ptr import table_ptr

BLOCK, WARPS = 1024, 4  # the fastest of bench/optimizers.py --tune on the H200
ROWS = 6  # table rows: param, grad, exp_avg, exp_avg_sq, master, step


@triton.jit
def _adam_kernel(TAB, NUMEL, CHUNKS, LOG_BETAS, SKIP, n, lr, b1, b2, eps, wd,
                 P_KIND: tl.constexpr, G_KIND: tl.constexpr, S_KIND: tl.constexpr,
                 MASTER: tl.constexpr, ADAMW: tl.constexpr, ALIGNED: tl.constexpr, SKIPPABLE: tl.constexpr,
                 BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    k = tl.load(CHUNKS + 2 * pid)
    chunk = tl.load(CHUNKS + 2 * pid + 1)
    numel = tl.load(NUMEL + k)
    p_ptr = table_ptr(TAB + 0 * n, k, P_KIND, ALIGNED)
    g_ptr = table_ptr(TAB + 1 * n, k, G_KIND, ALIGNED)
    m_ptr = table_ptr(TAB + 2 * n, k, S_KIND, ALIGNED)
    v_ptr = table_ptr(TAB + 3 * n, k, S_KIND, ALIGNED)
    w_ptr = table_ptr(TAB + 4 * n, k, 0, ALIGNED)
    # bias corrections in fp64 from log(beta) computed on the host in double, as torch does
    step = tl.load(table_ptr(TAB + 5 * n, k, 0, False)).to(tl.float64)
    bc1 = (1.0 - tl.exp(step * tl.load(LOG_BETAS))).to(tl.float32)
    bc2_sqrt = tl.sqrt_rn((1.0 - tl.exp(step * tl.load(LOG_BETAS + 1))).to(tl.float32))
    if SKIPPABLE:  # a skipped step: no element in range, so no lane loads or stores anything
        numel = tl.where(tl.load(SKIP) > 0.0, 0, numel)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    if MASTER:
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    else:
        w = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ADAMW:
        w = w * (1.0 - lr * wd)
    else:
        g = g + wd * w
    m = m + (g - m) * (1.0 - b1)          # torch's lerp
    v = v * b2 + (g * g) * (1.0 - b2)
    # IEEE sqrt and division, as torch's kernel: the default approximate ones drift by ulps
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    w = w - tl.div_rn(lr, bc1) * tl.div_rn(m, denom)
    tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)
    if MASTER:
        tl.store(w_ptr + offs, w, mask=mask)
    tl.store(p_ptr + offs, w.to(p_ptr.dtype.element_ty), mask=mask)


class AdamBucket:
    """The launch plan of one bucket: chunk table and pointer table, rebuilt when params change."""

    def __init__(self, params, device):
        self.params = list(params)
        self.numel = upload(torch.tensor([p.numel() for p in params], dtype=torch.int64), device)
        self.block, self.warps = BLOCK, WARPS  # the chunk table depends on them
        self.chunks = program_table([-(-p.numel() // BLOCK) for p in params], device)
        self.table = PointerTable(device)
        self.device = device
        self._log_betas = (None, None)

    def log_betas(self, b1, b2):
        """fp64 [log b1, log b2] on the device, rebuilt only when the betas change."""
        if self._log_betas[0] != (b1, b2):
            t = torch.tensor([math.log(b1), math.log(b2)], dtype=torch.float64)
            self._log_betas = ((b1, b2), upload(t, self.device))
        return self._log_betas[1]

    def step(self, grads, exp_avgs, exp_avg_sqs, masters, steps, lr, b1, b2, eps, wd, adam_w_mode, skip=None):
        """`skip`: None, or a 0-dim float32 device tensor, 1.0 to leave everything as it is."""
        n = len(self.params)
        advance_steps(steps, skip)
        master = masters is not None
        tab = self.table.update(self.params + grads + exp_avgs + exp_avg_sqs
                                + (masters if master else self.params) + steps)
        aligned = self.table.aligned()
        flag = skip if skip is not None else self.numel  # any pointer: never read unless SKIPPABLE
        _adam_kernel[(self.chunks.shape[0],)](
            tab, self.numel, self.chunks, self.log_betas(b1, b2), flag, n, lr, b1, b2, eps, wd,
            P_KIND=KIND[self.params[0].dtype], G_KIND=KIND[grads[0].dtype], S_KIND=KIND[exp_avgs[0].dtype],
            MASTER=master, ADAMW=adam_w_mode, ALIGNED=aligned, SKIPPABLE=skip is not None, BLOCK=self.block,
            num_warps=self.warps)
