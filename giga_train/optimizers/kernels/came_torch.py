"""CAME on one tensor in plain torch ops: the CPU path, the sharded (DTensor) path, and the reference
the Triton kernels are tested against.

The math is came-pytorch's (Luo et al. 2023), in fp32, with two storage choices of ours: the first
moment of big factored tensors lives as 8-bit codes (kernels/qmap.py), and 1x1 convolutions are
factored as the 2-D matrix they are. Under FSDP2 the tensors are dim-0 shards: every mean over
dim 0 and every RMS is summed across the shard group, so the result equals the unsharded one.
"""
import math

import torch
import torch.distributed as dist

from . import qmap, rounding
from .dtensors import is_dtensor, local  # noqa: F401  (came_torch.local: the callers' name for it)

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # torch without DTensor: nothing can be sharded
    DTensor = None


def factored_view_shape(shape):
    """Shape whose last two dims carry the row/column factors, or None when not factored.

    2-D weights as they are; 1x1 convs ([O, I, 1, 1]) as [O, I]; other tensors of 3+ dims as
    came-pytorch does (factors of the last two dims, batched over the leading ones)."""
    shape = tuple(shape)
    if len(shape) < 2:
        return None
    if len(shape) > 2 and all(d == 1 for d in shape[2:]):
        return shape[:2]
    return shape



class Sharding:
    """How a parameter's local tensor relates to the whole tensor (a no-op for plain tensors)."""

    def __init__(self, param):
        self.global_shape = tuple(param.shape)
        self.groups, self.mesh, self.placements, self.shard_world = [], None, None, 1
        if not is_dtensor(param):
            return
        self.mesh, self.placements = param.device_mesh, tuple(param.placements)
        for mesh_dim, pl in enumerate(self.placements):
            if isinstance(pl, Shard) and pl.dim == 0:
                self.groups.append(self.mesh.get_group(mesh_dim))
                self.shard_world *= self.mesh.size(mesh_dim)
            elif not isinstance(pl, Replicate):
                raise ValueError(f"CAME8Bit supports parameters sharded on dim 0 (FSDP2) or replicated;"
                                 f" got placements {self.placements}")

    @property
    def sharded(self):
        return bool(self.groups)

    def sum_(self, t):
        """In-place sum over the shard group(s): local partial sums become whole-tensor sums."""
        for group in self.groups:
            dist.all_reduce(t, group=group)
        return t

    def wrap(self, local_tensor, global_shape, row_sharded):
        """A state tensor in the parameter's form: a DTensor for DTensor params (sharded on dim 0
        when its dim 0 follows the parameter's rows, else replicated), the tensor itself otherwise."""
        if self.mesh is None:
            return local_tensor
        if row_sharded:
            placements = self.placements
        else:
            placements = tuple(Replicate() for _ in self.placements)
        stride = torch.empty(global_shape, device="meta").stride()
        return DTensor.from_local(local_tensor, self.mesh, placements, run_check=False,
                                  shape=torch.Size(global_shape), stride=stride)


