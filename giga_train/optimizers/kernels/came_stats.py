"""Small Triton kernels of the fused CAME step, on vectors of rows, columns or tensors: they finish
the statistics between came_triton's passes and leave 1/sqrt factors, so those passes only
multiply. Column factors are written twice over ([c, c] per tensor) so that _update reads the
columns of a block that wraps into the next row contiguously. FLAG (found_inf > 0) skips every
store to optimizer state (a uniform branch); scratch is written either way."""
import triton
import triton.language as tl

from .came_triton import MW


@triton.jit
def _partials(SRC, TID, META, offs, mask, AXIS: tl.constexpr):
    """Per row (AXIS 0) or column (AXIS 1) element of the bucket: its tensor, its index in that
    tensor, where its partial sums start, their stride and count, and the size along the other axis."""
    k = tl.load(TID + offs, mask=mask, other=0)
    R = tl.load(META + MW * k, mask=mask, other=1)
    C = tl.load(META + MW * k + 1, mask=mask, other=1)
    # rows: partials [#col blocks, R] at the row-part offset; columns: [#row chunks, C]
    local = offs - tl.load(META + MW * k + 2 + AXIS, mask=mask, other=0)
    base = SRC + tl.load(META + MW * k + 6 + AXIS, mask=mask, other=0) + local
    nparts = tl.load(META + MW * k + 8 + AXIS, mask=mask, other=0).to(tl.int32)
    if AXIS == 0:
        stride = R
        other = C
    else:
        stride = C
        other = R
    return k, local, base, stride, nparts, other


@triton.jit
def _store_inv(INV, META, k, offs, local, size, value, mask, AXIS: tl.constexpr):
    """1/sqrt factors: rows at their bucket index, columns twice at the tensor's doubled offset."""
    if AXIS == 0:
        tl.store(INV + offs, value, mask=mask)
    else:
        at = INV + tl.load(META + MW * k + 10, mask=mask, other=0) + local
        tl.store(at, value, mask=mask)
        tl.store(at + size, value, mask=mask)


@triton.jit
def _ema_kernel(DST, INV, SRC, TID, META, FLAG, n, beta, AXIS: tl.constexpr, BLOCK: tl.constexpr):
    """Second-moment EMA of rows or columns from the partial sums; INV = its 1/sqrt."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    k, local, base, stride, nparts, other = _partials(SRC, TID, META, offs, mask, AXIS)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for p in range(0, tl.max(nparts, axis=0)):
        total += tl.load(base + p * stride, mask=mask & (p < nparts), other=0.0)
    d = tl.load(DST + offs, mask=mask, other=1.0)
    d = d * beta + (total / other.to(tl.float32)) * (1.0 - beta)
    if tl.load(FLAG) <= 0.0:
        tl.store(DST + offs, d, mask=mask)
    _store_inv(INV, META, k, offs, local, stride, tl.math.rsqrt(d), mask, AXIS)


@triton.jit
def _reduce_kernel(DST, SRC, TID, META, n, SRC_STRIDE, DST_STRIDE, AXIS: tl.constexpr, NCH: tl.constexpr,
                   BLOCK: tl.constexpr):
    """DST[ch, e] = sum of the partials of row/column e, for NCH channels."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    _, _, base, stride, nparts, _ = _partials(SRC, TID, META, offs, mask, AXIS)
    for ch in tl.static_range(NCH):
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for p in range(0, tl.max(nparts, axis=0)):
            total += tl.load(base + ch * SRC_STRIDE + p * stride, mask=mask & (p < nparts), other=0.0)
        tl.store(DST + ch * DST_STRIDE + offs, total, mask=mask)


@triton.jit
def _segment_sum(SRC, SEGS, k, BLOCK: tl.constexpr):
    """The sum of SRC[SEGS[k]:SEGS[k+1]] (fixed order: deterministic)."""
    start = tl.load(SEGS + k)
    end = tl.load(SEGS + k + 1)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for o in range(start, end, BLOCK):
        idx = o + tl.arange(0, BLOCK)
        acc += tl.load(SRC + idx, mask=idx < end, other=0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def _segsum_kernel(SRC, SEGS, DST, BLOCK: tl.constexpr):
    """DST[k] = sum of SRC[SEGS[k]:SEGS[k+1]]."""
    k = tl.program_id(0)
    tl.store(DST + k, _segment_sum(SRC, SEGS, k, BLOCK))


@triton.jit
def _clip_kernel(QSUM, NUMEL, SCALE, DELTA, FLAG, n, clip, BLOCK: tl.constexpr):
    """s = max(1, rms(U)/clip) per tensor; DELTA = 1/s - 1/s' with s' last step's s (then SCALE = s)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.maximum(tl.sqrt(tl.load(QSUM + offs, mask=mask, other=0.0) /
                           tl.load(NUMEL + offs, mask=mask, other=1.0)) / clip, 1.0)
    s_prev = tl.load(SCALE + offs, mask=mask, other=1.0)
    tl.store(DELTA + offs, 1.0 / s - 1.0 / s_prev, mask=mask)
    if tl.load(FLAG) <= 0.0:
        tl.store(SCALE + offs, s, mask=mask)


@triton.jit
def _res_ema_kernel(DST, INV, RAW, RAW_STRIDE, TID, DELTA, META, FLAG, n, beta3, b1sq, eps2, AXIS: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Residual EMA from the three raw sums: mean (U/s - m_new)^2 = b1^2 (D + 2 delta X + delta^2 Q) / n;
    INV = its 1/sqrt."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    k = tl.load(TID + offs, mask=mask, other=0)
    other = tl.load(META + MW * k + 1 - AXIS, mask=mask, other=1).to(tl.float32)  # C for rows, R for cols
    d = tl.load(RAW + offs, mask=mask, other=0.0)
    x = tl.load(RAW + RAW_STRIDE + offs, mask=mask, other=0.0)
    q = tl.load(RAW + 2 * RAW_STRIDE + offs, mask=mask, other=0.0)
    delta = tl.load(DELTA + k, mask=mask, other=0.0)
    e = tl.maximum(d + 2.0 * delta * x + delta * delta * q, 0.0)
    res = (e * b1sq) / other + eps2
    new = tl.load(DST + offs, mask=mask, other=1.0) * beta3 + res * (1.0 - beta3)
    if tl.load(FLAG) <= 0.0:
        tl.store(DST + offs, new, mask=mask)
    local = offs - tl.load(META + MW * k + 2 + AXIS, mask=mask, other=0)
    size = tl.load(META + MW * k + AXIS, mask=mask, other=0)  # R for rows (unused), C for cols
    _store_inv(INV, META, k, offs, local, size, tl.math.rsqrt(new), mask, AXIS)


@triton.jit
def _finish_kernel(PSQ, SEGS, NUMEL, RMS, STEP, FLAG, BLOCK: tl.constexpr):
    """Per tensor: RMS of the parameter before the update (from _update's block sums), step += 1."""
    k = tl.program_id(0)
    total = _segment_sum(PSQ, SEGS, k, BLOCK)
    if tl.load(FLAG) <= 0.0:
        tl.store(RMS + k, tl.sqrt(total / tl.load(NUMEL + k)))
        tl.store(STEP + k, tl.load(STEP + k) + 1.0)
