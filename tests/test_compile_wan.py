"""Regional compile of diffusers' Wan blocks (engine/compile.py, with activation checkpointing applied first, as
parallelize does) gives the gradients of eager at a long sequence for the tiny Wan. The CUDA-only failure this
guards against (inductor's mix-order reduction) is checked on CUDA in tests/test_compile.py."""
import pytest
import torch
from torch._dynamo.utils import counters

pytest.importorskip("diffusers")

from giga_train.engine.activation_checkpointing import apply_activation_checkpointing  # noqa: E402
from giga_train.engine.compile import compile_model  # noqa: E402

# 2 heads of 16: the tiny Wan of the example with a sequence of 3 x 32 x 40 = 3,840 tokens
ARCH = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=16, ffn_dim=64, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=128)
LATENTS = (1, 4, 3, 64, 80)


def wan(seed=0):
    from diffusers import WanTransformer3DModel
    torch.manual_seed(seed)
    return WanTransformer3DModel(**ARCH)


def gradients(model):
    g = torch.Generator().manual_seed(1)
    latents, text = torch.randn(LATENTS, generator=g), torch.randn(1, 16, 32, generator=g)
    target = torch.randn(LATENTS, generator=g)
    out = model(hidden_states=latents, timestep=torch.tensor([500.0]), encoder_hidden_states=text,
                return_dict=False)[0]
    torch.nn.functional.mse_loss(out, target).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_compiled_checkpointed_wan_gradients_equal_eager_at_a_long_sequence():
    """fp32: each parameter's gradient within 1e-3 of eager's (||got - want|| / ||want||)."""
    eager = gradients(wan())
    model = wan()
    apply_activation_checkpointing(model, ["WanTransformerBlock"])
    try:
        torch._dynamo.reset()
        counters.clear()
        assert compile_model(model, dict(backend="inductor")) == ["blocks.0", "blocks.1"]
        compiled = gradients(model)
        assert counters["stats"]["unique_graphs"] > 0  # the blocks did compile
    finally:
        torch._dynamo.reset()
    for name, want in eager.items():
        assert torch.isfinite(compiled[name]).all(), name
        assert (compiled[name] - want).norm() <= 1e-3 * want.norm() + 1e-8, name
