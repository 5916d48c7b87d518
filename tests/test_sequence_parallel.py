"""Sequence-parallel attention (Ulysses and ring) on 2 and 4 gloo ranks equals one process's SDPA: the
output and the gradients of query, key and value, causal and not, GQA, a user mask, and sequence lengths
that do not divide the SP size. fp32 throughout; tolerance 1e-5 (the sums run in another order)."""
import pytest
import torch
import torch.nn.functional as F

from giga_train.engine import sequence_parallel as sp
from tests.sp_ranks import run_ranks, summed_grad

TOL = dict(rtol=1e-5, atol=1e-5)

# (batch, heads, kv heads, length, head dim, causal, mode, user mask)
CASES = {
    "plain": (2, 4, 4, 16, 8, False, "ulysses", False),
    "causal": (2, 4, 4, 16, 8, True, "ulysses", False),
    "gqa": (1, 4, 2, 12, 8, True, "ulysses", False),
    "gqa-repeat": (1, 4, 1, 12, 8, False, "ulysses", False),
    "odd-length": (1, 4, 4, 13, 8, False, "ulysses", False),
    "odd-length-causal": (1, 4, 4, 13, 8, True, "ulysses", False),
    "mask": (1, 4, 4, 11, 8, False, "ulysses", True),
    "mask-causal": (1, 4, 4, 11, 8, True, "ulysses", True),
    "ring": (2, 4, 4, 16, 8, False, "ring", False),
    "ring-causal": (2, 4, 4, 16, 8, True, "ring", False),
    "ring-odd-length": (1, 2, 2, 13, 8, False, "ring", False),
    "ring-odd-length-causal": (1, 2, 2, 13, 8, True, "ring", False),
    "ring-gqa-one-head": (1, 1, 1, 10, 8, True, "ring", False),
    "ring-mask": (1, 4, 2, 11, 8, True, "ring", True),
}


def _inputs(batch, heads, kv_heads, length, dim, masked):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, length, dim, generator=g)
    k = torch.randn(batch, kv_heads, length, dim, generator=g)
    v = torch.randn(batch, kv_heads, length, dim, generator=g)
    dout = torch.randn(batch, heads, length, dim, generator=g)
    mask = None
    if masked:  # a random boolean mask that keeps the diagonal (no row fully masked)
        mask = (torch.rand(batch, heads, length, length, generator=g) > 0.4) | torch.eye(length, dtype=torch.bool)
    return q, k, v, dout, mask


def _one_process(case):
    batch, heads, kv_heads, length, dim, causal, _, masked = CASES[case]
    q, k, v, dout, mask = _inputs(batch, heads, kv_heads, length, dim, masked)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    if causal and mask is not None:
        mask = mask & torch.ones(length, length, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                         enable_gqa=kv_heads != heads)
    (out * dout).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _sharded(cases):
    results = {}
    for case in cases:
        batch, heads, kv_heads, length, dim, causal, mode, masked = CASES[case]
        q, k, v, dout, mask = _inputs(batch, heads, kv_heads, length, dim, masked)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        if mask is not None:  # the whole padded sequence's mask
            total = sp.padded_length(length)
            mask = F.pad(mask, (0, total - length, 0, total - length), value=True)
        local = [sp.shard_sequence(t, 2) for t in leaves]
        out = sp.attention(*local, attn_mask=mask, is_causal=causal, enable_gqa=kv_heads != heads, mode=mode)
        out = sp.gather_sequence(out, 2)
        (out * dout).sum().backward()
        results[case] = out.detach(), [summed_grad(t) for t in leaves]
    return results


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sp")
    return {world: run_ranks(world, _sharded, list(CASES), tmp_path=tmp) for world in (2, 4)}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_sequence_parallel_attention_equals_one_process(sharded, case, world):
    out, grads = sharded[world][case]
    ref_out, ref_grads = _one_process(case)
    torch.testing.assert_close(out, ref_out, **TOL)
    for name, got, expected in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(got, expected, **TOL, msg=lambda m: f"grad {name}: {m}")


def test_without_a_group_everything_is_the_plain_op():
    q, k, v, _, _ = _inputs(1, 2, 2, 5, 4, False)
    assert sp.sequence_group() is None and sp.sequence_world_size() == 1
    assert torch.equal(sp.attention(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert sp.shard_sequence(q, 2) is q and sp.gather_sequence(q, 2) is q and sp.padded_length(5) == 5


def test_bad_mode_is_one_line():
    with pytest.raises(ValueError, match="mode 'zigzag'"):
        sp.set_sequence_group(None, mode="zigzag")
