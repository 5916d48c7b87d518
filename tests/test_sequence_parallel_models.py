"""Models under sequence parallelism on 2 gloo ranks equal one process: the tiny Wan transformer of
examples/wan (output and every parameter gradient; a token count that divides 2, one that does not, a
per-token timestep as Wan 2.2 TI2V passes, activation checkpointing, ring attention) and a tiny LlamaForCausalLM (logits, loss and every parameter
gradient; a length that does not divide 2, GQA). The SP ranks' gradients are summed (each holds its
slice's part). fp32; tolerance rtol 1e-4, atol 1e-6 (the attention and the reductions sum in another order)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from giga_train.engine import sequence_parallel as sp  # noqa: E402
from giga_train.engine.sequence_parallel_models import parallelize_for_sequence  # noqa: E402
from tests.sp_ranks import run_ranks  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-6)
WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
           text_dim=32, freq_dim=16, ffn_dim=48, num_layers=2, cross_attn_norm=True,
           qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
WAN_CASES = {  # latent [C, F, H, W] -> F * H/2 * W/2 tokens; per-token timestep or one per sample
    "48-tokens": ((4, 3, 8, 8), False),
    "27-tokens": ((4, 3, 6, 6), False),
    "token-timesteps": ((4, 3, 6, 6), True),
    "checkpointed": ((4, 3, 6, 6), False),  # with the engine's activation checkpointing of the blocks
    "ring": ((4, 3, 6, 6), False),  # ring attention instead of Ulysses
}
LLAMA_LENGTH = 11


def _wan(case):
    from diffusers import WanTransformer3DModel
    shape, per_token = WAN_CASES[case]
    torch.manual_seed(0)
    model = WanTransformer3DModel(**WAN)
    if case == "checkpointed":
        from giga_train.engine.activation_checkpointing import apply_activation_checkpointing
        assert apply_activation_checkpointing(model, ["WanTransformerBlock"]) == 2
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(2, *shape, generator=g)
    tokens = shape[1] * (shape[2] // 2) * (shape[3] // 2)
    timestep = torch.rand(2, tokens, generator=g) * 1000 if per_token else torch.tensor([250.0, 750.0])
    text = torch.randn(2, 16, 32, generator=g)
    return model, dict(hidden_states=latents, timestep=timestep, encoder_hidden_states=text, return_dict=False)


def _wan_step(model, inputs):
    out = model(**inputs)[0]
    out.square().mean().backward()
    return out.detach(), {name: p.grad for name, p in model.named_parameters()}


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attention_dropout=0.0)
    model = LlamaForCausalLM(config).float()
    ids = torch.randint(0, 64, (2, LLAMA_LENGTH), generator=torch.Generator().manual_seed(1))
    return model, ids


def _causal_lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _sum_over_ranks(grads):
    for g in grads.values():
        dist.all_reduce(g)
    return grads


def _sharded():
    from giga_train.engine.sequence_parallel_transformers import sequence_position_ids
    results = {}
    for case in WAN_CASES:
        model, inputs = _wan(case)
        parallelize_for_sequence(model)
        with sp.sequence_parallel(sp.sequence_group(), mode="ring" if case == "ring" else "ulysses"):
            out, grads = _wan_step(model, inputs)
        results[case] = out, _sum_over_ranks(grads)
    model, ids = _llama()
    parallelize_for_sequence(model)
    logits = model(input_ids=sp.shard_sequence(ids, 1), position_ids=sequence_position_ids(LLAMA_LENGTH)).logits
    logits = sp.gather_sequence(logits, 1)
    loss = _causal_lm_loss(logits, ids)
    loss.backward()
    results["llama"] = logits.detach(), loss.detach(), _sum_over_ranks({n: p.grad for n, p in model.named_parameters()})
    return results


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return run_ranks(2, _sharded, tmp_path=tmp_path_factory.mktemp("sp_models"))


def _assert_grads(got, expected):
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case", list(WAN_CASES))
def test_wan_under_sp2_equals_one_process(sharded, case):
    ref_out, ref_grads = _wan_step(*_wan(case))
    out, grads = sharded[case]
    torch.testing.assert_close(out, ref_out, **TOL)
    _assert_grads(grads, ref_grads)


def test_llama_under_sp2_equals_one_process(sharded):
    model, ids = _llama()
    logits = model(input_ids=ids).logits
    loss = _causal_lm_loss(logits, ids)
    loss.backward()
    got_logits, got_loss, got_grads = sharded["llama"]
    torch.testing.assert_close(got_logits, logits.detach(), **TOL)
    torch.testing.assert_close(got_loss, loss.detach(), **TOL)
    _assert_grads(got_grads, {n: p.grad for n, p in model.named_parameters()})


def test_without_a_group_the_parallelized_models_are_unchanged():
    model, inputs = _wan("27-tokens")
    ref = model(**inputs)[0]
    parallelize_for_sequence(model)
    assert torch.equal(model(**inputs)[0], ref)
    llama, ids = _llama()
    ref = llama(input_ids=ids).logits
    parallelize_for_sequence(llama)
    torch.testing.assert_close(llama(input_ids=ids).logits, ref, rtol=0, atol=1e-6)
