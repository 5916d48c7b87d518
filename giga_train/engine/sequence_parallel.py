"""Sequence-parallel attention: a drop-in for `torch.nn.functional.scaled_dot_product_attention` whose
inputs are sharded along the sequence over the current sequence-parallel (SP) process group, Ulysses (one
all-to-all to a head shard and back) or ring (engine/ring_attention.py), and the functions that shard, pad
and gather the sequence (docs/parallelism.md, "Sequence parallel attention"). With no group, or a group of
one, every function here is the plain op with no collective."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

MODES = ("ulysses", "ring")

_group = None
_mode = "ulysses"
_length = None  # the unpadded length recorded by the last shard_sequence (for the key-padding mask)


# -- the current group -------------------------------------------------------------------------------
def set_sequence_group(group, mode="ulysses"):
    """Set the SP process group (None or a group of one: no sequence parallelism) and its attention mode."""
    global _group, _mode, _length
    if mode not in MODES:
        raise ValueError(f"sequence parallel mode {mode!r}: expected one of {', '.join(MODES)}")
    _group = group if group is not None and dist.get_world_size(group) > 1 else None
    _mode = mode
    _length = None


def sequence_group():
    """The current SP process group, or None when there is no sequence parallelism."""
    return _group


def sequence_mode():
    return _mode


def sequence_world_size():
    return 1 if _group is None else dist.get_world_size(_group)


def sequence_rank():
    return 0 if _group is None else dist.get_rank(_group)


class sequence_parallel:
    """`with sequence_parallel(group, mode):` sets the group for the block and restores the previous one."""

    def __init__(self, group, mode="ulysses"):
        self.group, self.mode = group, mode

    def __enter__(self):
        self.saved = (_group, _mode, _length)
        set_sequence_group(self.group, self.mode)
        return self

    def __exit__(self, *exc):
        global _group, _mode, _length
        _group, _mode, _length = self.saved


# -- sharding the sequence ---------------------------------------------------------------------------
def padded_length(n, world_size=None):
    """n rounded up to a multiple of the SP size."""
    world = sequence_world_size() if world_size is None else world_size
    return -(-n // world) * world


def set_sequence_length(n):
    """Record the unpadded length of the sequence being sharded (shard_sequence does it)."""
    global _length
    _length = n


def sequence_length():
    return _length


def shard_sequence(x, dim):
    """This rank's contiguous slice of `x` along `dim`, padding the sequence with zeros at the end to a
    multiple of the SP size; records the unpadded length for `attention`'s key-padding mask. The
    backward of the slice is a zero-padded gradient (the other ranks' positions get none from here)."""
    n = x.shape[dim]
    set_sequence_length(n)
    world = sequence_world_size()
    if world == 1:
        return x
    total = padded_length(n)
    if total != n:
        pad = [0, 0] * (x.dim() - 1 - (dim % x.dim())) + [0, total - n]
        x = F.pad(x, pad)
    local = total // world
    return x.narrow(dim, sequence_rank() * local, local)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.rank, ctx.local = dim, dist.get_rank(group), x.shape[dim]
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.rank * ctx.local, ctx.local), None, None


def gather_sequence(x, dim, length=None):
    """The whole sequence from every rank's slice along `dim`, the padding dropped (to `length`, else the
    length recorded by shard_sequence, else none dropped). Differentiable: the gradient is this rank's
    slice of the incoming gradient (no reduction: see the module docstring)."""
    if _group is None:
        return x if length is None else x.narrow(dim, 0, length)
    dim = dim % x.dim()
    full = _GatherSequence.apply(x, dim, _group)
    length = _length if length is None else length
    if length is not None and length < full.shape[dim]:
        full = full.narrow(dim, 0, length)
    return full


