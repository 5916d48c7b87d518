"""Triton kernels of the fused CAME step (the launch sequence is in came_bucket.py).

One launch covers every tensor of a bucket: programs look their tensor up in small int tables
(TILES, BLOCKS) and read parameter/gradient addresses from pointer tables. Per step the gradient
is read three times, the 8-bit momentum twice (plus one write), the parameter once:
  1. _sq_sums: per tile of BC columns x RC rows, row partial sums (per column block) and column
     partial sums (per row chunk) of g^2 + eps1. A tile accumulates columns in registers and
     reduces rows within a warp, so no reduction crosses warps inside the loop.
  2. _res_sums: U = g r c from the new factors; with m the old momentum and s' last step's clip
     scale, row/column partial sums of d^2, d*U, U^2 where d = U / s' - m. (U/s - m_new)^2 is
     b1^2 (d + (1/s - 1/s') U)^2, so the residual statistics need no extra pass over g.
  3. _update: momentum update, 8-bit re-quantization per block, parameter update.
The small kernels in between finish the statistics on vectors of rows and columns and leave
inverse square roots there, so the per-element passes only multiply.
"""
import triton
import triton.language as tl

from . import qmap
from .triton_ptr import table_ptr

MW = tl.constexpr(10)  # META row width: R, C, row, col, element, scale, row-part, col-part offsets, #col blocks, #row chunks

_DEC, _TOP_MID = qmap.kernel_constants()
assert len(_DEC) == 4, "the encode below is written for qmap's four decades"
_EDGE1, _EDGE2, _EDGE3 = (tl.constexpr(d["edge"]) for d in _DEC[1:])
_START0, _START1, _START2, _START3 = (tl.constexpr(float(d["start"])) for d in _DEC)
_COUNT0, _COUNT1, _COUNT2, _COUNT3 = (tl.constexpr(float(d["count"])) for d in _DEC)
_BINS0, _BINS1, _BINS2, _BINS3 = (tl.constexpr(d["count"] / 0.9) for d in _DEC)
_INVDEC0, _INVDEC1, _INVDEC2, _INVDEC3 = (tl.constexpr(d["inv_dec"]) for d in _DEC)
_BELOW0, _BELOW1, _BELOW2, _BELOW3 = (tl.constexpr(d["below"]) for d in _DEC)
_TOP = tl.constexpr(_TOP_MID)


@triton.jit
def _pos_value(pos):
    """Magnitude of dynamic-map position pos in [0, 128]: qmap.DECADES = (-3, 2), (-2, 8),
    (-1, 38), (0, 79), i.e. positions 1-2, 3-10, 11-48, 49-127 (same fp32 ops as qmap.py)."""
    e1 = pos >= 3
    e2 = pos >= 11
    e3 = pos >= 49
    start = tl.where(e3, 49, tl.where(e2, 11, tl.where(e1, 3, 1)))
    inv_count = tl.where(e3, 1.0 / 79, tl.where(e2, 1.0 / 38, tl.where(e1, 1.0 / 8, 1.0 / 2)))
    dec = tl.where(e3, 1.0, tl.where(e2, 0.1, tl.where(e1, 0.01, 0.001)))
    k = (pos - start).to(tl.float32)
    v = dec * (0.1 + 0.9 * ((k + 0.5) * inv_count))
    v = tl.where(pos <= 0, 0.0, v)
    v = tl.where(pos >= 128, 1.0, v)
    return v


@triton.jit
def _decode(code):
    pos = code - 127
    v = _pos_value(tl.abs(pos))
    return tl.where(pos < 0, -v, v)


@triton.jit
def _dequant(code, QMAP, TABLE: tl.constexpr):
    if TABLE:  # the 256 values stay in L1: one gather instead of ~20 integer/select operations
        v = tl.load(QMAP + code)
    else:
        v = _decode(code)
    return v


