"""CAME8Bit on DeepSpeed's flat partitions (ZeRO-1/2/3, and the bf16/fp16 wrappers that flatten).

DeepSpeed hands the optimizer one flat fp32 tensor per group (ZeRO-3: per sub-group). `bind` reads
from the engine's optimizer which piece of which weight each flat tensor holds (stages 1-2 and
BF16_Optimizer: the parameters' `_hp_mapping`; ZeRO-3: each parameter's `partition_numel()` in
`fp16_groups[sub_group]` order; the unpartitioned FP16_Optimizer: its groups flattened in order) and
gathers every rank's pieces once, so that each rank knows where every weight is cut.

A weight held whole by a rank (most of them at stages 1-2) is stepped as in one process, through
views of the flat tensors (so the Triton buckets run on CUDA). A weight cut across ranks is stepped
by `step_split` in torch, with the whole weight's statistics:
  1. local partial sums of g^2 + eps1 over the rows and columns the piece touches, the parameter's
     square sum, and per matrix the sum of the new row EMA (linear in the old rows the rank owns and
     in the sum of g^2): one all-reduce (SUM) over every cut weight of the step;
  2. with the factors, U = g r c; the residual statistics come from the sums of d^2, d U, U^2 with
     d = U / s' - m (s' last step's clip scale, as the Triton kernels do): one all-reduce (SUM);
  3. the momentum, and the 8-bit absmax of the blocks that straddle a cut: one all-reduce (MAX) of
     those few blocks.
Only the rows and 8-bit blocks that straddle a cut, and the columns, are communicated: a few floats
per cut weight. State per piece: the codes of its elements, the scales of the blocks it touches, the
rows it touches and all columns (fp32).

State lives under the flat tensor as {"came": {parameter name: the piece's state}}; a piece's state
also records where it sits ("frag_start", "frag_numel", "block_size"), so DeepSpeed's files can be
turned back into the whole tensors of every other strategy (`full_state_from_pieces`)."""
import math

import torch
import torch.distributed as dist

from .kernels import came_torch, qmap
from .kernels.came_torch import commit_, ema, factored_view_shape

META_KEYS = ("frag_start", "frag_numel", "block_size")