# -- the all-to-all ------------------------------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 in equal chunks: its own inverse, so the backward is the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def sequence_to_heads(*tensors, group=None):
    """[B, H, S/sp, D] sequence-sharded -> [B, H/sp, S, D] head-sharded (rank r gets heads r*H/sp...),
    for one tensor or several of one shape in a single all-to-all (returned as a tuple)."""
    group = group or _group
    world = dist.get_world_size(group)
    b, h, s, d = tensors[0].shape
    n = len(tensors)
    stacked = torch.stack(tensors) if n > 1 else tensors[0].unsqueeze(0)
    chunks = stacked.reshape(n, b, world, h // world, s, d).permute(2, 0, 1, 3, 4, 5)
    out = _AllToAll.apply(chunks, group)  # [sp (sequence chunk), n, B, H/sp, S/sp, D]
    out = out.permute(1, 2, 3, 0, 4, 5).reshape(n, b, h // world, world * s, d)
    return tuple(out.unbind(0)) if n > 1 else out[0]


def heads_to_sequence(x, group=None):
    """[B, H/sp, S, D] head-sharded -> [B, H, S/sp, D] sequence-sharded (the inverse of sequence_to_heads)."""
    group = group or _group
    world = dist.get_world_size(group)
    b, h, s, d = x.shape
    chunks = x.reshape(b, h, world, s // world, d).permute(2, 0, 1, 3, 4)
    out = _AllToAll.apply(chunks, group)  # [sp (head chunk), B, H/sp, S/sp, D]
    return out.permute(1, 0, 2, 3, 4).reshape(b, world * h, s // world, d)


# -- masks ---------------------------------------------------------------------------------------------
def _key_padding(total, length, device):
    """[1, 1, 1, total] True where the key is a real position (< length)."""
    return (torch.arange(total, device=device) < length).view(1, 1, 1, total)


def _merge_masks(attn_mask, keep, dtype):
    """A user mask (bool: True = attend, or additive float) combined with a boolean keep mask."""
    if attn_mask is None:
        return keep
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return attn_mask.masked_fill(~keep, float("-inf")).to(dtype)


def _heads_of_mask(attn_mask, heads, world, rank):
    """A mask over all heads, cut to this rank's heads after the all-to-all (a head dim of 1 broadcasts)."""
    if attn_mask is None or attn_mask.dim() < 3 or attn_mask.shape[-3] == 1:
        return attn_mask
    if attn_mask.shape[-3] != heads:
        raise ValueError(f"attn_mask has {attn_mask.shape[-3]} heads; expected 1 or {heads}")
    local = heads // world
    return attn_mask.narrow(-3, rank * local, local)


# -- attention -----------------------------------------------------------------------------------------
def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              *, length=None, mode=None):
    """scaled_dot_product_attention on sequence-sharded [B, H, S_local, D] inputs; returns this rank's
    [B, H, S_local, D] slice of the output. `attn_mask` (optional) is for the whole padded sequence,
    [..., S, S] with a head dim of 1 or H. `length`: the unpadded sequence length (default: the one
    recorded by shard_sequence); keys past it are masked. `mode`: "ulysses" or "ring" (default: the
    group's). Ulysses needs the query heads (and the key/value heads under GQA, else they are repeated
    to the query heads) divisible by the SP size; ring has no head constraint."""
    if _group is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    world, rank = sequence_world_size(), sequence_rank()
    total = query.shape[-2] * world
    length = _length if length is None else length
    if length is not None and padded_length(length, world) != total:
        length = None  # a sequence other than the one shard_sequence recorded: no padding to mask
    mode = mode or _mode
    if mode == "ring":
        from .ring_attention import ring_attention
        return ring_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa, length=length, group=_group)
    if mode != "ulysses":
        raise ValueError(f"sequence parallel mode {mode!r}: expected one of {', '.join(MODES)}")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % world:
        raise ValueError(f"Ulysses sequence parallel attention: {heads} query heads do not divide by the"
                         f" sequence parallel size {world} (use mode='ring')")
    if kv_heads != heads and kv_heads % world:
        # GQA with too few key/value heads to shard: repeat them to the query heads (memory for simplicity)
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    if key.shape == query.shape:
        q, k, v = sequence_to_heads(query, key, value)  # one all-to-all for the three
    else:
        q, (k, v) = sequence_to_heads(query), sequence_to_heads(key, value)
    attn_mask = _heads_of_mask(attn_mask, heads, world, rank)
    # Causal attention never sees the padding at the end from a real query: only non-causal needs the mask.
    if length is not None and length < total and not is_causal:
        attn_mask = _merge_masks(attn_mask, _key_padding(total, length, q.device), q.dtype)
    if is_causal and attn_mask is not None:
        causal = torch.ones(total, total, dtype=torch.bool, device=q.device).tril()
        attn_mask, is_causal = _merge_masks(attn_mask, causal, q.dtype), False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                         scale=scale, enable_gqa=enable_gqa and k.shape[1] != q.shape[1])
    return heads_to_sequence(out)