@triton.jit
def _encode(x):
    """Nearest code of x in [-1, 1]: within a decade the codes are midpoints of equal bins, so the
    bin index is the code; only a decade's first code needs a look below (to zero or the previous
    decade's last code), and the top one above (to +1.0). Equals torch.bucketize over the table's
    midpoints except for values within float rounding of a bin edge."""
    a = tl.abs(x)
    d1 = a >= _EDGE1
    d2 = a >= _EDGE2
    d3 = a >= _EDGE3
    start = tl.where(d3, _START3, tl.where(d2, _START2, tl.where(d1, _START1, _START0)))
    count = tl.where(d3, _COUNT3, tl.where(d2, _COUNT2, tl.where(d1, _COUNT1, _COUNT0)))
    bins = tl.where(d3, _BINS3, tl.where(d2, _BINS2, tl.where(d1, _BINS1, _BINS0)))
    inv_dec = tl.where(d3, _INVDEC3, tl.where(d2, _INVDEC2, tl.where(d1, _INVDEC1, _INVDEC0)))
    below = tl.where(d3, _BELOW3, tl.where(d2, _BELOW2, tl.where(d1, _BELOW1, _BELOW0)))
    k = tl.floor((a * inv_dec - 0.1) * bins)
    k = tl.minimum(tl.maximum(k, 0.0), count - 1.0)
    pos = start + k
    pos = tl.where((k == 0.0) & (a < below), pos - 1.0, pos)
    neg = x < 0
    pos = tl.where((pos == 127.0) & (a >= _TOP) & (x >= 0), 128.0, pos)  # the map has no -1.0
    p = pos.to(tl.int32)
    return tl.where(neg, 127 - p, 127 + p)


