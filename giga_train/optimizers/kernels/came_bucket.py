"""Fused CAME over a bucket of tensors of one dtype: the launch sequence of came_triton's and
came_stats' kernels.

A bucket keeps its statistics in a few flat buffers (every tensor's row, column, code, scale and
step entries side by side) and rebinds each parameter's state entries as views of them, so a
whole step is ~14 launches whatever the number of tensors, with no host synchronisation.
Parameters and gradients are reached through device tables of their addresses.
"""
import torch

from . import came_stats as S
from . import came_triton as K
from . import qmap
from .came_torch import FRESH_VALUES, factored_view_shape
from .multi_tensor import KIND, OffsetTable, cdiv1, cumsum0, segments

# Launch configuration: the fastest of bench/optimizers.py --tune on the H200 (bench/RESULTS.md)
BR, BC, RC = 8, 128, 512    # reduction passes: BR x BC register tile, RC rows per program
REDUCE_WARPS = 4
PREFETCH_REDUCE = True      # reduction passes load the next slab before working on the current
UPDATE_WARPS = 8
UPDATE_NB = 16              # 8-bit blocks per update program (consecutive, one tensor)
PREFETCH_UPDATE = True      # the update loads the next block before working on the current
SMALL_BLOCK = 1024
VEC_BLOCK = 1024
VECTOR_MAX_NUMEL = 1 << 16  # one program per unfactored tensor: keep those small
ALIGN = 16                  # element offsets in the flat buffers: lets loads vectorise


def kernel_block_size_ok(block_size):
    return 256 <= block_size <= 8192 and block_size & (block_size - 1) == 0


def factored_eligible(p, grad, block_size):
    shape = factored_view_shape(p.shape)
    return (shape is not None and len(shape) == 2 and p.is_contiguous() and grad.is_contiguous()
            and grad.shape == p.shape and 0 < p.numel() < 2 ** 31 and p.dtype in KIND
            and grad.dtype in KIND and kernel_block_size_ok(block_size))


