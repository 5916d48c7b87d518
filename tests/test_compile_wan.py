"""Regional compile of diffusers' Wan blocks gives the gradients of eager at a long sequence, with attention
in the compiled graph and kept out of it (the default for diffusers' models), with activation checkpointing."""
import pytest
import torch
from torch._dynamo.utils import counters

pytest.importorskip("diffusers")

from giga_train.engine.activation_checkpointing import apply_activation_checkpointing  # noqa: E402
from giga_train.engine.compile import attention_in_graph, compile_model, put_attention_back_in_graph  # noqa: E402

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


def assert_same_gradients(got, want, rtol=1e-3):
    """Each parameter's gradient within rtol of eager's, measured as ||got - want|| / ||want|| (fp32)."""
    for name, g in want.items():
        assert torch.isfinite(got[name]).all(), name
        assert (got[name] - g).norm() <= rtol * g.norm() + 1e-8, (name, ((got[name] - g).norm() / g.norm()).item())


@pytest.mark.parametrize("compile_attention, checkpointing", [(True, False), (None, True)])
def test_compiled_wan_gradients_equal_eager_at_a_long_sequence(compile_attention, checkpointing):
    eager = gradients(wan())
    model = wan()
    if checkpointing:  # before compile, as parallelize does
        apply_activation_checkpointing(model, ["WanTransformerBlock"])
    config = dict(backend="inductor", compile_attention=compile_attention)
    try:
        torch._dynamo.reset()
        counters.clear()
        assert compile_model(model, config) == ["blocks.0", "blocks.1"]
        assert attention_in_graph(model, config) is bool(compile_attention)
        compiled = gradients(model)
        assert counters["stats"]["unique_graphs"] > 0  # the blocks did compile
        breaks = sum(counters["graph_break"].values())
        assert (breaks == 0) if compile_attention else (breaks > 0)  # attention out: a break at each SDPA
    finally:
        put_attention_back_in_graph()
        torch._dynamo.reset()
    assert_same_gradients(compiled, eager)