class Piece:
    """One weight's piece in one flat partition, and how the whole weight is cut across ranks."""

    def __init__(self, name, shape, flat_offset, start, numel, cuts):
        self.name, self.shape = name, tuple(shape)
        self.total = math.prod(self.shape)
        self.flat_offset, self.start, self.numel = flat_offset, start, numel
        self.cuts = sorted(cuts)  # element offsets inside the weight where a rank's piece begins
        self.whole = not self.cuts
        fshape = factored_view_shape(self.shape)
        if fshape is None:
            self.B = self.R = self.C = None
        else:
            self.C, self.R = fshape[-1], fshape[-2]
            self.B = math.prod(fshape[:-2])
        self.fshape = fshape

    def view(self, flat):
        """The piece inside a flat tensor (its parameter, or its gradient): whole weights in their shape."""
        t = flat.narrow(0, self.flat_offset, self.numel)
        return t.view(self.shape) if self.whole else t

    # global facts (equal on every rank): what the collectives carry
    def shared_rows(self):
        if self.fshape is None:
            return []
        return sorted({c // self.C for c in self.cuts if c % self.C})

    def shared_blocks(self, block_size):
        return sorted({c // block_size for c in self.cuts if c % block_size})


class FlatLayout:
    """What one flat tensor holds: this rank's whole weights, and every weight cut across ranks in
    this flat's group (the same list, in the same order, on every rank; `numel` 0 where this rank
    holds none of it)."""

    def __init__(self, whole, cut, process_group):
        self.whole, self.cut, self.group = whole, cut, process_group


def _pieces_of(wrapper, names):
    """[(flat tensor, process group, [(name, shape, flat offset, start, numel)])] for this rank."""
    out = []
    if hasattr(wrapper, "fp32_partitioned_groups_flat"):  # ZeRO-3: sub-groups, each parameter cut evenly
        for s, flat in enumerate(wrapper.fp32_partitioned_groups_flat):
            group = wrapper.sub_group_process_groups[s]
            rank = dist.get_rank(group=group)
            entries, off = [], 0
            for p in wrapper.fp16_groups[s]:
                pn = p.partition_numel()
                start = rank * pn
                numel = max(0, min(pn, p.ds_numel - start))
                if numel > 0:
                    entries.append((names[id(p)], tuple(p.ds_shape), off, start, numel))
                off += pn
            if off != flat.numel():
                raise RuntimeError(f"CAME8Bit: ZeRO-3 sub-group {s} holds {flat.numel()} elements, its "
                                   f"parameters' partitions {off}: unknown layout")
            out.append((flat, group, entries))
        return out
    if hasattr(wrapper, "single_partition_of_fp32_groups"):  # ZeRO-1/2
        flats, lps = wrapper.single_partition_of_fp32_groups, wrapper.bit16_groups
        groups = wrapper.real_dp_process_group
    elif hasattr(wrapper, "fp32_groups_flat_partition"):  # BF16_Optimizer
        flats, lps = wrapper.fp32_groups_flat_partition, wrapper.bf16_groups
        groups = [wrapper.dp_process_group] * len(flats)
    elif hasattr(wrapper, "fp32_groups_flat"):  # FP16_Optimizer (bf16/fp16 at stage 0): whole, in order
        for flat, params in zip(wrapper.fp32_groups_flat, wrapper.fp16_groups):
            entries, off = [], 0
            for p in params:
                entries.append((names[id(p)], tuple(p.shape), off, 0, p.numel()))
                off += p.numel()
            out.append((flat, None, entries))
        return out
    else:
        raise RuntimeError(f"CAME8Bit: unknown DeepSpeed optimizer wrapper {type(wrapper).__name__}")
    for flat, params, group in zip(flats, lps, groups):
        entries = []
        for p in params:
            m = getattr(p, "_hp_mapping", None)
            if m is None:
                continue
            entries.append((names[id(p)], tuple(p.shape), m.hp_fragment_address.start,
                            m.lp_fragment_address.start, m.lp_fragment_address.numel))
        out.append((flat, group, entries))
    return out


def bind(wrapper, named_parameters):
    """{id(flat tensor): FlatLayout} from DeepSpeed's optimizer `wrapper` (a collective: every rank's
    pieces are gathered once)."""
    names = {id(p): n for n, p in named_parameters}
    if isinstance(wrapper, torch.optim.Optimizer):  # ZeRO-0 in fp32: the engine steps our optimizer itself
        return {}
    found = _pieces_of(wrapper, names)
    mine = [(k, name, shape, start, numel) for k, (_, _, entries) in enumerate(found)
            for name, shape, _, start, numel in entries]
    everyone = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    cuts, order = {}, {}
    for rank_pieces in everyone:
        for k, name, shape, start, numel in rank_pieces:
            cuts.setdefault(name, set())
            order.setdefault(k, {}).setdefault(name, shape)
            if start > 0:
                cuts[name].add(start)
            if start + numel < math.prod(shape):
                cuts[name].add(start + numel)
    layouts = {}
    for k, (flat, group, entries) in enumerate(found):
        own = {name: Piece(name, shape, off, start, numel, cuts[name])
               for name, shape, off, start, numel in entries}
        whole = [pc for pc in own.values() if pc.whole]
        cut = [own.get(name) or Piece(name, shape, 0, 0, 0, cuts[name])
               for name, shape in order.get(k, {}).items() if cuts[name]]
        layouts[id(flat)] = FlatLayout(whole, cut, group)
        layouts[id(flat)].flat = flat
    return layouts


# -- state ------------------------------------------------------------------------------------
def init_piece_state(pc, flat, block_size, min_8bit_size):
    """A cut weight's piece: fp32 statistics of the rows it touches and of every column, codes of its
    elements and the scales of the blocks it touches."""
    dev = flat.device
    f32 = dict(dtype=torch.float32, device=dev)
    st = {"step": torch.zeros((), **f32), "RMS": torch.zeros((), **f32),
          "frag_start": pc.start, "frag_numel": pc.numel, "block_size": block_size}
    if pc.fshape is None:
        st["exp_avg_sq"] = torch.zeros(pc.numel, **f32)
        st["exp_avg"] = torch.zeros(pc.numel, **f32)
        return st
    i0, i1 = pc.start // pc.C, (pc.start + pc.numel - 1) // pc.C
    for kind in ("sq", "res"):
        st[f"exp_avg_{kind}_row"] = torch.zeros(i1 - i0 + 1, **f32)
        st[f"exp_avg_{kind}_col"] = torch.zeros(pc.B, pc.C, **f32)
    st["clip_scale"] = torch.ones((), **f32)
    if pc.total > min_8bit_size:
        b0, b1 = pc.start // block_size, (pc.start + pc.numel - 1) // block_size
        st["exp_avg_codes"] = torch.full((pc.numel,), qmap.ZERO_CODE, dtype=torch.uint8, device=dev)
        st["exp_avg_scales"] = torch.zeros(b1 - b0 + 1, **f32)
    else:
        st["exp_avg"] = torch.zeros(pc.numel, **f32)
    return st


def piece_state_from_full(full, pc, flat, block_size, min_8bit_size):
    """The piece of a whole tensor's state (any strategy's, by name) that this rank keeps."""
    fresh = init_piece_state(pc, flat, block_size, min_8bit_size)
    full = {k: (v.to(flat.device) if torch.is_tensor(v) else v) for k, v in full.items()}
    a, n = pc.start, pc.numel
    for key in ("step", "RMS", "clip_scale"):
        if key in full and key in fresh:
            fresh[key].copy_(torch.as_tensor(full[key]).reshape(()))
    for key in ("exp_avg_sq",):
        if key in full and key in fresh:
            fresh[key].copy_(full[key].reshape(-1)[a:a + n])
    if pc.fshape is not None:
        i0 = a // pc.C
        for kind in ("sq", "res"):
            rows = full[f"exp_avg_{kind}_row"].reshape(-1)
            fresh[f"exp_avg_{kind}_row"].copy_(rows[i0:i0 + fresh[f"exp_avg_{kind}_row"].numel()])
            fresh[f"exp_avg_{kind}_col"].copy_(full[f"exp_avg_{kind}_col"].reshape(pc.B, pc.C))
    m = _full_momentum(full, block_size)
    if "exp_avg_codes" in fresh:
        if "exp_avg_codes" in full and full.get("block_size", block_size) == block_size:
            b0 = a // block_size
            fresh["exp_avg_codes"].copy_(full["exp_avg_codes"].reshape(-1)[a:a + n])
            fresh["exp_avg_scales"].copy_(full["exp_avg_scales"][b0:b0 + fresh["exp_avg_scales"].numel()])
        elif m is not None:
            codes, scales = qmap.quantize_blockwise(m.reshape(-1), block_size)
            b0 = a // block_size
            fresh["exp_avg_codes"].copy_(codes[a:a + n])
            fresh["exp_avg_scales"].copy_(scales[b0:b0 + fresh["exp_avg_scales"].numel()])
    elif m is not None:
        fresh["exp_avg"].copy_(m.reshape(-1)[a:a + n])
    return fresh


def _full_momentum(full, block_size):
    if "exp_avg" in full:
        return full["exp_avg"].float()
    if "exp_avg_codes" in full:
        return qmap.dequantize_blockwise(full["exp_avg_codes"], full["exp_avg_scales"], block_size)
    return None


def whole_state_from_full(full, view, block_size, min_8bit_size):
    """A whole weight's state as one process holds it (from any strategy's full state)."""
    st = {}
    came_torch.init_state(view, st, block_size, min_8bit_size)
    for key, value in full.items():
        if key in st and torch.is_tensor(value) and st[key].numel() == value.numel() \
                and st[key].dtype == value.dtype or (key in st and key in ("step", "RMS", "clip_scale")):
            st[key].copy_(torch.as_tensor(value).to(st[key].device, st[key].dtype).reshape(st[key].shape))
    m = _full_momentum(full, block_size)
    if m is not None and "exp_avg_codes" in st and "exp_avg_codes" not in full:
        codes, scales = qmap.quantize_blockwise(m.reshape(view.shape), block_size)
        st["exp_avg_codes"].copy_(codes)
        st["exp_avg_scales"].copy_(scales)
    elif m is not None and "exp_avg" in st and "exp_avg" not in full:
        st["exp_avg"].copy_(m.reshape(st["exp_avg"].shape))
    return st


def full_state_from_pieces(pieces, shape):
    """Whole-tensor state (one process's form) from the pieces every rank saved of one weight."""
    pieces = sorted(pieces, key=lambda s: s["frag_start"])
    total = math.prod(shape)
    if len(pieces) == 1 and pieces[0]["frag_numel"] == total:
        return {k: v for k, v in pieces[0].items() if k not in META_KEYS}
    fshape = factored_view_shape(shape)
    first = pieces[0]
    bs = first["block_size"]
    out = {k: first[k].clone() for k in ("step", "RMS", "clip_scale") if k in first}
    if fshape is None:
        for key in ("exp_avg_sq", "exp_avg"):
            out[key] = torch.cat([p[key] for p in pieces]).view(shape)
        return out
    C = fshape[-1]
    rows_total = total // C
    for kind in ("sq", "res"):
        rows = torch.zeros(rows_total, dtype=torch.float32)
        for p in pieces:
            i0 = p["frag_start"] // C
            r = p[f"exp_avg_{kind}_row"]
            rows[i0:i0 + r.numel()] = r
        out[f"exp_avg_{kind}_row"] = rows.view(fshape[:-1])
        out[f"exp_avg_{kind}_col"] = first[f"exp_avg_{kind}_col"].reshape(fshape[:-2] + fshape[-1:]).clone()
    if "exp_avg_codes" in first:
        out["exp_avg_codes"] = torch.cat([p["exp_avg_codes"] for p in pieces]).view(shape)
        scales = torch.zeros(qmap.num_blocks(total, bs), dtype=torch.float32)
        for p in pieces:
            b0 = p["frag_start"] // bs
            scales[b0:b0 + p["exp_avg_scales"].numel()] = p["exp_avg_scales"]
        out["exp_avg_scales"] = scales
    else:
        out["exp_avg"] = torch.cat([p["exp_avg"] for p in pieces]).view(shape)
    return out


# -- the step of cut weights ------------------------------------------------------------------
class _Slots:
    """A flat fp32 buffer reserved slot by slot, identically on every rank."""

    def __init__(self):
        self.size, self.parts = 0, []

    def take(self, n):
        off = self.size
        self.size += n
        return slice(off, off + n)


def _tile(values, pc, i0, nrow, fill=0.0):
    """A piece's elements placed in the [rows touched, C] tile of its weight (zeros elsewhere)."""
    t = torch.full((nrow * pc.C,), fill, dtype=torch.float32, device=values.device)
    a = pc.start - i0 * pc.C
    t[a:a + pc.numel] = values
    return t.view(nrow, pc.C)


def _col_partial(tile, batch, B):
    """Column sums of a tile per batch matrix: [B, C]."""
    out = torch.zeros(B, tile.shape[1], dtype=torch.float32, device=tile.device)
    return out.index_add_(0, batch, tile)


def _batch_sum(values, batch, B):
    out = torch.zeros(B, dtype=torch.float32, device=values.device)
    return out.index_add_(0, batch, values)


def step_split(work, group, process_group, block_size, min_8bit_size, dev, skip=None):
    """One CAME step of every cut weight in `work` ([(piece, param piece, grad piece, state)], in the
    same order and with the same cuts on every rank); p, g and state are None where a rank holds no
    piece of that weight."""
    b1, b2, b3 = group["betas"]
    eps1, eps2 = group["eps"]
    lr, wd, clip = group["lr"], group["weight_decay"], group["clip_threshold"]
    red1, red2, red3 = _Slots(), _Slots(), _Slots()
    plans = []
    for pc, p, g, st in work:
        plan = dict(pc=pc)
        if pc.fshape is None:
            plan["u2"], plan["psq"] = red1.take(1), red1.take(1)
        else:
            plan["col"], plan["rows"] = red1.take(pc.B * pc.C), red1.take(len(pc.shared_rows()))
            plan["rowtot"], plan["psq"] = red1.take(pc.B), red1.take(1)
            plan["col3"], plan["rows3"] = red2.take(3 * pc.B * pc.C), red2.take(3 * len(pc.shared_rows()))
            plan["restot"], plan["dxq"] = red2.take(pc.B), red2.take(3 * pc.B)
            quant = pc.total > min_8bit_size
            plan["blocks"] = pc.shared_blocks(block_size) if quant else []
        plans.append(plan)
    buf1 = torch.zeros(red1.size, dtype=torch.float32, device=dev)
    ctx = []
    for plan, (pc, p, g, st) in zip(plans, work):
        c = {}
        ctx.append(c)
        if st is None:
            continue
        p32, g32 = p.float(), g.float()
        c["p32"], c["g"] = p32, g32
        buf1[plan["psq"]] = p32.square().sum()
        if pc.fshape is None:
            v_new = ema(st["exp_avg_sq"], g32 * g32 + eps1, b2)
            c["v_new"] = v_new
            c["u"] = v_new.rsqrt() * g32
            buf1[plan["u2"]] = c["u"].square().sum()
            continue
        C, R, B = pc.C, pc.R, pc.B
        i0, i1 = pc.start // C, (pc.start + pc.numel - 1) // C
        nrow = i1 - i0 + 1
        rows_idx = torch.arange(i0, i1 + 1, device=dev)
        batch = rows_idx // R
        c.update(i0=i0, nrow=nrow, batch=batch)
        sq = _tile(g32 * g32 + eps1, pc, i0, nrow)
        c["sqrow"] = sq.sum(dim=1)
        buf1[plan["col"]] += _col_partial(sq, batch, B).reshape(-1)
        shared = pc.shared_rows()
        for k, r in enumerate(shared):
            if i0 <= r <= i1:
                buf1[plan["rows"].start + k] += c["sqrow"][r - i0]
        owned = rows_idx * C >= pc.start
        c["owned"] = owned
        old = torch.where(owned, st["exp_avg_sq_row"], 0.0)
        buf1[plan["rowtot"]] += b2 * _batch_sum(old, batch, B) + (1 - b2) / C * _batch_sum(c["sqrow"], batch, B)
    _all_reduce(buf1, process_group)

    buf2 = torch.zeros(red2.size, dtype=torch.float32, device=dev)
    for plan, c, (pc, p, g, st) in zip(plans, ctx, work):
        if st is None or pc.fshape is None:
            continue
        C, R, B = pc.C, pc.R, pc.B
        i0, nrow, batch = c["i0"], c["nrow"], c["batch"]
        rowsum = c["sqrow"].clone()
        for k, r in enumerate(pc.shared_rows()):
            if i0 <= r < i0 + nrow:
                rowsum[r - i0] = buf1[plan["rows"].start + k]
        row_new = ema(st["exp_avg_sq_row"], rowsum / C, b2)
        col_new = ema(st["exp_avg_sq_col"], buf1[plan["col"]].view(B, C) / R, b2)
        row_mean = buf1[plan["rowtot"]] / R
        r_factor = (row_new / row_mean[batch]).rsqrt()
        c_factor = col_new.rsqrt()
        gt = _tile(c["g"], pc, i0, nrow)
        u = r_factor[:, None] * c_factor[batch] * gt  # zero outside the piece
        m = _momentum(st, pc, i0, nrow)
        inside = _tile(torch.ones_like(c["g"]), pc, i0, nrow) > 0
        s_old = st["clip_scale"]
        d = torch.where(inside, u / s_old - m, 0.0)
        c.update(row_new=row_new, col_new=col_new, u=u, m=m, d=d, inside=inside)
        chans = (d * d, d * u, u * u)
        col3 = buf2[plan["col3"]].view(3, B, C)
        rows3 = buf2[plan["rows3"]].view(3, -1)
        dxq = buf2[plan["dxq"]].view(3, B)
        rsums = []
        for ch, t in enumerate(chans):
            col3[ch] += _col_partial(t, batch, B)
            rs = t.sum(dim=1)
            rsums.append(rs)
            dxq[ch] += _batch_sum(rs, batch, B)
            for k, r in enumerate(pc.shared_rows()):
                if i0 <= r < i0 + nrow:
                    rows3[ch, k] += rs[r - i0]
        c["rsums"] = rsums
        old = torch.where(c["owned"], st["exp_avg_res_row"], 0.0)
        buf2[plan["restot"]] += _batch_sum(old, batch, B)
    if red2.size:
        _all_reduce(buf2, process_group)

    # momentum and its 8-bit blocks: the absmax of blocks that straddle a cut is reduced (MAX)
    red3_plan = [plan.get("blocks", []) for plan in plans]
    nshared = sum(len(blocks) for blocks in red3_plan)
    for plan, c, (pc, p, g, st) in zip(plans, ctx, work):
        if st is None:
            continue
        if pc.fshape is None:
            n = pc.total
            s = (buf1[plan["u2"]] / n).sqrt().div(clip).clamp(min=1.0)
            m_new = ema(st["exp_avg"], c["u"] / s, b1)
            c.update(m_new=m_new, update=m_new)
            continue
        C, R, B = pc.C, pc.R, pc.B
        i0, nrow, batch = c["i0"], c["nrow"], c["batch"]
        dxq = buf2[plan["dxq"]].view(3, B)
        q_total = dxq[2].sum()
        s = (q_total / pc.total).sqrt().div(clip).clamp(min=1.0)
        delta = 1.0 / s - 1.0 / st["clip_scale"]
        d_r, x_r, q_r = [rs.clone() for rs in c["rsums"]]
        rows3 = buf2[plan["rows3"]].view(3, -1)
        for k, r in enumerate(pc.shared_rows()):
            if i0 <= r < i0 + nrow:
                d_r[r - i0], x_r[r - i0], q_r[r - i0] = rows3[0, k], rows3[1, k], rows3[2, k]
        e_row = (d_r + 2 * delta * x_r + delta * delta * q_r).clamp(min=0)
        res_row_new = ema(st["exp_avg_res_row"], b1 * b1 * e_row / C + eps2, b3)
        col3 = buf2[plan["col3"]].view(3, B, C)
        e_col = (col3[0] + 2 * delta * col3[1] + delta * delta * col3[2]).clamp(min=0)
        res_col_new = ema(st["exp_avg_res_col"], b1 * b1 * e_col / R + eps2, b3)
        e_tot = dxq[0] + 2 * delta * dxq[1] + delta * delta * dxq[2]
        res_tot = b3 * buf2[plan["restot"]] + (1 - b3) * (b1 * b1 * e_tot / C + R * eps2)
        res_mean = res_tot / R
        m_new = torch.where(c["inside"], c["m"] * b1 + c["u"] * ((1 - b1) / s), 0.0)
        res_approx = (res_row_new / res_mean[batch]).rsqrt()[:, None] * res_col_new.rsqrt()[batch]
        update = res_approx * m_new
        a = pc.start - i0 * C
        c.update(s=s, res_row_new=res_row_new, res_col_new=res_col_new,
                 m_new=m_new.reshape(-1)[a:a + pc.numel], update=update.reshape(-1)[a:a + pc.numel])
    buf3 = torch.zeros(nshared, dtype=torch.float32, device=dev)
    off = 0
    for blocks, c, (pc, p, g, st) in zip(red3_plan, ctx, work):
        if st is not None and "exp_avg_codes" in st:
            c["absmax"] = _local_absmax(c["m_new"], pc, block_size)
            b0 = pc.start // block_size
            for k, b in enumerate(blocks):
                if 0 <= b - b0 < c["absmax"].numel():
                    buf3[off + k] = c["absmax"][b - b0]
        off += len(blocks)
    _all_reduce(buf3, process_group, op=dist.ReduceOp.MAX)
    off = 0
    for blocks, plan, c, (pc, p, g, st) in zip(red3_plan, plans, ctx, work):
        if st is None:
            off += len(blocks)
            continue
        if pc.fshape is None:
            commit_(st["exp_avg_sq"], c["v_new"], skip)
            commit_(st["exp_avg"], c["m_new"], skip)
        else:
            commit_(st["exp_avg_sq_row"], c["row_new"], skip)
            commit_(st["exp_avg_sq_col"], c["col_new"], skip)
            commit_(st["exp_avg_res_row"], c["res_row_new"], skip)
            commit_(st["exp_avg_res_col"], c["res_col_new"], skip)
            commit_(st["clip_scale"], c["s"].reshape(()), skip)
            if "exp_avg_codes" in st:
                bs = block_size
                absmax = c["absmax"]
                b0 = pc.start // bs
                for k, b in enumerate(blocks):
                    if 0 <= b - b0 < absmax.numel():
                        absmax[b - b0] = buf3[off + k]
                commit_(st["exp_avg_codes"], _encode(c["m_new"], absmax, pc, bs), skip)
                commit_(st["exp_avg_scales"], absmax, skip)
            else:
                commit_(st["exp_avg"], c["m_new"], skip)
        off += len(blocks)
        commit_(st["RMS"], (buf1[plan["psq"]] / pc.total).sqrt().reshape(()), skip)
        commit_(st["step"], st["step"] + 1, skip)
        p32 = c["p32"]
        if wd != 0:
            p32 = p32.add(p32, alpha=-wd * lr)
        new_p = p32.add(c["update"], alpha=-lr)
        if skip is not None:
            new_p = torch.where(skip, p.float(), new_p)
        p.copy_(new_p)


def _all_reduce(buf, group, op=None):
    if buf.numel() and dist.is_initialized() and dist.get_world_size(group=group) > 1:
        if op is None:
            dist.all_reduce(buf, group=group)
        else:
            dist.all_reduce(buf, op=op, group=group)


def _block_index(pc, bs, device):
    idx = torch.arange(pc.start, pc.start + pc.numel, device=device)
    return idx // bs - pc.start // bs


def _momentum(st, pc, i0, nrow):
    """The piece's old momentum as a tile (fp32)."""
    if "exp_avg_codes" in st:
        bs = st["block_size"]  # the optimizer's, recorded at init
        codes = st["exp_avg_codes"]
        values = qmap.decode(codes) * st["exp_avg_scales"][_block_index(pc, bs, codes.device)]
    else:
        values = st["exp_avg"]
    return _tile(values, pc, i0, nrow)


def _local_absmax(m, pc, bs):
    nb = (pc.start + pc.numel - 1) // bs - pc.start // bs + 1
    out = torch.zeros(nb, dtype=torch.float32, device=m.device)
    return out.scatter_reduce_(0, _block_index(pc, bs, m.device), m.abs(), reduce="amax")


def _encode(m, absmax, pc, bs):
    inv = torch.where(absmax > 0, 1.0 / absmax, torch.zeros_like(absmax))
    return qmap.encode(m * inv[_block_index(pc, bs, m.device)])


def read_state_pieces(state_dir, names):
    """{name: whole-tensor state} from the per-rank optimizer files of a DeepSpeed checkpoint that
    CAME8Bit wrote in pieces, or None when its files hold no CAME8Bit pieces."""
    import glob
    import os
    paths = sorted(glob.glob(os.path.join(state_dir, "*optim_states.pt")))
    pieces = {}
    for path in paths:
        saved = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        inner = saved.get("base_optimizer_state") or saved.get("optimizer_state_dict")
        if not isinstance(inner, dict):
            return None
        for state in inner["state"].values():
            if "came" not in state:
                return None
            for name, piece in state["came"].items():
                pieces.setdefault(name, []).append(piece)
    if not pieces:
        return None
    out = {}
    for name, shape in names:
        if name not in pieces:
            raise FileNotFoundError(f"{state_dir}: no CAME8Bit state for parameter '{name}'")
        out[name] = full_state_from_pieces(pieces[name], shape)
    return out
