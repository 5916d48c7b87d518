"""Triton kernels of the fused CAME step: the three passes over the elements (the small kernels
between them are in came_stats.py, the launch sequence in came_bucket.py).

One launch covers every tensor of a bucket; what each pass computes and how it reads memory:
docs/architecture.md, "CAME8Bit's step"."""
import triton
import triton.language as tl

from . import came_codec as Q
from .triton_ptr import offset_ptr

# META row (int64) of tensor k: R, C, row, col, element, scale, row-part, col-part offsets,
# #col blocks, #row chunks, doubled-column offset, group index, param index
MW = tl.constexpr(13)


@triton.jit
def _meta(META, k, field, ALIGN: tl.constexpr = False):
    """Field of tensor k's META row. Alignment hints must be set here, on the load: one set on a
    helper's return value is dropped when the call is inlined."""
    v = tl.load(META + MW * k + field)
    if ALIGN:
        v = tl.multiple_of(v, 16)
    return v


@triton.jit
def _dim(META, k, field, ALIGN: tl.constexpr):
    v = tl.load(META + MW * k + field).to(tl.int32)
    if ALIGN:
        v = tl.multiple_of(v, 16)
    return v


@triton.jit
def _tile(META, TILES, pid, ALIGNED: tl.constexpr):
    k = tl.load(TILES + 3 * pid)
    cb = tl.load(TILES + 3 * pid + 1)
    rc = tl.load(TILES + 3 * pid + 2)
    return k, cb, rc, _dim(META, k, 0, False), _dim(META, k, 1, ALIGNED)


@triton.jit
def _span(cb, rc, R, C, RC: tl.constexpr, BC: tl.constexpr):
    """A tile's BC columns, which of them lie inside the tensor, and its rows [r_lo, r_end)."""
    cols = cb * BC + tl.arange(0, BC)
    r_lo = rc * RC
    return cols, cols < C, r_lo, tl.minimum(r_lo + RC, R)


@triton.jit
def _slab(ptr, rows, r_end, cols, cmask, C, other):
    mask = (rows < r_end)[:, None] & cmask[None, :]
    return tl.load(ptr + rows[:, None] * C + cols[None, :], mask=mask, other=other)