def quantized_layout_ok(sharding, numel, block_size):
    """True when 8-bit blocks of the local shards line up with a dim-0 chunking of the scales, so
    the state reshards correctly at another world size (DCP). Plain tensors always qualify."""
    if not sharding.sharded:
        return True
    if len(sharding.groups) != 1:
        return False
    rows = sharding.global_shape[0]
    row_numel = numel // rows if rows else 0
    chunk_rows = -(-rows // sharding.shard_world)
    chunk_numel = chunk_rows * row_numel
    if chunk_numel % block_size:
        return False
    nb = qmap.num_blocks(numel, block_size)
    return -(-nb // sharding.shard_world) == chunk_numel // block_size


# Starting values of the state entries; every entry not named starts at zero.
FRESH_VALUES = {"exp_avg_codes": qmap.ZERO_CODE, "clip_scale": 1.0}


def init_state(param, state, block_size, min_8bit_size, lazy=False):
    """Fill an empty state dict for `param` (fp32 statistics; 8-bit first moment when big).

    `lazy` (plain tensors only): the entries are made on the meta device, shapes without memory. A bucket
    that takes the state fills its own buffers with the starting values (came_bucket._Bucket._bind), so
    the first step never holds the whole state twice (per tensor, then in the buckets: 3 GiB on a 5B
    model); materialize_ allocates them for the torch path."""
    sharding = Sharding(param)
    p = local(param)
    dev = torch.device("meta") if lazy and sharding.mesh is None else p.device
    gshape = sharding.global_shape
    fshape = factored_view_shape(gshape)
    # a device tensor, as in torch's capturable optimizers: a skipped step (found_inf) leaves it
    # unchanged without a host read, and the rounding noise is keyed on it on the device
    state["step"] = torch.zeros((), dtype=torch.float32, device=dev)
    state["RMS"] = torch.zeros((), dtype=torch.float32, device=dev)
    numel = math.prod(gshape)
    if fshape is not None:
        lshape = factored_view_shape(p.shape)
        row_sharded_col = len(fshape) > 2  # the col factor keeps dim 0 only for batched (3+ dim) views
        for kind in ("sq", "res"):
            state[f"exp_avg_{kind}_row"] = sharding.wrap(
                torch.zeros(lshape[:-1], dtype=torch.float32, device=dev), fshape[:-1], True)
            state[f"exp_avg_{kind}_col"] = sharding.wrap(
                torch.zeros(lshape[:-2] + lshape[-1:], dtype=torch.float32, device=dev),
                fshape[:-2] + fshape[-1:], row_sharded_col)
        state["clip_scale"] = torch.ones((), dtype=torch.float32, device=dev)
        if numel > min_8bit_size and quantized_layout_ok(sharding, numel, block_size):
            state["exp_avg_codes"] = sharding.wrap(
                torch.full(p.shape, qmap.ZERO_CODE, dtype=torch.uint8, device=dev), gshape, True)
            state["exp_avg_scales"] = sharding.wrap(
                torch.zeros(qmap.num_blocks(p.numel(), block_size), dtype=torch.float32, device=dev),
                (qmap.num_blocks(numel, block_size),), True)
            return
    else:
        state["exp_avg_sq"] = sharding.wrap(torch.zeros(p.shape, dtype=torch.float32, device=dev), gshape, True)
    state["exp_avg"] = sharding.wrap(torch.zeros(p.shape, dtype=torch.float32, device=dev), gshape, True)


def materialize_(state, device):
    """Allocate the entries a lazy init_state left on the meta device, at their starting values."""
    for key, value in state.items():
        if torch.is_tensor(value) and value.is_meta:
            state[key] = torch.full(value.shape, FRESH_VALUES.get(key, 0), dtype=value.dtype, device=device)


def commit_(dst, new, skip):
    """dst = new, or dst unchanged where the device flag `skip` is set (no host read)."""
    dst.copy_(new if skip is None else torch.where(skip, dst, new))


def ema(old, x, beta):
    return torch.mul(old, beta).add_(x, alpha=1 - beta)


def came_step_(param, grad, state, group, block_size, position=(0, 0), skip=None):
    """One CAME step for one parameter (plain tensor or DTensor), in place. `position` (group,
    index) keys the bf16 rounding noise; `skip` (a device bool, or None) turns the step into a
    no-op for parameter and state alike. Every state tensor is computed anew, then committed."""
    b1, b2, b3 = group["betas"]
    eps1, eps2 = group["eps"]
    lr, wd, clip = group["lr"], group["weight_decay"], group["clip_threshold"]
    sharding = Sharding(param)
    p, g = local(param), local(grad).float()
    numel = math.prod(sharding.global_shape)
    fshape = factored_view_shape(sharding.global_shape)
    key = rounding.seed_key(state["step"], *position) if p.dtype == torch.bfloat16 else None
    commit_(state["step"], state["step"] + 1, skip)
    p32 = p.float()
    rows_sharded = sharding.sharded and fshape is not None and len(fshape) == 2

    if fshape is None:
        psq = sharding.sum_(p32.square().sum().reshape(1))
        v = local(state["exp_avg_sq"])
        v_new = ema(v, g * g + eps1, b2)
        commit_(v, v_new, skip)
        update = v_new.rsqrt().mul_(g)
    else:
        g = g.reshape(factored_view_shape(p.shape))
        rows_global = fshape[-2]
        row, col = local(state["exp_avg_sq_row"]), local(state["exp_avg_sq_col"])
        sq = g * g + eps1
        row_new = ema(row, sq.mean(dim=-1), b2)
        # one all-reduce for the column sums, the row total and the parameter's square sum
        red = torch.cat([sq.sum(dim=-2).reshape(-1), row_new.sum(dim=-1).reshape(-1),
                         p32.square().sum().reshape(1)])
        if rows_sharded:
            sharding.sum_(red)
        else:
            red[-1:] = sharding.sum_(red[-1:].clone())
        ncol = col.numel()
        col_new = ema(col, red[:ncol].view(col.shape) / rows_global, b2)
        commit_(row, row_new, skip)
        commit_(col, col_new, skip)
        row_mean = red[ncol:-1].view(row.shape[:-1] + (1,)) / rows_global
        psq = red[-1:]
        r_factor = (row_new / row_mean).rsqrt_().unsqueeze(-1)
        c_factor = col_new.unsqueeze(-2).rsqrt()
        update = torch.mul(r_factor, c_factor).mul_(g)

    scale = sharding.sum_(update.square().sum().reshape(1)).div_(numel).sqrt_().div_(clip).clamp_(min=1.0)
    update.div_(scale)
    quantized = "exp_avg_codes" in state
    if quantized:
        codes, absmax = local(state["exp_avg_codes"]), local(state["exp_avg_scales"])
        exp_avg = qmap.dequantize_blockwise(codes, absmax, block_size).view(update.shape)
    else:
        exp_avg_state = local(state["exp_avg"])
        exp_avg = exp_avg_state.view(update.shape).clone()
    exp_avg.mul_(b1).add_(update, alpha=1 - b1)

    if fshape is None:
        update = exp_avg.clone()
    else:
        commit_(state["clip_scale"], scale.view(()), skip)
        res = (update - exp_avg).square_().add_(eps2)
        res_row, res_col = local(state["exp_avg_res_row"]), local(state["exp_avg_res_col"])
        res_row_new = ema(res_row, res.mean(dim=-1), b3)
        red = torch.cat([res.sum(dim=-2).reshape(-1), res_row_new.sum(dim=-1).reshape(-1)])
        if rows_sharded:
            sharding.sum_(red)
        ncol = res_col.numel()
        res_col_new = ema(res_col, red[:ncol].view(res_col.shape) / rows_global, b3)
        commit_(res_row, res_row_new, skip)
        commit_(res_col, res_col_new, skip)
        res_mean = red[ncol:].view(res_row.shape[:-1] + (1,)) / rows_global
        res_approx = torch.mul((res_row_new / res_mean).rsqrt_().unsqueeze(-1), res_col_new.unsqueeze(-2).rsqrt())
        update = res_approx.mul_(exp_avg)

    if quantized:
        new_codes, new_absmax = qmap.quantize_blockwise(exp_avg.reshape(p.shape), block_size)
        commit_(codes, new_codes, skip)
        commit_(absmax, new_absmax, skip)
    else:
        commit_(exp_avg_state, exp_avg.view(exp_avg_state.shape), skip)
    commit_(state["RMS"], psq.div(numel).sqrt_().view(()), skip)
    if wd != 0:
        p32 = p32.add(p32, alpha=-wd * lr)
    new_p = p32.add(update.reshape(p.shape), alpha=-lr)
    if skip is not None:
        new_p = torch.where(skip, p.float(), new_p)
    rounding.write_param_(p, new_p, key)
