"""train.dynamo_config: each repeated block compiled in place, one graph for all of them, names kept."""
import pytest
import torch
from torch._dynamo.utils import counters

from examples.llama.model import Llama, shape_of
from examples.char_lm.model import CharLM
from giga_train import launch_from_config
from giga_train.engine.compile import block_classes, check_dynamo_config, compile_model, with_inductor_workarounds
from giga_train.errors import ConfigError
from tests.distributed import assert_same_weights, final_weights, job, reference
from tests.tiny import MODEL, tiny_config


def compiled(model):
    return [name for name, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]


def test_blocks_are_found_from_the_config_hints_else_the_repeated_children():
    model = CharLM(**MODEL)
    assert block_classes(model, {}) == ["Block"]  # a ModuleList of Blocks
    assert block_classes(model, {}, ["LayerNorm__##__1"]) == ["LayerNorm"]  # activation checkpointing's
    assert block_classes(model, {}, ["LayerNorm"], dict(fsdp_transformer_layer_cls_to_wrap="Block, Nope")) == ["Block"]
    assert block_classes(model, dict(block_class_names=["Linear"]), ["Block"]) == ["Linear"]
    with pytest.raises(ConfigError, match="block_class_names: no module of class 'Blok'"):
        block_classes(model, dict(block_class_names=["Blok"]))
    assert block_classes(torch.nn.Sequential(torch.nn.Linear(2, 2)), {}) == []


def test_each_block_compiles_in_place_and_shares_one_graph():
    torch.manual_seed(0)
    model = Llama(shape_of("tiny", layers=3))
    reference = Llama(shape_of("tiny", layers=3))
    reference.load_state_dict(model.state_dict())
    keys = list(model.state_dict())
    assert compile_model(model, dict(backend="eager")) == ["layers.0", "layers.1", "layers.2"]
    assert compiled(model) == ["layers.0", "layers.1", "layers.2"] and list(model.state_dict()) == keys
    tokens = torch.randint(0, 256, (2, 33))
    counters.clear()
    for _ in range(3):
        loss = model(tokens)
        loss.backward()
    assert counters["stats"]["unique_graphs"] == 1, counters["stats"]  # not one per block, nor per step
    torch.testing.assert_close(loss, reference(tokens), rtol=1e-6, atol=1e-6)


def test_whole_model_when_regional_is_off_and_nothing_when_disabled():
    model = CharLM(**MODEL)
    assert compile_model(model, dict(backend="EAGER", use_regional_compilation=False)) == [""]
    assert compiled(model) == [""]
    assert compile_model(CharLM(**MODEL), dict(backend="eager", disable=True)) == []
    assert compile_model(CharLM(**MODEL), {}) == []


def test_unknown_keys_get_one_line():
    assert check_dynamo_config(dict(mdoe="max-autotune")).startswith("unknown key 'mdoe'; did you mean 'mode'?")
    assert "not both" in check_dynamo_config(dict(mode="max-autotune", options={"x": 1}))
    assert check_dynamo_config(dict(backend="inductor", fullgraph=True, block_class_names=["Block"])) is None
    with pytest.raises(ConfigError, match=r"^train.dynamo_config: unknown key 'backnd'; did you mean 'backend'\?"):
        launch_from_config(tiny_config("/nonexistent", dynamo_config=dict(backnd="eager")))


def test_the_trainer_compiles_checkpointed_blocks_and_trains_the_same(tmp_path):
    runs = []
    for dynamo in (None, dict(backend="eager", fullgraph=True)):
        config = tiny_config(tmp_path / str(bool(dynamo)), max_steps=3, activation_checkpointing=True,
                             activation_class_names=["Block"], dynamo_config=dynamo)
        config["models"]["dropout"] = 0.0
        trainer = launch_from_config(config)
        runs.append(trainer.losses)
    assert compiled(trainer.unwrapped_model) == ["blocks.0", "blocks.1"]
    assert runs[1] == pytest.approx(runs[0], rel=1e-5)


def test_fsdp2_shards_compiled_blocks_and_lands_on_the_one_process_weights(tmp_path, tmp_path_factory):
    """fully_shard on blocks compiled in place: FSDP2's all-gather and reduce-scatter hooks still run
    around each compiled block (AOTAutograd traces forward and backward), at 2 ranks."""
    launch = dict(fsdp_config=dict(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap="Block"))
    launch_from_config(job(tmp_path, "FSDP", ranks=2, launch=launch, dynamo_config=dict(backend="aot_eager")))
    assert "compiled 2 blocks of class Block" in (tmp_path / "logs" / "train.log").read_text()
    assert_same_weights(final_weights(tmp_path), reference(tmp_path_factory, {}))


def test_inductor_compiles_without_mix_order_reduction(monkeypatch):
    """Every block is compiled with inductor's mix-order reduction off (it corrupts the Wan modulation's
    gradients at 11k+ tokens on CUDA); a user's own options entry wins; other backends are left alone."""
    import torch._inductor.config as inductor_config
    if not hasattr(inductor_config.triton, "mix_order_reduction"):
        pytest.skip("this torch has no mix-order reduction")
    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: seen.append(kw))
    model = CharLM(**MODEL)
    assert len(compile_model(model, {"backend": "INDUCTOR"})) == len(seen) > 1
    assert all(kw["options"] == {"triton.mix_order_reduction": False} for kw in seen)
    seen.clear()
    compile_model(model, {"options": {"triton.mix_order_reduction": True, "max_autotune": False}})
    assert seen[0]["options"] == {"triton.mix_order_reduction": True, "max_autotune": False}
    seen.clear()
    compile_model(model, {"backend": "aot_eager"})
    assert "options" not in seen[0]
    seen.clear()
    saved = inductor_config.triton.mix_order_reduction  # set and restored by hand: a monkeypatch undo hides it
    try:
        inductor_config.triton.mix_order_reduction = True
        compile_model(model, {"mode": "max-autotune-no-cudagraphs"})
        assert "options" not in seen[0] and inductor_config.triton.mix_order_reduction is False
    finally:
        inductor_config.triton.mix_order_reduction = saved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor's mix-order reduction runs on CUDA")
def test_compiled_modulation_gradients_equal_eager_at_long_sequences():
    """The modulation pattern inductor's mix-order kernel got wrong (y = layer_norm(x) * (1 + scale) + shift,
    scale/shift broadcast over 11,440 tokens), compiled through compile_model, equals eager (bf16 input,
    fp32 reductions: 1e-3)."""
    class Modulation(torch.nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(1, 2, dim) / dim ** 0.5)

        def forward(self, x, temb):
            shift, scale = (self.table + temb).chunk(2, dim=1)
            return torch.nn.functional.layer_norm(x.float(), x.shape[-1:]) * (1 + scale) + shift

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 11440, 3072, device="cuda", generator=g).to(torch.bfloat16)
    temb, proj = torch.randn(1, 2, 3072, device="cuda", generator=g), torch.randn(1, 11440, 3072, device="cuda")
    eager, compiled = Modulation(3072).cuda(), Modulation(3072).cuda()
    compiled.load_state_dict(eager.state_dict())
    compiled.compile(**with_inductor_workarounds({}))
    for module in (eager, compiled):
        (module(x, temb) * proj).mean().backward()
    error = (compiled.table.grad - eager.table.grad).norm() / eager.table.grad.norm()
    assert error.item() < 1e-3