@triton.jit
def _sq_sums_kernel(G_BASE, G_OFF, META, TILES, ROWPART, COLPART, eps1, ALIGNED: tl.constexpr,
                    RC: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, PREFETCH: tl.constexpr):
    k, cb, rc, R, C = _tile(META, TILES, tl.program_id(0), ALIGNED)
    rp_off = _meta(META, k, 6)
    cp_off = _meta(META, k, 7)
    g_ptr = offset_ptr(G_BASE, G_OFF, k, ALIGNED)
    cols, cmask, r_lo, r_end = _span(cb, rc, R, C, RC, BC)
    ar = tl.arange(0, BR)
    if PREFETCH:
        g = _slab(g_ptr, r_lo + ar, r_end, cols, cmask, C, 0.0).to(tl.float32)
    else:
        g = tl.zeros([BR, BC], dtype=tl.float32)
    acc = tl.zeros([BR, BC], dtype=tl.float32)
    for r0 in range(r_lo, r_end, BR):
        rows = r0 + ar
        rmask = rows < r_end
        if PREFETCH:
            g_next = _slab(g_ptr, rows + BR, r_end, cols, cmask, C, 0.0).to(tl.float32)
        else:
            g = _slab(g_ptr, rows, r_end, cols, cmask, C, 0.0).to(tl.float32)
        sq = tl.where(rmask[:, None] & cmask[None, :], g * g + eps1, 0.0)
        acc += sq
        tl.store(ROWPART + rp_off + cb * R + rows, tl.sum(sq, axis=1), mask=rmask)
        if PREFETCH:
            g = g_next
    tl.store(COLPART + cp_off + rc * C + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def _res_loads(g_ptr, mom_ptr, rinv_ptr, sc_ptr, rows, r_end, cols, cmask, C, cb, QUANT: tl.constexpr,
               SCALE_ROW: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr):
    """What _res_sums reads for one slab of rows: g, the old momentum (codes, or fp32), the rows'
    1/sqrt factors and the codes' block scales (one per row when blocks hold whole BC-segments)."""
    rmask = rows < r_end
    g = _slab(g_ptr, rows, r_end, cols, cmask, C, 0.0).to(tl.float32)
    r = tl.load(rinv_ptr + rows, mask=rmask, other=0.0)
    if QUANT:
        q = _slab(mom_ptr, rows, r_end, cols, cmask, C, 127).to(tl.int32)
        if SCALE_ROW:
            sc = tl.load(sc_ptr + (rows * C + cb * BC) // BS, mask=rmask, other=0.0)[:, None]
        else:
            mask = rmask[:, None] & cmask[None, :]
            sc = tl.load(sc_ptr + (rows[:, None] * C + cols[None, :]) // BS, mask=mask, other=0.0)
    else:
        q = _slab(mom_ptr, rows, r_end, cols, cmask, C, 0.0)
        sc = tl.zeros([1, 1], dtype=tl.float32)
    return g, q, r, sc


@triton.jit
def _res_sums_kernel(G_BASE, G_OFF, META, TILES, RINV, CINV2, ROWSUM, SHAT, MOM, SCALES, ROWPART, COLPART,
                     RP_STRIDE, CP_STRIDE, ALIGNED: tl.constexpr, QUANT: tl.constexpr,
                     SCALE_ROW: tl.constexpr, BS: tl.constexpr, RC: tl.constexpr, BR: tl.constexpr,
                     BC: tl.constexpr, PREFETCH: tl.constexpr):
    k, cb, rc, R, C = _tile(META, TILES, tl.program_id(0), ALIGNED)
    el_off = _meta(META, k, 4, ALIGNED)
    rinv_ptr = RINV + _meta(META, k, 2)
    sc_ptr = SCALES + _meta(META, k, 5)
    rp_off = _meta(META, k, 6)
    cp_off = _meta(META, k, 7)
    g_ptr = offset_ptr(G_BASE, G_OFF, k, ALIGNED)
    mom_ptr = MOM + el_off
    cols, cmask, r_lo, r_end = _span(cb, rc, R, C, RC, BC)
    c = tl.load(CINV2 + _meta(META, k, 10, ALIGNED) + cols, mask=cmask, other=0.0)
    sqrt_mean = tl.sqrt(tl.load(ROWSUM + k) / R.to(tl.float32))
    inv_shat = 1.0 / tl.load(SHAT + k)
    ar = tl.arange(0, BR)
    if PREFETCH:
        first_end = r_end
    else:
        first_end = r_lo  # only defines the loop-carried values
    g, q, r, sc = _res_loads(g_ptr, mom_ptr, rinv_ptr, sc_ptr, r_lo + ar, first_end, cols, cmask, C, cb, QUANT,
                             SCALE_ROW, BS, BC)
    acc_d = tl.zeros([BR, BC], dtype=tl.float32)
    acc_x = tl.zeros([BR, BC], dtype=tl.float32)
    acc_q = tl.zeros([BR, BC], dtype=tl.float32)
    for r0 in range(r_lo, r_end, BR):
        rows = r0 + ar
        rmask = rows < r_end
        if PREFETCH:
            g_n, q_n, r_n, sc_n = _res_loads(g_ptr, mom_ptr, rinv_ptr, sc_ptr, rows + BR, r_end, cols, cmask, C,
                                             cb, QUANT, SCALE_ROW, BS, BC)
        else:
            g, q, r, sc = _res_loads(g_ptr, mom_ptr, rinv_ptr, sc_ptr, rows, r_end, cols, cmask, C, cb, QUANT,
                                     SCALE_ROW, BS, BC)
        u = ((r * sqrt_mean)[:, None] * c[None, :]) * g
        if QUANT:
            m = Q.decode(q) * sc
        else:
            m = q
        d = tl.where(rmask[:, None] & cmask[None, :], u * inv_shat - m, 0.0)
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
        if PREFETCH:
            g, q, r, sc = g_n, q_n, r_n, sc_n
    cp = COLPART + cp_off + rc * C + cols
    tl.store(cp, tl.sum(acc_d, axis=0), mask=cmask)
    tl.store(cp + CP_STRIDE, tl.sum(acc_x, axis=0), mask=cmask)
    tl.store(cp + 2 * CP_STRIDE, tl.sum(acc_q, axis=0), mask=cmask)


@triton.jit
def _max_and_sum(a_max, a_sum, b_max, b_sum):
    return tl.maximum(a_max, b_max), a_sum + b_sum


@triton.jit
def _block_loads(p_ptr, g_ptr, mom_ptr, sc_ptr, rinv_ptr, rrinv_ptr, cf_ptr, rc_ptr, b, valid, R, C, numel,
                 QUANT: tl.constexpr, WIDE: tl.constexpr, ALIGNED: tl.constexpr, BS: tl.constexpr):
    """Everything _update reads for 8-bit block b of a tensor (nothing when not `valid`)."""
    start = b * BS
    t = tl.arange(0, BS)
    offs = start + t
    mask = (offs < numel) & valid
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if QUANT:
        q = tl.load(mom_ptr + offs, mask=mask, other=127).to(tl.int32)
        sc = tl.load(sc_ptr + b, mask=valid, other=0.0)
    else:
        q = tl.load(mom_ptr + offs, mask=mask, other=0.0)
        sc = b.to(tl.float32) * 0.0  # unused: a scalar tensor, as loop-carried values must be
    if WIDE:  # rows are >= BS long: the block touches rows i0 and i0 + 1 at most
        i0 = start // C
        j0 = start - i0 * C
        if ALIGNED:
            j0 = tl.multiple_of(j0, 16)
        i1 = tl.minimum(i0 + 1, R - 1)
        wrap = (j0 + t) >= C
        rf = tl.where(wrap, tl.load(rinv_ptr + i1, mask=valid, other=0.0), tl.load(rinv_ptr + i0, mask=valid, other=0.0))
        rr = tl.where(wrap, tl.load(rrinv_ptr + i1, mask=valid, other=0.0),
                      tl.load(rrinv_ptr + i0, mask=valid, other=0.0))
        j = j0 + t  # the column vectors are stored twice over, so j needs no wrap
    else:
        i = offs // C
        j = offs - i * C
        rf = tl.load(rinv_ptr + i, mask=mask, other=0.0)
        rr = tl.load(rrinv_ptr + i, mask=mask, other=0.0)
    cf = tl.load(cf_ptr + j, mask=mask, other=0.0)
    rc = tl.load(rc_ptr + j, mask=mask, other=0.0)
    return p, g, q, sc, rf, rr, cf, rc


@triton.jit
def _update_kernel(P_BASE, P_OFF, G_BASE, G_OFF, META, PROGS, RINV, CINV2, ROWSUM, SCALE, RRINV, RCINV2, RESSUM, MOM, SCALES, PSQ,
                   STEP, FLAG, lr, wd, b1, P_KIND: tl.constexpr, ALIGNED: tl.constexpr,
                   QUANT: tl.constexpr, WIDE: tl.constexpr, BS: tl.constexpr, PREFETCH: tl.constexpr):
    """A program takes up to NB consecutive 8-bit blocks of one tensor (PROGS: tensor, first block,
    count): m = b1 m + (1 - b1) U / s, codes and absmax of m, p -= lr (wd p + R m)."""
    pid = tl.program_id(0)
    k = tl.load(PROGS + 3 * pid)
    b0 = tl.load(PROGS + 3 * pid + 1)
    nb = tl.load(PROGS + 3 * pid + 2)
    R = _dim(META, k, 0, False)
    C = _dim(META, k, 1, ALIGNED)
    row_off = _meta(META, k, 2)
    el_off = _meta(META, k, 4, ALIGNED)
    col2_off = _meta(META, k, 10, ALIGNED)
    sc_ptr = SCALES + _meta(META, k, 5)
    psq_ptr = PSQ + _meta(META, k, 5)
    p_ptr = offset_ptr(P_BASE, P_OFF, k, ALIGNED)
    g_ptr = offset_ptr(G_BASE, G_OFF, k, ALIGNED)
    mom_ptr = MOM + el_off
    rinv_ptr, rrinv_ptr = RINV + row_off, RRINV + row_off
    cf_ptr, rc_ptr = CINV2 + col2_off, RCINV2 + col2_off
    numel = R * C
    ok = tl.load(FLAG) <= 0.0  # found_inf: no store to state below happens (a uniform branch)
    if P_KIND == 1:
        key = Q.seed_key(STEP, k, _meta(META, k, 11), _meta(META, k, 12))
    else:
        key = 0
    rows_f = R.to(tl.float32)
    row_scale = tl.sqrt(tl.load(ROWSUM + k) / rows_f)
    res_scale = tl.sqrt(tl.load(RESSUM + k) / rows_f)
    inv_s = 1.0 / tl.load(SCALE + k)
    t = tl.arange(0, BS)
    if PREFETCH:
        first = nb > 0
    else:
        first = nb < 0  # only defines the loop-carried values
    p, g, q, sc, rf, rr, cf, rc = _block_loads(p_ptr, g_ptr, mom_ptr, sc_ptr, rinv_ptr, rrinv_ptr, cf_ptr, rc_ptr,
                                               b0, first, R, C, numel, QUANT, WIDE, ALIGNED, BS)
    for s in range(0, nb):
        b = b0 + s
        if PREFETCH:
            p_n, g_n, q_n, sc_n, rf_n, rr_n, cf_n, rc_n = _block_loads(
                p_ptr, g_ptr, mom_ptr, sc_ptr, rinv_ptr, rrinv_ptr, cf_ptr, rc_ptr, b + 1, s + 1 < nb, R, C,
                numel, QUANT, WIDE, ALIGNED, BS)
        else:
            p, g, q, sc, rf, rr, cf, rc = _block_loads(p_ptr, g_ptr, mom_ptr, sc_ptr, rinv_ptr, rrinv_ptr, cf_ptr,
                                                       rc_ptr, b, s < nb, R, C, numel, QUANT, WIDE, ALIGNED, BS)
        offs = b * BS + t
        mask = offs < numel
        u = (((rf * row_scale) * cf) * g) * inv_s
        if QUANT:
            m = Q.decode(q) * sc
        else:
            m = q
        m = tl.where(mask, m * b1 + u * (1.0 - b1), 0.0)
        if QUANT:
            absmax, psq = tl.reduce((tl.abs(m), p * p), 0, _max_and_sum)
            inv = tl.where(absmax > 0, 1.0 / absmax, 0.0)
            if ok:
                tl.store(mom_ptr + offs, Q.encode(m * inv).to(tl.uint8), mask=mask)
                tl.store(sc_ptr + b, absmax)
        else:
            psq = tl.sum(p * p, axis=0)
            if ok:
                tl.store(mom_ptr + offs, m, mask=mask)
        tl.store(psq_ptr + b, psq)
        update = ((rr * res_scale) * rc) * m
        p = p + p * (-wd * lr)
        p = p - update * lr
        if ok:
            Q.store_param(p_ptr, offs, mask, p, key, P_KIND)
        if PREFETCH:
            p, g, q, sc, rf, rr, cf, rc = p_n, g_n, q_n, sc_n, rf_n, rr_n, cf_n, rc_n


@triton.jit
def _vector_kernel(P_BASE, P_OFF, G_BASE, G_OFF, VMETA, V, M, RMS, STEP, FLAG, SUMS, lr, wd, b1, b2, eps1, clip,
                   P_KIND: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr, PHASE: tl.constexpr):
    """Unfactored CAME (1-D tensors): one program per tensor, two sweeps (the RMS clip needs the
    whole tensor before the momentum update); the program also advances the tensor's step.
    PHASE 0 does both sweeps. On shards (FSDP2) the whole tensor's sums cross ranks between them:
    PHASE 1 writes each tensor's local sums of u^2 and p^2 to SUMS[2k], SUMS[2k+1]; after they are
    all-reduced, PHASE 2 reads them (and the whole tensor's numel from SUMS[2n + k]) and updates."""
    k = tl.program_id(0)
    n = tl.load(VMETA + 4 * k)
    off = tl.load(VMETA + 4 * k + 1)
    ok = tl.load(FLAG) <= 0.0  # found_inf: no store to state below happens
    if P_KIND == 1:
        key = Q.seed_key(STEP, k, tl.load(VMETA + 4 * k + 2), tl.load(VMETA + 4 * k + 3))
    else:
        key = 0
    p_ptr = offset_ptr(P_BASE, P_OFF, k, ALIGNED)
    g_ptr = offset_ptr(G_BASE, G_OFF, k, ALIGNED)
    if PHASE == 2:
        sum_u = tl.load(SUMS + 2 * k)
        sum_p = tl.load(SUMS + 2 * k + 1)
        nf = tl.load(SUMS + 2 * tl.num_programs(0) + k)
    else:
        acc_u = tl.zeros([BLOCK], dtype=tl.float32)
        acc_p = tl.zeros([BLOCK], dtype=tl.float32)
        for o in range(0, n, BLOCK):
            offs = o + tl.arange(0, BLOCK)
            mask = offs < n
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            v = tl.load(V + off + offs, mask=mask, other=1.0)
            v = v * b2 + (g * g + eps1) * (1.0 - b2)
            u = tl.math.rsqrt(v) * g
            acc_u += tl.where(mask, u * u, 0.0)
            p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            acc_p += p * p
        sum_u = tl.sum(acc_u, axis=0)
        sum_p = tl.sum(acc_p, axis=0)
        nf = n.to(tl.float32)
    if PHASE == 1:
        tl.store(SUMS + 2 * k, sum_u)
        tl.store(SUMS + 2 * k + 1, sum_p)
    else:
        scale = tl.maximum(tl.sqrt(sum_u / nf) / clip, 1.0)
        if ok:
            tl.store(RMS + k, tl.sqrt(sum_p / nf))
        for o in range(0, n, BLOCK):
            offs = o + tl.arange(0, BLOCK)
            mask = offs < n
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            v = tl.load(V + off + offs, mask=mask, other=1.0)
            v = v * b2 + (g * g + eps1) * (1.0 - b2)  # recomputed: V is only written here
            u = (tl.math.rsqrt(v) * g) / scale
            m = tl.load(M + off + offs, mask=mask, other=0.0)
            m = m * b1 + u * (1.0 - b1)
            p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            p = p + p * (-wd * lr)
            p = p - m * lr
            if ok:
                tl.store(V + off + offs, v, mask=mask)
                tl.store(M + off + offs, m, mask=mask)
                Q.store_param(p_ptr, offs, mask, p, key, P_KIND)
        if ok:
            tl.store(STEP + k, tl.load(STEP + k) + 1.0)
