"""CAME8Bit on DeepSpeed's flat partitions (ZeRO-1/2/3, and the bf16/fp16 wrappers that flatten).

`bind` maps each flat partition back to the weight pieces it holds. Weights a rank holds whole step as in
one process; weights cut across ranks step together in `step_split`, with the whole weight's statistics, in
three all-reduces. A piece's state lives under its flat tensor and turns back into the whole tensors of every
other strategy (`full_state_from_pieces`). The algorithm: docs/architecture.md, "CAME8Bit's step"."""
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
    elif hasattr(wrapper, "fp32_groups"):  # FP16_UnfusedOptimizer: fp32 copies in their own shapes
        return []
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
    return layouts_of(_pieces_of(wrapper, names))


def layouts_of(found):
    """{id(flat): FlatLayout} from this rank's [(flat, process group, [(name, shape, flat offset,
    start, numel)])], every rank's pieces gathered (a collective on the default group)."""
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
    piece of that weight. Three all-reduces (SUM), whatever the number of weights."""
    b1, b2, b3 = group["betas"]
    eps1, eps2 = group["eps"]
    lr, wd, clip = group["lr"], group["weight_decay"], group["clip_threshold"]
    world = dist.get_world_size(group=process_group) if dist.is_initialized() else 1
    rank = dist.get_rank(group=process_group) if dist.is_initialized() else 0
    red1, red2, red3 = _Slots(), _Slots(), _Slots()
    plans = []
    for pc, p, g, st in work:
        plan = dict(pc=pc, psq=red1.take(1))
        if pc.fshape is None:
            plan["u2"] = red1.take(1)
        else:
            nsr = len(pc.shared_rows())
            plan["col"], plan["rows"], plan["rowtot"] = red1.take(pc.B * pc.C), red1.take(nsr), red1.take(pc.B)
            plan["u2"] = red2.take(1)
            plan["rcol"], plan["rrows"], plan["restot"] = red3.take(pc.B * pc.C), red3.take(nsr), red3.take(pc.B)
            plan["blocks"] = pc.shared_blocks(block_size) if pc.total > min_8bit_size else []
            plan["amax"] = red3.take(world * len(plan["blocks"]))
        plans.append(plan)

    # 1. second moments: partial row/column sums of g^2 + eps1, square sum of the parameter
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
            c["v_new"] = ema(st["exp_avg_sq"], g32 * g32 + eps1, b2)
            c["u"] = c["v_new"].rsqrt() * g32
            buf1[plan["u2"]] = c["u"].square().sum()
            continue
        C, R, B = pc.C, pc.R, pc.B
        i0, i1 = pc.start // C, (pc.start + pc.numel - 1) // C
        rows_idx = torch.arange(i0, i1 + 1, device=dev)
        batch = rows_idx // R
        c.update(i0=i0, nrow=i1 - i0 + 1, batch=batch, owned=rows_idx * C >= pc.start)
        sq = _tile(g32 * g32 + eps1, pc, i0, c["nrow"])
        c["sqrow"] = sq.sum(dim=1)
        buf1[plan["col"]] += _col_partial(sq, batch, B).reshape(-1)
        _add_shared(buf1, plan["rows"], pc, i0, c["sqrow"])
        old = torch.where(c["owned"], st["exp_avg_sq_row"], 0.0)
        buf1[plan["rowtot"]] += b2 * _batch_sum(old, batch, B) + (1 - b2) / C * _batch_sum(c["sqrow"], batch, B)
    _all_reduce(buf1, process_group)

    # 2. U = g r c with the whole weight's factors; its square sum for the clip
    buf2 = torch.zeros(red2.size, dtype=torch.float32, device=dev)
    for plan, c, (pc, p, g, st) in zip(plans, ctx, work):
        if st is None or pc.fshape is None:
            continue
        C, R, B = pc.C, pc.R, pc.B
        i0, nrow, batch = c["i0"], c["nrow"], c["batch"]
        rowsum = _with_shared(c["sqrow"], buf1, plan["rows"], pc, i0)
        c["row_new"] = ema(st["exp_avg_sq_row"], rowsum / C, b2)
        c["col_new"] = ema(st["exp_avg_sq_col"], buf1[plan["col"]].view(B, C) / R, b2)
        row_mean = buf1[plan["rowtot"]] / R
        r_factor = (c["row_new"] / row_mean[batch]).rsqrt()
        c["u"] = r_factor[:, None] * c["col_new"].rsqrt()[batch] * _tile(c["g"], pc, i0, nrow)  # 0 outside
        c["inside"] = _tile(torch.ones_like(c["g"]), pc, i0, nrow) > 0
        buf2[plan["u2"]] = c["u"].square().sum()
    _all_reduce(buf2, process_group)

    # 3. clip scale, momentum, residual statistics; the absmax of 8-bit blocks cut across ranks
    buf3 = torch.zeros(red3.size, dtype=torch.float32, device=dev)
    for plan, c, (pc, p, g, st) in zip(plans, ctx, work):
        if st is None:
            continue
        u2 = buf1[plan["u2"]] if pc.fshape is None else buf2[plan["u2"]]
        s = (u2 / pc.total).sqrt().div(clip).clamp(min=1.0)
        c["s"] = s
        if pc.fshape is None:
            c["m_new"] = ema(st["exp_avg"], c["u"] / s, b1)
            c["update"] = c["m_new"]
            continue
        C, R, B = pc.C, pc.R, pc.B
        i0, nrow, batch = c["i0"], c["nrow"], c["batch"]
        u = c["u"] / s
        m_new = torch.where(c["inside"], _momentum(st, pc, i0, nrow) * b1 + u * (1 - b1), 0.0)
        res = torch.where(c["inside"], (u - m_new).square() + eps2, 0.0)
        c["m_tile"], c["resrow"] = m_new, res.sum(dim=1)
        buf3[plan["rcol"]] += _col_partial(res, batch, B).reshape(-1)
        _add_shared(buf3, plan["rrows"], pc, i0, c["resrow"])
        old = torch.where(c["owned"], st["exp_avg_res_row"], 0.0)
        buf3[plan["restot"]] += b3 * _batch_sum(old, batch, B) + (1 - b3) / C * _batch_sum(c["resrow"], batch, B)
        a = pc.start - i0 * C
        c["m_new"] = m_new.reshape(-1)[a:a + pc.numel]
        if "exp_avg_codes" in st:
            c["absmax"] = _local_absmax(c["m_new"], pc, block_size)
            b0 = pc.start // block_size
            for k, blk in enumerate(plan["blocks"]):
                if 0 <= blk - b0 < c["absmax"].numel():
                    buf3[plan["amax"].start + k * world + rank] = c["absmax"][blk - b0]
    _all_reduce(buf3, process_group)

    for plan, c, (pc, p, g, st) in zip(plans, ctx, work):
        if st is None:
            continue
        if pc.fshape is None:
            commit_(st["exp_avg_sq"], c["v_new"], skip)
            commit_(st["exp_avg"], c["m_new"], skip)
        else:
            C, R, B = pc.C, pc.R, pc.B
            i0, batch = c["i0"], c["batch"]
            res_row_new = ema(st["exp_avg_res_row"], _with_shared(c["resrow"], buf3, plan["rrows"], pc, i0) / C, b3)
            res_col_new = ema(st["exp_avg_res_col"], buf3[plan["rcol"]].view(B, C) / R, b3)
            res_mean = buf3[plan["restot"]] / R
            res_approx = (res_row_new / res_mean[batch]).rsqrt()[:, None] * res_col_new.rsqrt()[batch]
            a = pc.start - i0 * C
            c["update"] = (res_approx * c["m_tile"]).reshape(-1)[a:a + pc.numel]
            commit_(st["exp_avg_sq_row"], c["row_new"], skip)
            commit_(st["exp_avg_sq_col"], c["col_new"], skip)
            commit_(st["exp_avg_res_row"], res_row_new, skip)
            commit_(st["exp_avg_res_col"], res_col_new, skip)
            commit_(st["clip_scale"], c["s"].reshape(()), skip)
            if "exp_avg_codes" in st:
                absmax = c["absmax"]
                b0 = pc.start // block_size
                amax = buf3[plan["amax"]].view(-1, world) if plan["blocks"] else None
                for k, blk in enumerate(plan["blocks"]):
                    if 0 <= blk - b0 < absmax.numel():
                        absmax[blk - b0] = amax[k].max()
                commit_(st["exp_avg_codes"], _encode(c["m_new"], absmax, pc, block_size), skip)
                commit_(st["exp_avg_scales"], absmax, skip)
            else:
                commit_(st["exp_avg"], c["m_new"], skip)
        commit_(st["RMS"], (buf1[plan["psq"]] / pc.total).sqrt().reshape(()), skip)
        commit_(st["step"], st["step"] + 1, skip)
        p32 = c["p32"]
        if wd != 0:
            p32 = p32.add(p32, alpha=-wd * lr)
        new_p = p32.add(c["update"], alpha=-lr)
        if skip is not None:
            new_p = torch.where(skip, p.float(), new_p)
        p.copy_(new_p)


def _add_shared(buf, slots, pc, i0, rowsums):
    """Add this rank's partial sums of the rows cut across ranks to their slots."""
    nrow = rowsums.numel()
    for k, r in enumerate(pc.shared_rows()):
        if i0 <= r < i0 + nrow:
            buf[slots.start + k] += rowsums[r - i0]


def _with_shared(rowsums, buf, slots, pc, i0):
    """Row sums with the rows cut across ranks replaced by their reduced totals."""
    out = rowsums.clone()
    for k, r in enumerate(pc.shared_rows()):
        if i0 <= r < i0 + out.numel():
            out[r - i0] = buf[slots.start + k]
    return out


def _all_reduce(buf, group):
    if buf.numel() and dist.is_initialized() and dist.get_world_size(group=group) > 1:
        dist.all_reduce(buf, group=group)


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


def read_state_pieces(rank_states, names, where):
    """{name: whole-tensor state} from the per-rank optimizer states of a DeepSpeed checkpoint (each file's
    `optimizer_state_dict`, read by the caller) that CAME8Bit wrote in pieces, or None when they hold no
    CAME8Bit pieces. `where`: the folder, for the message."""
    pieces = {}
    for saved in rank_states:
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
            raise FileNotFoundError(f"{where}: no CAME8Bit state for parameter '{name}'")
        out[name] = full_state_from_pieces(pieces[name], shape)
    return out