@triton.jit
def _store_param(ptr, offs, mask, value, seed, rnd_offs, KIND: tl.constexpr, STOCHASTIC: tl.constexpr):
    if KIND == 1:
        if STOCHASTIC:
            noise = (tl.randint(seed, rnd_offs) & 0xFFFF).to(tl.int32)
            bits = (value.to(tl.int32, bitcast=True) + noise) & -65536
            value = bits.to(tl.float32, bitcast=True)
    tl.store(ptr + offs, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile(META, TILES, pid):
    k = tl.load(TILES + 3 * pid)
    cb = tl.load(TILES + 3 * pid + 1)
    rc = tl.load(TILES + 3 * pid + 2)
    R = tl.load(META + MW * k).to(tl.int32)
    C = tl.load(META + MW * k + 1).to(tl.int32)
    return k, cb, rc, R, C


@triton.jit
def _sq_sums_kernel(G_TAB, META, TILES, ROWPART, COLPART, eps1, G_KIND: tl.constexpr, ALIGNED: tl.constexpr,
                    RC: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    k, cb, rc, R, C = _tile(META, TILES, tl.program_id(0))
    if ALIGNED:
        C = tl.multiple_of(C, 16)
    rp_off = tl.load(META + MW * k + 6)
    cp_off = tl.load(META + MW * k + 7)
    g_ptr = table_ptr(G_TAB, k, G_KIND, ALIGNED)
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < C
    r_end = tl.minimum(rc * RC + RC, R)
    acc = tl.zeros([BR, BC], dtype=tl.float32)
    for r0 in range(rc * RC, r_end, BR):
        rows = r0 + tl.arange(0, BR)
        rmask = rows < r_end
        mask = rmask[:, None] & cmask[None, :]
        g = tl.load(g_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        sq = tl.where(mask, g * g + eps1, 0.0)
        acc += sq
        tl.store(ROWPART + rp_off + cb * R + rows, tl.sum(sq, axis=1), mask=rmask)
    tl.store(COLPART + cp_off + rc * C + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def _res_sums_kernel(G_TAB, META, TILES, RINV, CINV, ROWSUM, SHAT, MOM, SCALES, QMAP, ROWPART, COLPART,
                     RP_STRIDE, CP_STRIDE, G_KIND: tl.constexpr, ALIGNED: tl.constexpr, QUANT: tl.constexpr,
                     TABLE: tl.constexpr, BS: tl.constexpr, RC: tl.constexpr, BR: tl.constexpr,
                     BC: tl.constexpr):
    k, cb, rc, R, C = _tile(META, TILES, tl.program_id(0))
    if ALIGNED:
        C = tl.multiple_of(C, 16)
    row_off = tl.load(META + MW * k + 2)
    col_off = tl.load(META + MW * k + 3)
    el_off = tl.load(META + MW * k + 4)
    sc_off = tl.load(META + MW * k + 5)
    rp_off = tl.load(META + MW * k + 6)
    cp_off = tl.load(META + MW * k + 7)
    g_ptr = table_ptr(G_TAB, k, G_KIND, ALIGNED)
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < C
    c = tl.load(CINV + col_off + cols, mask=cmask, other=0.0)
    sqrt_mean = tl.sqrt(tl.load(ROWSUM + k) / R.to(tl.float32))
    inv_shat = 1.0 / tl.load(SHAT + k)
    r_end = tl.minimum(rc * RC + RC, R)
    acc_d = tl.zeros([BR, BC], dtype=tl.float32)
    acc_x = tl.zeros([BR, BC], dtype=tl.float32)
    acc_q = tl.zeros([BR, BC], dtype=tl.float32)
    for r0 in range(rc * RC, r_end, BR):
        rows = r0 + tl.arange(0, BR)
        rmask = rows < r_end
        mask = rmask[:, None] & cmask[None, :]
        r = tl.load(RINV + row_off + rows, mask=rmask, other=0.0) * sqrt_mean
        flat = rows[:, None] * C + cols[None, :]
        g = tl.load(g_ptr + flat, mask=mask, other=0.0).to(tl.float32)
        u = (r[:, None] * c[None, :]) * g
        if QUANT:
            code = tl.load(MOM + el_off + flat, mask=mask, other=127).to(tl.int32)
            m = _dequant(code, QMAP, TABLE) * tl.load(SCALES + sc_off + flat // BS, mask=mask, other=0.0)
        else:
            m = tl.load(MOM + el_off + flat, mask=mask, other=0.0)
        d = tl.where(mask, u * inv_shat - m, 0.0)
        dd = d * d
        du = d * u
        uu = u * u
        acc_d += dd
        acc_x += du
        acc_q += uu
        rp = ROWPART + rp_off + cb * R + rows
        tl.store(rp, tl.sum(dd, axis=1), mask=rmask)
        tl.store(rp + RP_STRIDE, tl.sum(du, axis=1), mask=rmask)
        tl.store(rp + 2 * RP_STRIDE, tl.sum(uu, axis=1), mask=rmask)
    cp = COLPART + cp_off + rc * C + cols
    tl.store(cp, tl.sum(acc_d, axis=0), mask=cmask)
    tl.store(cp + CP_STRIDE, tl.sum(acc_x, axis=0), mask=cmask)
    tl.store(cp + 2 * CP_STRIDE, tl.sum(acc_q, axis=0), mask=cmask)


@triton.jit
def _partials(SRC, TID, META, offs, mask, AXIS: tl.constexpr):
    """Per row (AXIS 0) or column (AXIS 1) element of the bucket: where its partial sums start,
    their stride, count, and the tensor's size along the other axis."""
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
    return base, stride, nparts, other


@triton.jit
def _ema_kernel(DST, INVSQRT, SRC, TID, META, n, beta, AXIS: tl.constexpr, BLOCK: tl.constexpr):
    """Second-moment EMA of rows or columns from the partial sums; INVSQRT = its 1/sqrt."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    base, stride, nparts, other = _partials(SRC, TID, META, offs, mask, AXIS)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for p in range(0, tl.max(nparts, axis=0)):
        total += tl.load(base + p * stride, mask=mask & (p < nparts), other=0.0)
    d = tl.load(DST + offs, mask=mask, other=1.0)
    d = d * beta + (total / other.to(tl.float32)) * (1.0 - beta)
    tl.store(DST + offs, d, mask=mask)
    tl.store(INVSQRT + offs, tl.math.rsqrt(d), mask=mask)


@triton.jit
def _reduce_kernel(DST, SRC, TID, META, n, SRC_STRIDE, DST_STRIDE, AXIS: tl.constexpr, NCH: tl.constexpr,
                   BLOCK: tl.constexpr):
    """DST[ch, e] = sum of the partials of row/column e, for NCH channels."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    base, stride, nparts, _ = _partials(SRC, TID, META, offs, mask, AXIS)
    for ch in tl.static_range(NCH):
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for p in range(0, tl.max(nparts, axis=0)):
            total += tl.load(base + ch * SRC_STRIDE + p * stride, mask=mask & (p < nparts), other=0.0)
        tl.store(DST + ch * DST_STRIDE + offs, total, mask=mask)


@triton.jit(do_not_specialize=["seed"])
def _update_kernel(P_TAB, G_TAB, META, BLOCKS, RINV, CINV, ROWSUM, SCALE, RRINV, RCINV, RESSUM,
                   MOM, SCALES, QMAP, PSQ, lr, wd, b1, seed,
                   P_KIND: tl.constexpr, G_KIND: tl.constexpr, ALIGNED: tl.constexpr, QUANT: tl.constexpr,
                   TABLE: tl.constexpr, WIDE: tl.constexpr, STOCHASTIC: tl.constexpr, BS: tl.constexpr):
    pid = tl.program_id(0)  # one 8-bit block
    k = tl.load(BLOCKS + 2 * pid)
    b = tl.load(BLOCKS + 2 * pid + 1)
    R = tl.load(META + MW * k).to(tl.int32)
    C = tl.load(META + MW * k + 1).to(tl.int32)
    row_off = tl.load(META + MW * k + 2)
    col_off = tl.load(META + MW * k + 3)
    el_off = tl.load(META + MW * k + 4)
    sc_off = tl.load(META + MW * k + 5)
    p_ptr = table_ptr(P_TAB, k, P_KIND, ALIGNED)
    g_ptr = table_ptr(G_TAB, k, G_KIND, ALIGNED)
    start = b * BS
    t = tl.arange(0, BS)
    offs = start + t
    mask = offs < R * C
    # every load is issued before the first block reduction, so their latencies overlap
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if QUANT:
        code = tl.load(MOM + el_off + offs, mask=mask, other=127).to(tl.int32)
    else:
        m = tl.load(MOM + el_off + offs, mask=mask, other=0.0)
    rows_f = R.to(tl.float32)
    row_scale = tl.sqrt(tl.load(ROWSUM + k) / rows_f)
    res_scale = tl.sqrt(tl.load(RESSUM + k) / rows_f)
    if WIDE:  # rows are >= BS long: a block touches two rows at most, read their factors once
        i0 = start // C
        j = start - i0 * C + t
        wrap = j >= C
        j = tl.where(wrap, j - C, j)
        i1 = tl.minimum(i0 + 1, R - 1)
        rf = tl.where(wrap, tl.load(RINV + row_off + i1), tl.load(RINV + row_off + i0)) * row_scale
        rr = tl.where(wrap, tl.load(RRINV + row_off + i1), tl.load(RRINV + row_off + i0)) * res_scale
    else:
        i = offs // C
        j = offs - i * C
        rf = tl.load(RINV + row_off + i, mask=mask, other=0.0) * row_scale
        rr = tl.load(RRINV + row_off + i, mask=mask, other=0.0) * res_scale
    cf = tl.load(CINV + col_off + j, mask=mask, other=0.0)
    rc = tl.load(RCINV + col_off + j, mask=mask, other=0.0)
    tl.store(PSQ + pid, tl.sum(p * p, axis=0))
    u = ((rf * cf) * g) * (1.0 / tl.load(SCALE + k))
    if QUANT:
        m = _dequant(code, QMAP, TABLE) * tl.load(SCALES + sc_off + b)
    m = tl.where(mask, m * b1 + u * (1.0 - b1), 0.0)
    if QUANT:
        absmax = tl.max(tl.abs(m), axis=0)
        inv = tl.where(absmax > 0, 1.0 / absmax, 0.0)
        tl.store(MOM + el_off + offs, _encode(m * inv).to(tl.uint8), mask=mask)
        tl.store(SCALES + sc_off + b, absmax)
    else:
        tl.store(MOM + el_off + offs, m, mask=mask)
    update = (rr * rc) * m
    p = p + p * (-wd * lr)
    p = p - update * lr
    _store_param(p_ptr, offs, mask, p, seed, pid * BS + t, P_KIND, STOCHASTIC)


@triton.jit(do_not_specialize=["seed"])
def _vector_kernel(P_TAB, G_TAB, VMETA, V, M, RMS, lr, wd, b1, b2, eps1, clip, seed,
                   P_KIND: tl.constexpr, G_KIND: tl.constexpr, ALIGNED: tl.constexpr,
                   STOCHASTIC: tl.constexpr, BLOCK: tl.constexpr):
    """Unfactored CAME (1-D tensors): one program per tensor, two sweeps (the RMS clip needs the
    whole tensor before the momentum update)."""
    k = tl.program_id(0)
    n = tl.load(VMETA + 2 * k)
    off = tl.load(VMETA + 2 * k + 1)
    p_ptr = table_ptr(P_TAB, k, P_KIND, ALIGNED)
    g_ptr = table_ptr(G_TAB, k, G_KIND, ALIGNED)
    acc_u = tl.zeros([BLOCK], dtype=tl.float32)
    acc_p = tl.zeros([BLOCK], dtype=tl.float32)
    for o in range(0, n, BLOCK):
        offs = o + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + off + offs, mask=mask, other=1.0)
        v = v * b2 + (g * g + eps1) * (1.0 - b2)
        tl.store(V + off + offs, v, mask=mask)
        u = tl.math.rsqrt(v) * g
        acc_u += tl.where(mask, u * u, 0.0)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        acc_p += p * p
    nf = n.to(tl.float32)
    scale = tl.maximum(tl.sqrt(tl.sum(acc_u, axis=0) / nf) / clip, 1.0)
    tl.store(RMS + k, tl.sqrt(tl.sum(acc_p, axis=0) / nf))
    for o in range(0, n, BLOCK):
        offs = o + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + off + offs, mask=mask, other=1.0)
        u = (tl.math.rsqrt(v) * g) / scale
        m = tl.load(M + off + offs, mask=mask, other=0.0)
        m = m * b1 + u * (1.0 - b1)
        tl.store(M + off + offs, m, mask=mask)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        p = p + p * (-wd * lr)
        p = p - m * lr
        _store_param(p_ptr, offs, mask, p, seed, off + offs, P_KIND, STOCHASTIC)


@triton.jit
def _segsum_kernel(SRC, SEGS, DST, NUMEL, RMS: tl.constexpr, BLOCK: tl.constexpr):
    """DST[k] = sum of SRC[SEGS[k]:SEGS[k+1]] (fixed order: deterministic); sqrt(sum/NUMEL[k]) if RMS."""
    k = tl.program_id(0)
    start = tl.load(SEGS + k)
    end = tl.load(SEGS + k + 1)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for o in range(start, end, BLOCK):
        idx = o + tl.arange(0, BLOCK)
        acc += tl.load(SRC + idx, mask=idx < end, other=0.0)
    total = tl.sum(acc, axis=0)
    if RMS:
        total = tl.sqrt(total / tl.load(NUMEL + k))
    tl.store(DST + k, total)


@triton.jit
def _clip_kernel(QSUM, NUMEL, SCALE, DELTA, n, clip, BLOCK: tl.constexpr):
    """s = max(1, rms(U)/clip) per tensor; DELTA = 1/s - 1/s' with s' last step's s (then SCALE = s)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.maximum(tl.sqrt(tl.load(QSUM + offs, mask=mask, other=0.0) /
                           tl.load(NUMEL + offs, mask=mask, other=1.0)) / clip, 1.0)
    s_prev = tl.load(SCALE + offs, mask=mask, other=1.0)
    tl.store(DELTA + offs, 1.0 / s - 1.0 / s_prev, mask=mask)
    tl.store(SCALE + offs, s, mask=mask)


@triton.jit
def _res_ema_kernel(DST, INVSQRT, RAW, RAW_STRIDE, TID, DELTA, META, n, beta3, b1sq, eps2, AXIS: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Residual EMA from the three raw sums: mean (U/s - m_new)^2 = b1^2 (D + 2 delta X + delta^2 Q) / n;
    INVSQRT = its 1/sqrt."""
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
    tl.store(DST + offs, new, mask=mask)
    tl.store(INVSQRT + offs, tl.math.rsqrt(new), mask=mask)
