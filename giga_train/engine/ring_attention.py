"""Ring attention over a sequence-parallel group: each rank keeps its query slice and passes key/value
blocks to the next rank (isend/irecv), accumulating the output with an online softmax (running
log-sum-exp). The backward passes the blocks around again with their key/value gradients, which arrive
back at their owner after a full turn. Blocks run as plain fp32 matmuls (no fused kernel), so a block's
[S_local, S_local] scores are materialised: the memory per rank is O(S_local^2) per head, not O(S^2).
Causal attention skips the blocks after the query's own (contiguous slices: later ranks do more work).
"""
import torch
import torch.distributed as dist


def _block_keep(rank, src, local, is_causal, length, mask, device):
    """Which (query of `rank`, key of `src`) pairs may attend, as a bool [..., local, local] (or None),
    and an additive float bias from a float user mask (or None)."""
    q_pos = rank * local + torch.arange(local, device=device)
    k_pos = src * local + torch.arange(local, device=device)
    keep = None
    if is_causal:
        keep = k_pos[None, :] <= q_pos[:, None]
    if length is not None:
        real = (k_pos < length)[None, :].expand(local, local)
        keep = real if keep is None else keep & real
    bias = None
    if mask is not None:
        block = mask.narrow(-2, rank * local, local).narrow(-1, src * local, local)
        if block.dtype == torch.bool:
            keep = block if keep is None else keep & block
        else:
            bias = block.float()
    return keep, bias


def _scores(q, k, scale, keep, bias):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _finite(x):
    return x.masked_fill(~x.isfinite(), 0.0)


class _Ring:
    """The exchange with the neighbours of this rank in the group (global ranks for p2p)."""

    def __init__(self, group):
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world)

    def shift(self, *tensors):
        """Send each tensor to the next rank and return the ones received from the previous rank."""
        return _PendingShift(self, *tensors).result()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale, length, group):
        ring = _Ring(group)
        local = q.shape[-2]
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        qf = q.float()
        kv = torch.stack([k, v])
        for step in range(ring.world):
            src = (ring.rank - step) % ring.world
            if step < ring.world - 1:  # post the next block before computing on this one
                pending = _PendingShift(ring, kv)
            if not (is_causal and src > ring.rank):
                keep, bias = _block_keep(ring.rank, src, local, is_causal, length, mask, q.device)
                s = _scores(qf, kv[0].float(), scale, keep, bias)
                block_lse = torch.logsumexp(s, dim=-1)
                p = torch.exp(s - _finite(block_lse)[..., None])
                block_out = torch.matmul(p, kv[1].float())
                new_lse = torch.logaddexp(lse, block_lse)
                safe = _finite(new_lse)
                out = out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None]
                lse = new_lse
            if step < ring.world - 1:
                kv = pending.result()[0]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.is_causal, ctx.scale, ctx.length, ctx.group = mask, is_causal, scale, length, group
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        local = q.shape[-2]
        qf, dout = q.float(), grad_out.float()
        delta = (dout * out).sum(dim=-1, keepdim=True)
        safe_lse = _finite(lse)[..., None]
        dq = torch.zeros_like(qf)
        kv = torch.stack([k, v])
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        for step in range(ring.world):
            src = (ring.rank - step) % ring.world
            if not (ctx.is_causal and src > ring.rank):
                keep, bias = _block_keep(ring.rank, src, local, ctx.is_causal, ctx.length, ctx.mask, q.device)
                kf, vf = kv[0].float(), kv[1].float()
                p = torch.exp(_scores(qf, kf, ctx.scale, keep, bias) - safe_lse)
                ds = p * (torch.matmul(dout, vf.transpose(-1, -2)) - delta)
                dq = dq + torch.matmul(ds, kf) * ctx.scale
                dkv = dkv + torch.stack([torch.matmul(ds.transpose(-1, -2), qf) * ctx.scale,
                                         torch.matmul(p.transpose(-1, -2), dout)])
            # the gradients travel with their block; after the last step one more hop takes them home
            if step < ring.world - 1:
                kv, dkv = ring.shift(kv, dkv)
            else:
                (dkv,) = ring.shift(dkv)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


class _PendingShift:
    """A shift posted now and waited on later, so the transfer overlaps the block's compute."""

    def __init__(self, ring, *tensors):
        tensors = [t.contiguous() for t in tensors]
        self.received = [torch.empty_like(t) for t in tensors]
        self.works = []
        for t, r in zip(tensors, self.received):
            self.works.append(dist.isend(t, ring.next, group=ring.group))
            self.works.append(dist.irecv(r, ring.prev, group=ring.group))

    def result(self):
        for w in self.works:
            w.wait()
        return self.received


def ring_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, length=None, group=None):
    """Attention of this rank's query slice [B, H, S_local, D] against the whole sequence held in slices
    by the group; `attn_mask` is for the whole padded sequence; keys at positions >= `length` are masked."""
    if dropout_p:
        raise ValueError("ring attention: dropout_p must be 0 (use mode='ulysses' for attention dropout)")
    if key.shape[1] != query.shape[1]:  # GQA: repeat the key/value heads (autograd sums their gradients)
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    if scale is None:
        scale = query.shape[-1] ** -0.5
    return _RingAttention.apply(query, key, value, attn_mask, is_causal, scale, length, group)