def shard_group(p):
    """The shard group when a DTensor parameter can take a bucket on shards (FSDP2: dim-0 shards on
    one mesh dimension, a non-empty shard on every rank), else None. Decided from global facts only,
    so every rank of the group decides alike; the optimizer keeps the answer per parameter."""
    from .came_torch import Sharding
    try:
        sharding = Sharding(p)
    except ValueError:
        return None
    if len(sharding.groups) != 1 or len(sharding.placements) != 1 or p.dim() == 0:
        return None
    shape = factored_view_shape(p.shape)
    rows, world = (p.shape[0] if shape is None else shape[0]), sharding.shard_world
    if (world - 1) * -(-rows // world) >= rows:  # a rank would hold no rows
        return None
    return sharding.groups[0]


def vector_eligible(p, grad):
    return (p.dim() <= 1 and 0 < p.numel() <= VECTOR_MAX_NUMEL and p.is_contiguous()
            and grad.is_contiguous() and p.dtype in KIND and grad.dtype in KIND)


def padded(n):
    return -(-n // ALIGN) * ALIGN


def update_programs(nblocks, per_program, device):
    """int32 [#programs, 3]: (tensor, first block, count) with up to `per_program` blocks each."""
    rows = [(k, b, min(per_program, n - b)) for k, n in enumerate(nblocks) for b in range(0, n, per_program)]
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, 3).to(device)


def _grid(size):
    """Programs of the small kernels over `size` entries."""
    return (cdiv1(size, SMALL_BLOCK),)


class _StepArgs:
    """What the launches of one factored step read: the group's hyper-parameters, this step's pointer tables
    (aligned only when every tensor's column count is too) and the skip flag."""

    def __init__(self, bucket, grads, group, found_inf):
        self.group = group
        self.b1, self.b2, self.b3 = group["betas"]
        self.eps1, self.eps2 = group["eps"]
        self.pbase, self.ptab, self.gbase, self.gtab, aligned = bucket._tables(grads)
        self.aligned = aligned and bucket.cols_aligned
        self.flag = bucket._flag(found_inf)


class _Bucket:
    def __init__(self, params, positions, device):
        self.params = list(params)
        self.positions = list(positions)
        self.device = device
        self.ptab, self.gtab = OffsetTable(device), OffsetTable(device)
        self.no_flag = torch.zeros(1, dtype=torch.float32, device=device)

    def _bind(self, state, key, flat, offset, numel):
        """Copy state[key] into flat[offset:offset+numel] and make the state entry that view; a fresh
        entry (init_state's lazy meta tensor) is its starting value there, never allocated on its own."""
        old = state[key]
        view = flat[offset:offset + numel]
        if old.is_meta:
            view.fill_(FRESH_VALUES.get(key, 0))
        else:
            view.copy_(old.reshape(-1))
        state[key] = view.view(old.shape)

    def _tables(self, grads):
        """(param base, offsets, grad base, offsets, aligned): base pointer arguments + offset tables."""
        ptab, gtab = self.ptab.update(self.params), self.gtab.update(grads)
        return self.params[0], ptab, grads[0], gtab, self.ptab.aligned() and self.gtab.aligned()

    def _flag(self, found_inf):
        if found_inf is None:
            return self.no_flag
        if found_inf.device != self.device or found_inf.dtype != torch.float32:
            raise ValueError("CAME8Bit.found_inf must be a float32 tensor on the parameters' device")
        return found_inf


class FactoredBucket(_Bucket):
    """2-D weights (and 1x1 convs) of one dtype pair, 8-bit first moment or fp32."""

    def __init__(self, params, states, positions, block_size, quantized):
        dev = params[0].device
        super().__init__(params, positions, dev)
        self.states, self.block_size, self.quantized = states, block_size, quantized
        self.br, self.bc, self.rc = BR, BC, RC  # fixed at build: the scratch layout depends on them
        shapes = [factored_view_shape(p.shape) for p in params]
        rows, cols = [s[0] for s in shapes], [s[1] for s in shapes]
        numels = [r * c for r, c in shapes]
        nblocks = [qmap.num_blocks(n, block_size) for n in numels]
        col_blocks = [-(-c // BC) for c in cols]
        row_chunks = [-(-r // RC) for r in rows]
        row_off, self.nrows = cumsum0(rows)
        col_off, self.ncols = cumsum0(cols)
        col2_off, ncol2 = cumsum0([padded(2 * c) for c in cols])
        el_off, nel = cumsum0([padded(n) for n in numels])
        sc_off, self.nblocks = cumsum0(nblocks)
        rp_off, nrp = cumsum0([b * r for b, r in zip(col_blocks, rows)])
        cp_off, ncp = cumsum0([q * c for q, c in zip(row_chunks, cols)])
        f32 = dict(dtype=torch.float32, device=dev)
        self.row, self.col = torch.empty(self.nrows, **f32), torch.empty(self.ncols, **f32)
        self.res_row, self.res_col = torch.empty(self.nrows, **f32), torch.empty(self.ncols, **f32)
        self.mom = torch.empty(nel, dtype=torch.uint8 if quantized else torch.float32, device=dev)
        self.scales = torch.empty(self.nblocks if quantized else 1, **f32)
        n = len(params)
        self.rms, self.clip, self.steps = (torch.empty(n, **f32) for _ in range(3))
        for k, st in enumerate(states):
            self._bind(st, "exp_avg_sq_row", self.row, row_off[k], rows[k])
            self._bind(st, "exp_avg_res_row", self.res_row, row_off[k], rows[k])
            self._bind(st, "exp_avg_sq_col", self.col, col_off[k], cols[k])
            self._bind(st, "exp_avg_res_col", self.res_col, col_off[k], cols[k])
            if quantized:
                self._bind(st, "exp_avg_codes", self.mom, el_off[k], numels[k])
                self._bind(st, "exp_avg_scales", self.scales, sc_off[k], nblocks[k])
            else:
                self._bind(st, "exp_avg", self.mom, el_off[k], numels[k])
            self._bind(st, "RMS", self.rms, k, 1)
            self._bind(st, "clip_scale", self.clip, k, 1)
            self._bind(st, "step", self.steps, k, 1)
        meta = [[rows[k], cols[k], row_off[k], col_off[k], el_off[k], sc_off[k], rp_off[k], cp_off[k],
                 col_blocks[k], row_chunks[k], col2_off[k], *positions[k]] for k in range(n)]
        self.meta = torch.tensor(meta, dtype=torch.int64, device=dev)
        tiles = [(k, cb, rc) for k in range(n) for rc in range(row_chunks[k]) for cb in range(col_blocks[k])]
        self.tiles = torch.tensor(tiles, dtype=torch.int32).reshape(-1, 3).to(dev)
        self.tile_grid = (self.tiles.shape[0],)
        self.tile_args = dict(RC=self.rc, BR=self.br, BC=self.bc, PREFETCH=PREFETCH_REDUCE, num_warps=REDUCE_WARPS)
        self.pk = KIND[params[0].dtype]
        self.nb = UPDATE_NB
        self.progs = update_programs(nblocks, self.nb, dev)
        self.row_segs, self.block_segs = segments(rows, dev), segments(nblocks, dev)
        self.row_tid = torch.repeat_interleave(torch.arange(n, dtype=torch.int32),
                                               torch.tensor(rows)).to(dev)
        self.col_tid = torch.repeat_interleave(torch.arange(n, dtype=torch.int32),
                                               torch.tensor(cols)).to(dev)
        self.numel = torch.tensor(numels, **f32)
        self.cols_aligned = all(c % ALIGN == 0 for c in cols)
        self.wide = all(c >= block_size for c in cols)
        # _res_sums reads one block scale per row segment when no segment straddles two blocks
        self.scale_row = all(c % BC == 0 for c in cols) and block_size % BC == 0
        # scratch, reused every step: partial sums, raw sums, 1/sqrt of the statistics
        self.rowpart, self.colpart = torch.empty(3, max(nrp, 1), **f32), torch.empty(3, max(ncp, 1), **f32)
        self.rawrow, self.rawcol = torch.empty(3, self.nrows, **f32), torch.empty(3, self.ncols, **f32)
        self.rinv, self.rrinv = torch.empty(self.nrows, **f32), torch.empty(self.nrows, **f32)
        self.cinv2, self.rcinv2 = torch.zeros(ncol2, **f32), torch.zeros(ncol2, **f32)
        self.rowsum, self.qsum, self.ressum, self.delta = (torch.empty(n, **f32) for _ in range(4))
        self.psq = torch.empty(self.nblocks, **f32)

    def step(self, grads, group, found_inf=None):
        a = _StepArgs(self, grads, group, found_inf)
        n, nc = len(self.params), self.ncols
        # second moments: row/column EMAs of g^2 + eps1, their 1/sqrt and row totals
        self._square_sums(a)
        self._row_ema(a)
        S._ema_kernel[_grid(nc)](self.col, self.cinv2, self.colpart, self.col_tid, self.meta, a.flag, nc, a.b2,
                                 AXIS=1, BLOCK=SMALL_BLOCK)
        S._segsum_kernel[(n,)](self.row, self.row_segs, self.rowsum, BLOCK=SMALL_BLOCK)
        # residual statistics, and the clip scale s from sum U^2
        self._residual_sums(a)
        S._reduce_kernel[_grid(nc)](self.rawcol, self.colpart, self.col_tid, self.meta, nc, self.colpart.stride(0),
                                    self.rawcol.stride(0), AXIS=1, NCH=3, BLOCK=SMALL_BLOCK)
        S._segsum_kernel[(n,)](self.rawrow[2], self.row_segs, self.qsum, BLOCK=SMALL_BLOCK)
        self._clip(a)
        self._residual_emas(a)
        S._segsum_kernel[(n,)](self.res_row, self.row_segs, self.ressum, BLOCK=SMALL_BLOCK)
        # momentum, 8-bit codes and the parameters; then RMS(p) of the values before the update
        self._update(a)
        S._finish_kernel[(n,)](self.psq, self.block_segs, self.numel, self.rms, self.steps, a.flag, BLOCK=SMALL_BLOCK)

    # The launches both steps make (ShardedFactoredBucket's reduces across ranks between them).
    def _square_sums(self, a):
        """Per tile, row and column partial sums of g^2 + eps1 (rowpart, colpart)."""
        K._sq_sums_kernel[self.tile_grid](a.gbase, a.gtab, self.meta, self.tiles, self.rowpart, self.colpart, a.eps1,
                                          ALIGNED=a.aligned, **self.tile_args)

    def _row_ema(self, a):
        """The rows' EMA of g^2 + eps1 and its 1/sqrt (row, rinv) from the row partial sums."""
        S._ema_kernel[_grid(self.nrows)](self.row, self.rinv, self.rowpart, self.row_tid, self.meta, a.flag,
                                         self.nrows, a.b2, AXIS=0, BLOCK=SMALL_BLOCK)

    def _residual_sums(self, a):
        """Per tile, partial sums of d^2, d U, U^2 against last step's clip scale; the rows' reduced (rawrow)."""
        rp, cp = self.rowpart.stride(0), self.colpart.stride(0)
        K._res_sums_kernel[self.tile_grid](a.gbase, a.gtab, self.meta, self.tiles, self.rinv, self.cinv2, self.rowsum,
                                           self.clip, self.mom, self.scales, self.rowpart, self.colpart, rp, cp,
                                           ALIGNED=a.aligned, QUANT=self.quantized, SCALE_ROW=self.scale_row,
                                           BS=self.block_size, **self.tile_args)
        S._reduce_kernel[_grid(self.nrows)](self.rawrow, self.rowpart, self.row_tid, self.meta, self.nrows, rp,
                                            self.rawrow.stride(0), AXIS=0, NCH=3, BLOCK=SMALL_BLOCK)

    def _clip(self, a):
        """Each tensor's clip scale from its sum of U^2 (qsum), and the change of 1/s (delta)."""
        n = len(self.params)
        S._clip_kernel[_grid(n)](self.qsum, self.numel, self.clip, self.delta, a.flag, n, a.group["clip_threshold"],
                                 BLOCK=SMALL_BLOCK)

    def _residual_emas(self, a):
        """The residual's row and column EMAs and their 1/sqrt, from the raw sums (rawrow, rawcol)."""
        for dst, inv, raw, tid, size, axis in ((self.res_row, self.rrinv, self.rawrow, self.row_tid, self.nrows, 0),
                                               (self.res_col, self.rcinv2, self.rawcol, self.col_tid, self.ncols, 1)):
            S._res_ema_kernel[_grid(size)](dst, inv, raw, raw.stride(0), tid, self.delta, self.meta, a.flag, size, a.b3,
                                           a.b1 * a.b1, a.eps2, AXIS=axis, BLOCK=SMALL_BLOCK)

    def _update(self, a):
        """Momentum, 8-bit codes and parameters; each block's square sum of the parameter before it (psq)."""
        K._update_kernel[(self.progs.shape[0],)](
            a.pbase, a.ptab, a.gbase, a.gtab, self.meta, self.progs, self.rinv, self.cinv2, self.rowsum, self.clip,
            self.rrinv, self.rcinv2, self.ressum, self.mom, self.scales, self.psq, self.steps, a.flag, a.group["lr"],
            a.group["weight_decay"], a.b1, P_KIND=self.pk, ALIGNED=a.aligned, QUANT=self.quantized,
            WIDE=self.wide, BS=self.block_size, PREFETCH=PREFETCH_UPDATE and self.nb > 1, num_warps=UPDATE_WARPS)


class VectorBucket(_Bucket):
    """Small unfactored tensors (biases, norm weights): full second moment, fp32 momentum."""

    def __init__(self, params, states, positions):
        dev = params[0].device
        super().__init__(params, positions, dev)
        self.states = states
        numels = [p.numel() for p in params]
        off, total = cumsum0([padded(n) for n in numels])
        f32 = dict(dtype=torch.float32, device=dev)
        self.v, self.m = torch.empty(total, **f32), torch.empty(total, **f32)
        self.rms, self.steps = torch.empty(len(params), **f32), torch.empty(len(params), **f32)
        for k, st in enumerate(states):
            self._bind(st, "exp_avg_sq", self.v, off[k], numels[k])
            self._bind(st, "exp_avg", self.m, off[k], numels[k])
            self._bind(st, "RMS", self.rms, k, 1)
            self._bind(st, "step", self.steps, k, 1)
        self.vmeta = torch.tensor([[numels[k], off[k], *positions[k]] for k in range(len(params))],
                                  dtype=torch.int64, device=dev)

    def step(self, grads, group, found_inf=None):
        self._launch(grads, group, found_inf, self.no_flag, phase=0)

    def _launch(self, grads, group, found_inf, sums, phase):
        b1, b2, _ = group["betas"]
        pbase, ptab, gbase, gtab, aligned = self._tables(grads)
        pk = KIND[self.params[0].dtype]
        K._vector_kernel[(len(self.params),)](pbase, ptab, gbase, gtab, self.vmeta, self.v, self.m, self.rms, self.steps,
                                             self._flag(found_inf), sums, group["lr"], group["weight_decay"], b1,
                                             b2, group["eps"][0], group["clip_threshold"], P_KIND=pk,
                                             ALIGNED=aligned, BLOCK=VEC_BLOCK, PHASE=phase,
                                             num_warps=4)


class _OnShards:
    """What the buckets on FSDP2's DTensor shards share: state entries that stay DTensors (views of
    the flat buffers, so checkpoints reshard them as before) and sums over the shard group."""

    def _bind(self, state, key, flat, offset, numel):
        old = state[key]
        if not hasattr(old, "_local_tensor"):
            return super()._bind(state, key, flat, offset, numel)
        from torch.distributed.tensor import DTensor
        local = old._local_tensor
        view = flat[offset:offset + numel]
        view.copy_(local.reshape(-1))
        state[key] = DTensor.from_local(view.view(local.shape), old.device_mesh, old.placements, run_check=False,
                                        shape=old.shape, stride=old.stride())

    def _sum(self, buf):
        import torch.distributed as dist
        if self.world > 1:
            dist.all_reduce(buf, group=self.group)


class ShardedVectorBucket(_OnShards, VectorBucket):
    """VectorBucket on FSDP2's 1-D shards (biases, norm weights): each rank's elements are updated
    where they live; the clip and the RMS need the whole tensor's sums of u^2 and p^2, which cross
    ranks in one all-reduce for the bucket between the kernel's two phases."""

    def __init__(self, params, states, positions, global_numels, group):
        import torch.distributed as dist
        self.group = group
        self.world = dist.get_world_size(group=group)
        super().__init__(params, states, positions)
        n = len(params)
        # [sums of u^2 and p^2 per tensor (all-reduced each step) | each whole tensor's numel (fixed)]
        self.sums = torch.empty(3 * n, dtype=torch.float32, device=self.device)
        self.sums[2 * n:] = torch.tensor(global_numels, dtype=torch.float32)

    def step(self, grads, group, found_inf=None):
        self._launch(grads, group, found_inf, self.sums, phase=1)
        self._sum(self.sums[:2 * len(self.params)])
        self._launch(grads, group, found_inf, self.sums, phase=2)


class ShardedFactoredBucket(_OnShards, FactoredBucket):
    """FactoredBucket on FSDP2's dim-0 shards (DTensor local tensors): the same kernels on the local
    rows, with the whole weights' statistics. Rows are whole on a rank; what crosses ranks is summed
    in three all-reduces over the shard group for the whole bucket (not per tensor):
      A. column sums of g^2 + eps1 and each tensor's sum of the new row EMA;
      B. the residual's raw column sums (d^2, d U, U^2), each tensor's sum of U^2 (the clip) and the
         three raw totals with the old residual row sum (the residual row mean, by linearity);
      C. each tensor's square sum of the parameter (its RMS).
    The kernels divide by a tensor's local row count: sums over rows are rescaled by R_local/R
    before they reach them, so every mean is the whole tensor's."""

    def __init__(self, params, states, positions, block_size, quantized, global_rows, group):
        import torch.distributed as dist
        self.group = group
        self.world = dist.get_world_size(group=group)
        super().__init__(params, states, positions, block_size, quantized)
        dev = self.device
        f32 = dict(dtype=torch.float32, device=dev)
        rows = [factored_view_shape(p.shape)[0] for p in params]
        cols = [factored_view_shape(p.shape)[1] for p in params]
        self.R_global = torch.tensor(global_rows, **f32)
        self.row_ratio = torch.tensor([r / g for r, g in zip(rows, global_rows)], **f32)  # R_local / R
        self.col_ratio = self.row_ratio[self.col_tid.long()]
        self.numel = torch.tensor([g * c for g, c in zip(global_rows, cols)], **f32)
        self.cols_f = torch.tensor(cols, **f32)
        meta = self.meta.clone()
        col_off, _ = cumsum0(cols)
        meta[:, 7] = torch.tensor(col_off, dtype=torch.int64, device=dev)  # reduced columns: one partial each
        meta[:, 9] = 1
        self.meta_red = meta
        nc, n = self.ncols, len(params)
        self.factor_sums = torch.empty(nc + n, **f32)  # column sums, row-EMA totals: one all-reduce
        self.residual_sums = torch.empty(3 * nc + 4 * n, **f32)  # raw column sums, raw totals, old residual row totals
        self.param_square_sums = torch.empty(n, **f32)  # each parameter's square sum (its RMS)
        self.ones_segs = segments([1] * n, dev)

    def step(self, grads, group, found_inf=None):
        a = _StepArgs(self, grads, group, found_inf)
        b1, b3, eps2 = a.b1, a.b3, a.eps2
        n, nc = len(self.params), self.ncols
        cp = self.colpart.stride(0)
        A, B = self.factor_sums, self.residual_sums

        self._square_sums(a)
        self._row_ema(a)
        S._reduce_kernel[_grid(nc)](A, self.colpart, self.col_tid, self.meta, nc, cp, 0, AXIS=1, NCH=1,
                                    BLOCK=SMALL_BLOCK)
        # the row EMA is stored only when the step is not skipped: sum the value the kernels will use
        S._segsum_kernel[(n,)](self.row, self.row_segs, A[nc:], BLOCK=SMALL_BLOCK)
        self._sum(A)  # A: column sums, row-EMA totals
        A[:nc].mul_(self.col_ratio)  # the kernel divides by the local row count
        torch.mul(A[nc:], self.row_ratio, out=self.rowsum)
        S._ema_kernel[_grid(nc)](self.col, self.cinv2, A, self.col_tid, self.meta_red, a.flag, nc, a.b2,
                                 AXIS=1, BLOCK=SMALL_BLOCK)
        # residual raw sums against last step's clip scale
        old_res = B[3 * nc + 3 * n:]
        S._segsum_kernel[(n,)](self.res_row, self.row_segs, old_res, BLOCK=SMALL_BLOCK)
        self._residual_sums(a)
        S._reduce_kernel[_grid(nc)](B, self.colpart, self.col_tid, self.meta, nc, cp, nc, AXIS=1, NCH=3,
                                    BLOCK=SMALL_BLOCK)
        for ch in range(3):  # per tensor: sum of d^2, d U, U^2 over its local rows
            S._segsum_kernel[(n,)](self.rawrow[ch], self.row_segs, B[3 * nc + ch * n:3 * nc + (ch + 1) * n],
                                   BLOCK=SMALL_BLOCK)
        self._sum(B)  # B: raw column sums, raw totals, old residual row totals
        raw_col = B[:3 * nc].view(3, nc)
        self.rawcol.copy_(raw_col * self.col_ratio)
        tot = B[3 * nc:3 * nc + 3 * n].view(3, n)
        self.qsum.copy_(tot[2])
        self._clip(a)
        # the residual row total, from the raw totals (linear): b3 S_old + (1 - b3) (b1^2 e / C + R eps2)
        d = self.delta
        e = (tot[0] + 2 * d * tot[1] + d * d * tot[2]).clamp_(min=0)
        res_total = b3 * old_res + (1 - b3) * (b1 * b1 * e / self.cols_f + self.R_global * eps2)
        self._residual_emas(a)
        torch.mul(res_total, self.row_ratio, out=self.ressum)
        self._update(a)
        S._segsum_kernel[(n,)](self.psq, self.block_segs, self.param_square_sums, BLOCK=SMALL_BLOCK)
        self._sum(self.param_square_sums)  # all ranks' pieces
        S._finish_kernel[(n,)](self.param_square_sums, self.ones_segs, self.numel, self.rms, self.steps, a.flag,
                               BLOCK=SMALL_BLOCK)
